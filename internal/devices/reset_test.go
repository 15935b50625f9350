package devices

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestPreconditions(t *testing.T) {
	tests := []struct {
		name         string
		arch         arch
		sel          []int
		mod          map[int]func(*gpuState)
		wantNVSwitch bool
		wantWhole    bool
		wantBlockers []string // substrings, in order; "{n}" is GPU n's UUID
		check        func(t *testing.T, r PreconditionReport)
	}{
		{name: "H100 idle GPU", arch: archH100, sel: []int{3}, wantNVSwitch: true},
		{
			name: "A100 whole set given twice", arch: archA100, sel: []int{0, 1, 2, 3, 4, 5, 6, 7, 0},
			wantNVSwitch: true, wantWhole: true,
			check: func(t *testing.T, r PreconditionReport) {
				if len(r.GPUs) != 8 {
					t.Errorf("report has %d GPUs, want 8 (deduplicated)", len(r.GPUs))
				}
			},
		},
		{
			name: "processes running", arch: archH100, sel: []int{0, 1},
			mod:          map[int]func(*gpuState){1: func(g *gpuState) { g.compute = []uint32{4242, 777}; g.graphics = []uint32{31} }},
			wantNVSwitch: true,
			wantBlockers: []string{"{1} (index 1): processes running (compute PIDs 777, 4242; graphics PIDs 31)"},
		},
		{
			name: "process list unreadable fails closed", arch: archH100, sel: []int{2},
			mod:          map[int]func(*gpuState){2: func(g *gpuState) { g.procRet = nvml.ERROR_UNKNOWN }},
			wantNVSwitch: true,
			wantBlockers: []string{"{2} (index 2): process list unavailable (GetComputeRunningProcesses: ERROR_UNKNOWN; GetGraphicsRunningProcesses: ERROR_UNKNOWN)"},
		},
		{
			// The state the reset is for: refusing would keep the GPU
			// unusable. A note; the reset step's holder scan decides.
			name: "process list answering RESET_REQUIRED is a note, not a blocker", arch: archH100, sel: []int{2},
			mod:          map[int]func(*gpuState){2: func(g *gpuState) { g.procRet = nvml.ERROR_RESET_REQUIRED }},
			wantNVSwitch: true,
			check: func(t *testing.T, r PreconditionReport) {
				if g := r.GPUs[0]; g.ProcessesKnown || !g.ProcessesResetRequired {
					t.Errorf("ProcessesKnown/ProcessesResetRequired = %v/%v, want false/true", g.ProcessesKnown, g.ProcessesResetRequired)
				}
				if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "(index 2): process list unreadable: the GPU requires a reset (ERROR_RESET_REQUIRED)") {
					t.Errorf("notes = %q, want one naming GPU 2 and ERROR_RESET_REQUIRED", r.Notes)
				}
			},
		},
		{
			// The compute list read, the graphics list not: the PIDs
			// known are named, and the unread list is the note it is.
			name: "compute PIDs beside a graphics list answering RESET_REQUIRED", arch: archH100, sel: []int{2},
			mod: map[int]func(*gpuState){2: func(g *gpuState) {
				g.compute = []uint32{4242}
				g.graphicsRet = nvml.ERROR_RESET_REQUIRED
			}},
			wantNVSwitch: true,
			wantBlockers: []string{"{2} (index 2): processes running (compute PIDs 4242)"},
			check: func(t *testing.T, r PreconditionReport) {
				if len(r.Notes) != 1 {
					t.Errorf("notes = %q, want the unread graphics list's", r.Notes)
				}
			},
		},
		{
			name: "compute PIDs beside a graphics list that fails otherwise", arch: archH100, sel: []int{2},
			mod: map[int]func(*gpuState){2: func(g *gpuState) {
				g.compute = []uint32{4242}
				g.graphicsRet = nvml.ERROR_UNKNOWN
			}},
			wantNVSwitch: true,
			wantBlockers: []string{"{2} (index 2): processes running (compute PIDs 4242)",
				"{2} (index 2): process list unavailable (GetGraphicsRunningProcesses: ERROR_UNKNOWN)"},
		},
		{
			name: "a lost GPU is blocked once", arch: archH100, sel: []int{2},
			mod:          map[int]func(*gpuState){2: func(g *gpuState) { g.procRet = nvml.ERROR_GPU_IS_LOST }},
			wantNVSwitch: true,
			wantBlockers: []string{"{2} (index 2): GPU is lost (ERROR_GPU_IS_LOST)"},
		},
		{
			name: "MIG on is reported and blocks", arch: archH100, sel: []int{4},
			mod:          map[int]func(*gpuState){4: func(g *gpuState) { g.migCurrent = nvml.DEVICE_MIG_ENABLE }},
			wantNVSwitch: true,
			wantBlockers: []string{"{4} (index 4): MIG enabled"},
			check: func(t *testing.T, r PreconditionReport) {
				if r.GPUs[0].MIGCurrent != TriTrue {
					t.Errorf("MIGCurrent = %v, want true", r.GPUs[0].MIGCurrent)
				}
			},
		},
		{
			name: "persistence on is reported, not a blocker", arch: archH100, sel: []int{5},
			mod:          map[int]func(*gpuState){5: func(g *gpuState) { g.persistence = nvml.FEATURE_ENABLED }},
			wantNVSwitch: true,
			check: func(t *testing.T, r PreconditionReport) {
				if r.GPUs[0].Persistence != TriTrue {
					t.Errorf("Persistence = %v, want true", r.GPUs[0].Persistence)
				}
			},
		},
		{
			name: "A100 NVSwitch partial selection", arch: archA100, sel: []int{0},
			wantNVSwitch: true, wantWhole: true,
			wantBlockers: []string{"selection has 1 of 8 GPUs but pre-Hopper NVSwitch system (Ampere)"},
		},
		{name: "A100 NVSwitch whole set", arch: archA100, sel: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantNVSwitch: true, wantWhole: true},
		{
			name: "A100 PCIe without NVLink", arch: archA100, sel: []int{1},
			mod: map[int]func(*gpuState){-1: func(g *gpuState) { g.links = 0 }},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			for i, mod := range tc.mod {
				if i < 0 {
					f.each(mod)
					continue
				}
				f.set(i, mod)
			}
			m, _ := newTestManager(t, f)
			r, err := m.Preconditions(f.uuids(tc.sel...))
			if err != nil {
				t.Fatalf("Preconditions: %v", err)
			}
			if r.NVSwitch != tc.wantNVSwitch || r.WholeSet != tc.wantWhole {
				t.Errorf("NVSwitch/WholeSet = %v/%v, want %v/%v", r.NVSwitch, r.WholeSet, tc.wantNVSwitch, tc.wantWhole)
			}
			if len(r.GPUs) != len(uniq(f.uuids(tc.sel...))) {
				t.Fatalf("report has %d GPUs, want %d", len(r.GPUs), len(tc.sel))
			}
			if len(r.Blockers) != len(tc.wantBlockers) {
				t.Fatalf("blockers = %q, want %d", r.Blockers, len(tc.wantBlockers))
			}
			for i, want := range tc.wantBlockers {
				for n := range 8 {
					want = strings.ReplaceAll(want, fmt.Sprintf("{%d}", n), f.uuid(n))
				}
				containsAll(t, "blocker", r.Blockers[i], want)
			}
			err = r.Err()
			if (err != nil) != (len(tc.wantBlockers) > 0) {
				t.Errorf("Err() = %v", err)
			}
			if err != nil && !errors.Is(err, ErrPreconditions) {
				t.Errorf("Err() = %v, want ErrPreconditions", err)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func TestPreconditionsUnknownGPU(t *testing.T) {
	f := newFleet(t, archH100)
	m, _ := newTestManager(t, f)
	if _, err := m.Preconditions([]string{"GPU-nope"}); !errors.Is(err, ErrUnknownGPU) {
		t.Errorf("err = %v, want ErrUnknownGPU", err)
	}
}

func TestResetGroup(t *testing.T) {
	tests := []struct {
		name         string
		arch         arch
		mod          func(*gpuState)
		modGPU       map[int]func(*gpuState)
		sel          []int
		want         []int
		wantExpanded bool
		wantReason   string
	}{
		{name: "H100 NVSwitch with a lost GPU does not expand", arch: archH100,
			modGPU: map[int]func(*gpuState){7: func(g *gpuState) { g.lostUUID = true }}, sel: []int{1}, want: []int{1}},
		{name: "duplicates collapse", arch: archH100, sel: []int{4, 4}, want: []int{4}},
		{name: "A100 NVSwitch expands to the whole set", arch: archA100, sel: []int{6, 2}, want: []int{0, 1, 2, 3, 4, 5, 6, 7},
			wantExpanded: true, wantReason: "pre-Hopper NVSwitch system (Ampere)"},
		{name: "H100 NVSwitch resets individually", arch: archH100, sel: []int{6, 2}, want: []int{2, 6}},
		{name: "A100 without NVLink resets individually", arch: archA100, mod: func(g *gpuState) { g.links = 0 }, sel: []int{3}, want: []int{3}},
		{name: "A100 NVLink bridges (no switch) reset individually", arch: archA100,
			mod: func(g *gpuState) { g.linkType = nvml.NVLINK_DEVICE_TYPE_GPU; g.links = 4 }, sel: []int{3}, want: []int{3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			if tc.mod != nil {
				f.each(tc.mod)
			}
			for i, mod := range tc.modGPU {
				f.set(i, mod)
			}
			m, _ := newTestManager(t, f)
			g, err := m.ResetGroup(f.uuids(tc.sel...))
			if err != nil {
				t.Fatalf("ResetGroup: %v", err)
			}
			if !slices.Equal(g.UUIDs, f.uuids(tc.want...)) || g.Expanded != tc.wantExpanded {
				t.Errorf("group = %+v, want %v expanded=%v", g, tc.want, tc.wantExpanded)
			}
			if !strings.Contains(g.Reason, tc.wantReason) {
				t.Errorf("reason = %q, want %q", g.Reason, tc.wantReason)
			}
		})
	}
}

func TestResolveByUUIDAfterReenumeration(t *testing.T) {
	f := newFleet(t, archH100)
	m, _ := newTestManager(t, f)
	u := f.uuid(2)
	// The rediscovered GPU comes back at another index and bus.
	f.dev(2).Index, f.dev(2).PciBusID = 5, "0000:45:00.0"
	g, err := m.ResolveByUUID(u)
	if err != nil {
		t.Fatalf("ResolveByUUID: %v", err)
	}
	if g.UUID != u || g.Index != 5 || g.PCIBusID != "0000:45:00.0" || g.Architecture != "Hopper" {
		t.Errorf("resolved = %+v", g)
	}
	if _, err := m.ResolveByUUID("GPU-gone"); !errors.Is(err, ErrUnknownGPU) {
		t.Errorf("unknown UUID err = %v", err)
	}
}

func TestSetPersistenceMode(t *testing.T) {
	f := newFleet(t, archA100)
	m, _ := newTestManager(t, f)
	if err := m.SetPersistenceMode(f.uuid(1), true); err != nil {
		t.Fatal(err)
	}
	if err := m.SetPersistenceMode(f.uuid(1), false); err != nil {
		t.Fatal(err)
	}
	want := []string{"persistence " + f.uuid(1) + "=1", "persistence " + f.uuid(1) + "=0"}
	if got := f.recorded(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// stepUntil runs fn in a goroutine and steps clk by step each time the
// goroutine waits on it, until fn returns.
func stepUntil(t *testing.T, clk *clocktesting.FakeClock, step time.Duration, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	deadline := time.After(testTimeout)
	for {
		select {
		case err := <-done:
			return err
		case <-deadline:
			t.Fatal("function did not return within timeout")
			return nil
		case <-time.After(time.Millisecond):
			if clk.HasWaiters() {
				clk.Step(step)
			}
		}
	}
}

func TestWaitFabricCompleted(t *testing.T) {
	const poll = 2 * time.Second
	tests := []struct {
		name       string
		arch       arch
		doneAfter  int // fabric COMPLETED from this poll on (0: never)
		status     nvml.Return
		fabricRet  nvml.Return
		wantErr    error
		wantPolls  int
		wantWaited time.Duration
	}{
		{name: "completes after 4 polls", arch: archH100, doneAfter: 4, wantPolls: 4, wantWaited: 3 * poll},
		{name: "already complete", arch: archH100, doneAfter: 1, wantPolls: 1},
		{name: "times out", arch: archH100, wantErr: ErrFabricTimeout, wantPolls: 6, wantWaited: 10 * time.Second},
		{name: "completed with error status", arch: archH100, doneAfter: 2, status: nvml.ERROR_UNKNOWN, wantErr: ErrFabricFailed, wantPolls: 2, wantWaited: poll},
		{name: "A100 has no fabric info", arch: archA100, wantPolls: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			if tc.arch == archH100 {
				d := f.dev(3)
				d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
					f.mu.Lock()
					defer f.mu.Unlock()
					f.gpus[3].fabricCalls++
					if tc.doneAfter > 0 && f.gpus[3].fabricCalls >= tc.doneAfter {
						return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(tc.status)}, nvml.SUCCESS
					}
					return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}, nvml.SUCCESS
				}
			}
			m, clk := newTestManager(t, f, func(c *Config) { c.FabricPollInterval = poll; c.FabricTimeout = 10 * time.Second })
			start := clk.Now()
			err := stepUntil(t, clk, poll, func() error { return m.WaitFabricCompleted(t.Context(), f.uuid(3)) })
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("WaitFabricCompleted = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				containsAll(t, "error", err.Error(), f.uuid(3))
			}
			f.mu.Lock()
			polls := f.gpus[3].fabricCalls
			f.mu.Unlock()
			if polls != tc.wantPolls {
				t.Errorf("polls = %d, want %d", polls, tc.wantPolls)
			}
			if waited := clk.Since(start); waited != tc.wantWaited {
				t.Errorf("waited %v on the clock, want %v", waited, tc.wantWaited)
			}
		})
	}
}

func TestWaitFabricCompletedContextCancel(t *testing.T) {
	f := newFleet(t, archH100)
	f.each(func(g *gpuState) { g.fabricState = nvml.GPU_FABRIC_STATE_NOT_STARTED })
	m, _ := newTestManager(t, f)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := m.WaitFabricCompleted(ctx, f.uuid(0))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	containsAll(t, "error", err.Error(), "last state NOT_STARTED")
}

func TestVerifyHealthy(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*gpuState)
		sel     []string
		wantErr []error
		wantMsg string
	}{
		{name: "healthy", mod: func(*gpuState) {}},
		{name: "remapped rows pending", mod: func(g *gpuState) { g.remapPending = true }, wantErr: []error{ErrUnhealthy}, wantMsg: "(index 1): RemappedRowsPending"},
		{name: "missing GPU", mod: func(*gpuState) {}, sel: []string{"GPU-gone"}, wantErr: []error{ErrUnknownGPU}, wantMsg: "GPU-gone not visible"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, archH100)
			f.set(1, tc.mod)
			m, _ := newTestManager(t, f)
			sel := append(f.uuids(0, 1), tc.sel...)
			err := m.VerifyHealthy(sel)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("VerifyHealthy: %v", err)
				}
				return
			}
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("err = %v, want %v", err, want)
				}
			}
			containsAll(t, "error", err.Error(), tc.wantMsg)
		})
	}
}
