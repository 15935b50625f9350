package devices

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestNVMLResetter(t *testing.T) {
	drain := func(u string) string { return "drain " + u + "=1" }
	undrain := func(u string) string { return "drain " + u + "=0" }
	query := func(u string) string { return "query " + u }
	removeV2 := func(u string) string { return "remove_v2 " + u + " detach=1 link=0" }

	tests := []struct {
		name      string
		arch      arch
		sel       []int
		mod       map[int]func(*gpuState)
		noV2      bool
		wantCalls func(f *fleet) []string
		wantErr   []error
		wantMsg   []string // "{n}" is GPU n's UUID
	}{
		{
			name: "happy path one GPU", arch: archH100, sel: []int{3},
			wantCalls: func(f *fleet) []string {
				u := f.uuid(3)
				return []string{drain(u), query(u), removeV2(u), "discover", query(u)}
			},
		},
		{
			name: "happy path A100 set, one rediscovery", arch: archA100, sel: []int{0, 1},
			wantCalls: func(f *fleet) []string {
				a, b := f.uuid(0), f.uuid(1)
				return []string{drain(a), query(a), removeV2(a), drain(b), query(b), removeV2(b), "discover", query(a), query(b)}
			},
		},
		{
			name: "driver without RemoveGpu_v2", arch: archH100, sel: []int{0}, noV2: true,
			wantCalls: func(f *fleet) []string {
				u := f.uuid(0)
				return []string{drain(u), query(u), "remove " + u, "discover", query(u)}
			},
		},
		{
			name: "remove fails in use", arch: archH100, sel: []int{5},
			mod: map[int]func(*gpuState){5: func(g *gpuState) { g.removeRet = nvml.ERROR_IN_USE }},
			wantCalls: func(f *fleet) []string {
				u := f.uuid(5)
				return []string{drain(u), query(u), removeV2(u), undrain(u)}
			},
			wantErr: []error{ErrInUse, nvml.ERROR_IN_USE},
			wantMsg: []string{"devices: {5}: DeviceRemoveGpu_v2: ERROR_IN_USE"},
		},
		{
			name: "second remove fails, first GPU is rediscovered", arch: archA100, sel: []int{0, 1},
			mod: map[int]func(*gpuState){1: func(g *gpuState) { g.removeRet = nvml.ERROR_IN_USE }},
			wantCalls: func(f *fleet) []string {
				a, b := f.uuid(0), f.uuid(1)
				return []string{drain(a), query(a), removeV2(a), drain(b), query(b), removeV2(b), undrain(b), "discover"}
			},
			wantErr: []error{ErrInUse},
			wantMsg: []string{"{1}: DeviceRemoveGpu_v2: ERROR_IN_USE"},
		},
		{
			name: "persistence on is refused before any call", arch: archH100, sel: []int{2},
			mod:       map[int]func(*gpuState){2: func(g *gpuState) { g.persistence = nvml.FEATURE_ENABLED }},
			wantCalls: func(*fleet) []string { return nil },
			wantErr:   []error{ErrPreconditions},
			wantMsg:   []string{"{2}: persistence mode is on"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			for i, mod := range tc.mod {
				f.set(i, mod)
			}
			if tc.noV2 {
				f.srv.LookupSymbolFunc = func(s string) error {
					if s == symRemoveGpuV2 {
						return errors.New("missing")
					}
					return nil
				}
				f.srv.DeviceRemoveGpu_v2Func = nil // panics if called
			}
			m, _ := newTestManager(t, f)
			err := m.NVMLResetter().Reset(t.Context(), f.uuids(tc.sel...))
			if got, want := f.recorded(), tc.wantCalls(f); !slices.Equal(got, want) {
				t.Errorf("calls:\n got %q\nwant %q", got, want)
			}
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Reset: %v", err)
				}
				for _, i := range tc.sel {
					f.mu.Lock()
					drained := f.gpus[i].drained
					f.mu.Unlock()
					if drained {
						t.Errorf("GPU %d left draining", i)
					}
					if _, err := m.ResolveByUUID(f.uuid(i)); err != nil {
						t.Errorf("ResolveByUUID after reset: %v", err)
					}
				}
				return
			}
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want %v", err, want)
				}
			}
			for _, want := range tc.wantMsg {
				for n := range 8 {
					want = strings.ReplaceAll(want, fmt.Sprintf("{%d}", n), f.uuid(n))
				}
				containsAll(t, "error", err.Error(), want)
			}
		})
	}
}

func TestNVMLResetterCanceledContext(t *testing.T) {
	f := newFleet(t, archH100)
	m, _ := newTestManager(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := m.NVMLResetter().Reset(ctx, f.uuids(0))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if got := f.recorded(); len(got) != 0 {
		t.Errorf("calls = %q, want none", got)
	}
}

// recordingRunner is a CommandRunner fake.
type recordingRunner struct {
	argv   [][]string
	stdout string
	stderr string
	err    error
}

func (r *recordingRunner) run(_ context.Context, name string, args ...string) ([]byte, []byte, error) {
	r.argv = append(r.argv, append([]string{name}, args...))
	return []byte(r.stdout), []byte(r.stderr), r.err
}

func TestSMIResetter(t *testing.T) {
	tests := []struct {
		name    string
		runner  recordingRunner
		uuids   []string
		wantErr []string
	}{
		{name: "argv for a set", uuids: []string{"GPU-a", "GPU-b"}, runner: recordingRunner{stdout: "GPU 00000000:07:00.0 was successfully reset."}},
		{
			name: "error carries stderr", uuids: []string{"GPU-a"},
			runner: recordingRunner{
				err:    errors.New("exit status 255"),
				stderr: "The following GPUs could not be reset:\n  GPU 00000000:07:00.0: In use by another client",
			},
			wantErr: []string{"devices: /usr/bin/nvidia-smi --gpu-reset -i GPU-a: exit status 255", "In use by another client"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &SMIResetter{Path: "/usr/bin/nvidia-smi", Run: tc.runner.run, Log: testLogger(t)}
			err := r.Reset(t.Context(), tc.uuids)
			wantArgv := []string{"/usr/bin/nvidia-smi", "--gpu-reset", "-i", strings.Join(tc.uuids, ",")}
			if len(tc.runner.argv) != 1 || !slices.Equal(tc.runner.argv[0], wantArgv) {
				t.Errorf("argv = %q, want %q", tc.runner.argv, wantArgv)
			}
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Reset: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Reset: want error")
			}
			containsAll(t, "error", err.Error(), tc.wantErr...)
		})
	}
}

func TestNewResetter(t *testing.T) {
	found := func(string) (string, error) { return "/opt/bin/nvidia-smi", nil }
	missing := func(f string) (string, error) { return "", &exec.Error{Name: f, Err: exec.ErrNotFound} }
	tests := []struct {
		name     string
		cfg      ResetterConfig
		wantType string
		wantDesc string
		wantErr  string
	}{
		{name: "auto with nvidia-smi on PATH", cfg: ResetterConfig{LookPath: found}, wantType: "*devices.SMIResetter", wantDesc: "run /opt/bin/nvidia-smi --gpu-reset -i"},
		// Never a silent fallback to PCI remove/rediscover.
		{name: "auto without nvidia-smi", cfg: ResetterConfig{Method: ResetMethodAuto, LookPath: missing}, wantErr: "choose gpu.resetMethod=nvml"},
		{name: "auto with a driver root", cfg: ResetterConfig{SMIPath: "/run/nvidia/driver/usr/bin/nvidia-smi", LookPath: func(f string) (string, error) { return f, nil }}, wantType: "*devices.SMIResetter", wantDesc: "run /run/nvidia/driver/usr/bin/nvidia-smi --gpu-reset"},
		{name: "explicit nvml", cfg: ResetterConfig{Method: ResetMethodNVML, LookPath: found}, wantType: "*devices.NVMLResetter", wantDesc: "[0000:00:00.0]"},
		{name: "explicit nvidia-smi", cfg: ResetterConfig{Method: ResetMethodSMI, LookPath: missing}, wantType: "*devices.SMIResetter", wantDesc: "run nvidia-smi --gpu-reset"},
		{name: "dry run", cfg: ResetterConfig{Method: ResetMethodNVML, DryRun: true}, wantType: "*devices.dryRunResetter", wantDesc: "DeviceDiscoverGpus"},
		{name: "bad method", cfg: ResetterConfig{Method: "reboot"}, wantErr: "want nvidia-smi, nvml or auto"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, archH100)
			m, _ := newTestManager(t, f)
			r, err := m.NewResetter(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprintf("%T", r); got != tc.wantType {
				t.Errorf("type = %s, want %s", got, tc.wantType)
			}
			containsAll(t, "Describe", Describe(r, f.uuids(0)), tc.wantDesc)
			if tc.cfg.DryRun {
				if err := r.Reset(t.Context(), f.uuids(0)); err != nil {
					t.Fatal(err)
				}
				if got := f.recorded(); len(got) != 0 {
					t.Errorf("dry run made calls %q", got)
				}
			}
		})
	}
}

type plainResetter struct{ calls [][]string }

func (p *plainResetter) Reset(_ context.Context, uuids []string) error {
	p.calls = append(p.calls, uuids)
	return nil
}

func TestDryRunWithPlainResetter(t *testing.T) {
	f := newFleet(t, archH100)
	m, _ := newTestManager(t, f)
	p := &plainResetter{}
	if got := Describe(p, []string{"GPU-a", "GPU-b"}); got != "*devices.plainResetter.Reset(GPU-a,GPU-b)" {
		t.Errorf("Describe = %q", got)
	}
	rep, err := m.ResetAndVerify(t.Context(), p, f.uuids(0), ResetOptions{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.calls) != 0 || len(f.recorded()) != 0 || len(rep.PersistenceOff) != 0 {
		t.Errorf("dry run acted: resetter %v, nvml %q", p.calls, f.recorded())
	}
	if _, err := m.ResetAndVerify(t.Context(), p, f.uuids(0), ResetOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(p.calls) != 1 || !slices.Equal(p.calls[0], f.uuids(0)) {
		t.Errorf("resetter calls = %v", p.calls)
	}
}

func TestParseResetMethod(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    ResetMethod
		wantErr bool
	}{
		{name: "empty is auto", in: "", want: ResetMethodAuto},
		{name: "auto", in: "auto", want: ResetMethodAuto},
		{name: "nvidia-smi", in: "nvidia-smi", want: ResetMethodSMI},
		{name: "nvml", in: " nvml ", want: ResetMethodNVML},
		{name: "bad", in: "smi", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseResetMethod(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseResetMethod(%q) = %q, %v", tc.in, got, err)
			}
		})
	}
}

func TestExecRunner(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	tests := []struct {
		name       string
		timeout    time.Duration
		script     string
		wantOut    string
		wantErrOut string
		wantErr    []string
	}{
		{name: "success", timeout: testTimeout, script: "echo out; echo err >&2", wantOut: "out\n", wantErrOut: "err\n"},
		{name: "exit status", timeout: testTimeout, script: "echo boom >&2; exit 3", wantErrOut: "boom\n", wantErr: []string{"exit status 3"}},
		{name: "timeout", timeout: 50 * time.Millisecond, script: "exec sleep 10", wantErr: []string{"context deadline exceeded"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := ExecRunner(tc.timeout)(t.Context(), "sh", "-c", tc.script)
			if string(out) != tc.wantOut || string(errOut) != tc.wantErrOut {
				t.Errorf("stdout %q stderr %q", out, errOut)
			}
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("want error")
			}
			containsAll(t, "error", err.Error(), tc.wantErr...)
		})
	}
}

func TestResetAndVerify(t *testing.T) {
	tests := []struct {
		name      string
		arch      arch
		sel       []int
		mod       map[int]func(*gpuState)
		dryRun    bool
		xid       bool
		wantCalls func(f *fleet) []string
		wantErr   error
		wantMsg   string
		wantOff   []int
	}{
		{
			name: "persistence saved and restored around an NVML reset", arch: archH100, sel: []int{1},
			mod: map[int]func(*gpuState){1: func(g *gpuState) { g.persistence = nvml.FEATURE_ENABLED }},
			xid: true,
			wantCalls: func(f *fleet) []string {
				u := f.uuid(1)
				return []string{"persistence " + u + "=0", "drain " + u + "=1", "query " + u,
					"remove_v2 " + u + " detach=1 link=0", "discover", "query " + u, "persistence " + u + "=1"}
			},
			wantOff: []int{1},
		},
		{
			name: "persistence restored after a failed reset", arch: archH100, sel: []int{1},
			mod: map[int]func(*gpuState){1: func(g *gpuState) {
				g.persistence = nvml.FEATURE_ENABLED
				g.removeRet = nvml.ERROR_IN_USE
			}},
			wantCalls: func(f *fleet) []string {
				u := f.uuid(1)
				return []string{"persistence " + u + "=0", "drain " + u + "=1", "query " + u,
					"remove_v2 " + u + " detach=1 link=0", "drain " + u + "=0", "persistence " + u + "=1"}
			},
			wantErr: ErrInUse,
			wantOff: []int{1},
		},
		{
			name: "processes running refuse before any change", arch: archH100, sel: []int{0, 2},
			mod: map[int]func(*gpuState){
				0: func(g *gpuState) { g.persistence = nvml.FEATURE_ENABLED },
				2: func(g *gpuState) { g.compute = []uint32{31337} },
			},
			wantCalls: func(*fleet) []string { return nil },
			wantErr:   ErrPreconditions,
			wantMsg:   "(index 2): processes running (compute PIDs 31337)",
		},
		{
			name: "dry run changes nothing", arch: archA100, sel: []int{0, 1, 2, 3, 4, 5, 6, 7}, dryRun: true,
			mod:       map[int]func(*gpuState){3: func(g *gpuState) { g.persistence = nvml.FEATURE_ENABLED }},
			wantCalls: func(*fleet) []string { return nil },
		},
		{
			name: "unhealthy after reset", arch: archH100, sel: []int{4},
			mod:       map[int]func(*gpuState){4: func(g *gpuState) { g.remapFailure = true }},
			wantCalls: nil,
			wantErr:   ErrUnhealthy,
			wantMsg:   "(index 4): RemappedRowsFailure",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			for i, mod := range tc.mod {
				f.set(i, mod)
			}
			m, clk := newTestManager(t, f)
			var before []nvml.EnableState
			for _, g := range f.gpus {
				before = append(before, g.persistence)
			}
			sel := f.uuids(tc.sel...)
			if tc.xid {
				m.latchXID(sel[0], 79)
			}
			var rep ResetReport
			err := stepUntil(t, clk, time.Second, func() error {
				var err error
				rep, err = m.ResetAndVerify(t.Context(), m.NVMLResetter(), sel, ResetOptions{DryRun: tc.dryRun})
				return err
			})
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("ResetAndVerify = %v, want %v", err, tc.wantErr)
			}
			if tc.wantMsg != "" {
				containsAll(t, "error", err.Error(), tc.wantMsg)
			}
			if tc.wantCalls != nil {
				if got, want := f.recorded(), tc.wantCalls(f); !slices.Equal(got, want) {
					t.Errorf("calls:\n got %q\nwant %q", got, want)
				}
			}
			if !slices.Equal(rep.PersistenceOff, f.uuids(tc.wantOff...)) || !slices.Equal(rep.PersistenceRestored, f.uuids(tc.wantOff...)) {
				t.Errorf("persistence off/restored = %v/%v, want %v", rep.PersistenceOff, rep.PersistenceRestored, tc.wantOff)
			}
			for i := range f.gpus {
				f.mu.Lock()
				p := f.gpus[i].persistence
				f.mu.Unlock()
				if p != before[i] {
					t.Errorf("GPU %d persistence after = %d, want %d as before", i, p, before[i])
				}
			}
			if tc.xid && tc.wantErr == nil {
				if got := m.latchedXIDs(sel[0]); got != nil {
					t.Errorf("latched XIDs after reset = %v, want cleared", got)
				}
			}
		})
	}
}
