package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// runGPU runs the binary built by TestMain with a clean environment and an
// empty configuration file, and returns its exit code and output.
func runGPU(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"LIFECYCLE_AGENT_CONFIG=" + cfg, "LIFECYCLE_AGENT_NODE_NAME=gpu-node"}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// hostHasNVML reports whether libnvidia-ml.so.1 can be loaded here; the
// no-NVML cases only hold on a host without it.
func hostHasNVML() bool {
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil && strings.Contains(string(out), "libnvidia-ml.so.1") {
		return true
	}
	for _, p := range []string{"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib64/libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func TestGPUCommands(t *testing.T) {
	noNVML := `^lifecycle-agent: gpu (inventory|reset): no NVML on this host: devices: no NVML \(Init: ERROR_[A-Z_]+\)\n$`
	tests := []struct {
		name   string
		args   []string
		nvml   bool // the case needs a host without NVML
		code   int
		stderr string // regexp
	}{
		{name: "inventory without NVML", args: []string{"gpu", "inventory"}, nvml: true, code: 3, stderr: noNVML},
		{name: "inventory --json without NVML", args: []string{"gpu", "inventory", "--json"}, nvml: true, code: 3, stderr: noNVML},
		{name: "inventory -o json without NVML", args: []string{"gpu", "inventory", "-o", "json"}, nvml: true, code: 3, stderr: noNVML},
		{
			name: "inventory -o yaml", args: []string{"gpu", "inventory", "-o", "yaml"}, code: 2,
			stderr: `^lifecycle-agent: gpu inventory: --output "yaml": want text, json; run 'lifecycle-agent gpu inventory --help'\n$`,
		},
		{name: "reset --dry-run without NVML", args: []string{"gpu", "reset", "--dry-run", "--gpus", "all"}, nvml: true, code: 3, stderr: noNVML},
		{
			name: "reset without --dry-run", args: []string{"gpu", "reset", "--gpus", "all"}, code: 2,
			stderr: `^lifecycle-agent: gpu reset: refusing to reset without --dry-run: a real GPU reset only runs through a gpu-reset LifecycleEvent .*; run 'lifecycle-agent gpu reset --help'\n$`,
		},
		{
			name: "reset with no flags", args: []string{"gpu", "reset"}, code: 2,
			stderr: `^lifecycle-agent: gpu reset: refusing to reset without --dry-run`,
		},
		{
			name: "reset --dry-run without --gpus", args: []string{"gpu", "reset", "--dry-run"}, code: 2,
			stderr: `^lifecycle-agent: gpu reset: missing --gpus: all, GPU UUIDs or indices; run 'lifecycle-agent gpu reset --help'\n$`,
		},
		{
			name: "gpu without a subcommand", args: []string{"gpu"}, code: 2,
			stderr: `^lifecycle-agent: gpu: missing subcommand: inventory, reset or xids; run 'lifecycle-agent gpu --help'\n$`,
		},
		{
			name: "unknown gpu subcommand", args: []string{"gpu", "rest"}, code: 2,
			stderr: `^lifecycle-agent: gpu: unknown command "rest" \(did you mean "reset"\?\)`,
		},
	}
	hasNVML := hostHasNVML()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.nvml && hasNVML {
				t.Skip("this host has libnvidia-ml.so.1; hack/gpu-check.sh covers it")
			}
			code, stdout, stderr := runGPU(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if !regexp.MustCompile(tc.stderr).MatchString(stderr) {
				t.Errorf("stderr %q does not match %q", stderr, tc.stderr)
			}
			if strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr is not one line: %q", stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want none", stdout)
			}
		})
	}
}

// mockGPUs is a devices.Manager over a mock DGX (devicestest).
func mockGPUs(t *testing.T, model devicestest.Model) (*devicestest.Fleet, *devices.Manager) {
	t.Helper()
	f := devicestest.New(model)
	m, err := f.Manager(devicestest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Error(err)
		}
	})
	return f, m
}

func TestGPUInventoryOutput(t *testing.T) {
	tests := []struct {
		name  string
		model devicestest.Model
		json  bool
		want  []string // substrings; %3 is GPU 3's UUID
	}{
		{name: "dgxh100 table", model: devicestest.DGXH100, want: []string{
			"driver 550.54.15, 8 GPU(s), NVSwitch: true",
			"INDEX  UUID", "3      %3", "Hopper", "COMPLETED",
			"RemappedRowsPending, XID 79",
			"GPUHealthy: False (GPUUnhealthy): 1 of 8 GPUs unhealthy: %3 (index 3): RemappedRowsPending, XID 79",
		}},
		{name: "dgxa100 json", model: devicestest.DGXA100, json: true, want: []string{
			`"driverVersion": "550.54.15"`, `"nvswitch": true`, `"uuid": "%3"`, `"architecture": "Ampere"`,
			`"remappedRows": {`, `"pending": true`, `"reasons": [`, `"notSupported": [`, `"status": "False"`,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, m := mockGPUs(t, tc.model)
			f.Set(3, func(g *devicestest.GPU) { g.RemappedRowsPending = true })
			if !tc.json {
				w, err := m.WatchEvents(context.Background(), nil)
				if err != nil {
					t.Fatal(err)
				}
				f.InjectXID(3, 79)
				<-w
			}
			var out bytes.Buffer
			o := gpuInventoryOptions{Output: outText}
			if tc.json {
				o.Output = outJSON
			}
			if err := writeInventory(&out, m, o); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, "%3", f.UUID(3))
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not contain %q:\n%s", w, out.String())
				}
			}
			if calls := f.Calls(); len(calls) > 0 {
				t.Errorf("inventory changed the GPUs: %q", calls)
			}
		})
	}
}

func TestGPUResetDryRunOutput(t *testing.T) {
	services := []string{"nvidia-dcgm.service", "nvidia-persistenced.service"}
	tests := []struct {
		name    string
		model   devicestest.Model
		method  devices.ResetMethod
		opts    gpuResetOptions
		setup   func(*devicestest.Fleet)
		want    []string // %0, %1 … are UUIDs; runs of spaces compare as one
		wantErr string
		// operator: the GPU Operator components device-plugin, dcgm-exporter
		// and dcgm are configured and the Node's labels read from it.
		operator *dryRunOperator
		holders  []devices.Holder // the holder scan's result
	}{
		{name: "dgxh100 one GPU", model: devicestest.DGXH100, method: devices.ResetMethodSMI, opts: gpuResetOptions{GPUs: "1"},
			setup: func(f *devicestest.Fleet) { f.Set(1, func(g *devicestest.GPU) { g.Persistence = true }) },
			want: []string{"dry run: nothing was changed", "selected:     %1", "reset group:  1 GPU(s): %1\n", "nvswitch:     true",
				"fabric:       %1 COMPLETED (SUCCESS)", "persistence:  would turn off on %1 and restore it after the reset",
				"would stop:   nvidia-dcgm.service, nvidia-persistenced.service (started again in reverse order)",
				"inhibitor:    shutdown:sleep (block) held during the reset", "reset:        run nvidia-smi --gpu-reset -i %1",
				"steps:        check-gpus, pause-gpu-operator, wait-gpu-operator-pods, stop-gpu-services, persistence-off, gpu-reset, restore-persistence, start-gpu-services, wait-fabric, verify-gpus, restore-gpu-operator",
				"blockers:     none"}},
		{name: "dgxa100 expands", model: devicestest.DGXA100, method: devices.ResetMethodNVML, opts: gpuResetOptions{GPUs: "0"},
			want: []string{"reset group:  8 GPU(s): %0, %1,", "(expanded: pre-Hopper NVSwitch system (Ampere)", "%0 not reported",
				"warning:      pre-Hopper NVSwitch system: Fabric Manager must be stopped for the reset, but gpu.services does not name nvidia-fabricmanager.service",
				"reset:        NVML reset of %0 [0000:00:00.0]"}},
		{name: "processes refuse", model: devicestest.DGXH100, method: devices.ResetMethodNVML, opts: gpuResetOptions{GPUs: "all"},
			setup:   func(f *devicestest.Fleet) { f.Set(2, func(g *devicestest.GPU) { g.ComputePIDs = []uint32{42} }) },
			want:    []string{"blocker:      %2 (index 2): processes running (compute PIDs 42)"},
			wantErr: "the reset would be refused now: 1 blocker(s)"},
		{name: "processes with --drain", model: devicestest.DGXH100, method: devices.ResetMethodNVML, opts: gpuResetOptions{GPUs: "all", Drain: true},
			setup: func(f *devicestest.Fleet) { f.Set(2, func(g *devicestest.GPU) { g.ComputePIDs = []uint32{42} }) },
			want:  []string{"drain:        would cordon and drain the node first", "steps:        check-gpus, cordon, evict, wait-empty,", "blocker:      %2"}},
		{name: "MIG refuses even with --drain", model: devicestest.DGXH100, method: devices.ResetMethodNVML, opts: gpuResetOptions{GPUs: "5", Drain: true},
			setup:   func(f *devicestest.Fleet) { f.Set(5, func(g *devicestest.GPU) { g.MIG = true }) },
			want:    []string{"blocker:      %5 (index 5): MIG enabled"},
			wantErr: "would be refused"},
		{name: "bad selection is a usage error", model: devicestest.DGXH100, opts: gpuResetOptions{GPUs: "12"}, wantErr: "parameters.gpus"},
		// What the claim would meet on a GPU Operator node: the deploy labels
		// it would pause (read from the Node, not changed) and who holds the
		// GPU's node now — the running agent among them, which lets go.
		{name: "operator labels and holders", model: devicestest.DGXH100, method: devices.ResetMethodSMI, opts: gpuResetOptions{GPUs: "1"},
			operator: &dryRunOperator{labels: map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true",
				"nvidia.com/gpu.deploy.dcgm-exporter": "true", "nvidia.com/gpu.deploy.driver": "true"}},
			holders: []devices.Holder{{PID: 4242, Comm: "lifecycle-agent", Unit: "lifecycle-agent.service", Device: "/dev/nvidia1"},
				{PID: 4343, Comm: "dcgm-exporter", Pod: "0c1f", Device: "/dev/nvidia1"}},
			want: []string{"gpu operator: would set nvidia.com/gpu.deploy.dcgm-exporter=false (now true), nvidia.com/gpu.deploy.device-plugin=false (now true), wait for those pods to go, and restore the values after the reset",
				"holder now: lifecycle-agent (pid 4242) holds /dev/nvidia1", "(the agent: it lets go of its NVML session for the reset)",
				"holder now: dcgm-exporter (pid 4343) holds /dev/nvidia1"}},
		{name: "operator labels unreadable", model: devicestest.DGXH100, method: devices.ResetMethodSMI, opts: gpuResetOptions{GPUs: "1"},
			operator: &dryRunOperator{err: errors.New("apiclient: get node n1: connection refused")},
			want:     []string{"gpu operator: deploy labels not read (gpu-reset: reading the Node's GPU Operator labels: apiclient: get node n1: connection refused): the claim reads them", "holders now: none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, m := mockGPUs(t, tc.model)
			if tc.setup != nil {
				tc.setup(f)
			}
			d := drivers.GPUReset{Devices: m, Method: tc.method, Services: services,
				FindHolders: func([]string) (devices.HolderScan, error) { return devices.HolderScan{Holders: tc.holders}, nil }}
			if tc.operator != nil {
				d.Operator, d.OperatorComponents = tc.operator, []string{"device-plugin", "dcgm-exporter", "dcgm"}
			}
			var out bytes.Buffer
			err := writeResetDryRun(context.Background(), &out, d, tc.opts)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("dry run: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("dry run: %v, want %q", err, tc.wantErr)
			}
			var ee *exitError
			if tc.name == "bad selection is a usage error" && (!errors.As(err, &ee) || ee.code != exitUsage) {
				t.Errorf("error %v, want exit code %d", err, exitUsage)
			}
			spaces := regexp.MustCompile(` +`)
			got := spaces.ReplaceAllString(out.String(), " ")
			for _, w := range tc.want {
				for i := range f.Len() {
					w = strings.ReplaceAll(w, fmt.Sprintf("%%%d", i), f.UUID(i))
				}
				if !strings.Contains(got, spaces.ReplaceAllString(w, " ")) {
					t.Errorf("output does not contain %q:\n%s", w, out.String())
				}
			}
			if calls := f.Calls(); len(calls) > 0 {
				t.Errorf("the dry run changed the GPUs: %q", calls)
			}
			if tc.operator != nil && tc.operator.set > 0 {
				t.Errorf("the dry run changed the Node's labels (%d patches)", tc.operator.set)
			}
		})
	}
}

// dryRunOperator serves the Node's labels to the dry run and counts the
// writes it must never make.
type dryRunOperator struct {
	labels map[string]string
	err    error
	set    int
}

func (o *dryRunOperator) NodeLabels(context.Context) (map[string]string, error) {
	return o.labels, o.err
}

func (o *dryRunOperator) SetNodeLabels(context.Context, map[string]*string) error {
	o.set++
	return errors.New("dry run: no label may change")
}

func (o *dryRunOperator) PodsSelectingLabels(context.Context, []string) ([]string, error) {
	return nil, errors.New("dry run: pods are not listed")
}

// gpu.driverRoot (the GPU Operator's /run/nvidia/driver): the gpu
// commands and doctor load NVML from the library under it, and say so when
// there is none there or it does not load (a file that is not a library
// stands in for a driver the host cannot load: the message names the path,
// which shows it was the one tried).
func TestGPUDriverRoot(t *testing.T) {
	empty := t.TempDir()
	broken := t.TempDir()
	lib := filepath.Join(broken, "usr/lib64/libnvidia-ml.so.1")
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, []byte("not a shared object\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	q := regexp.QuoteMeta
	for _, tc := range []struct {
		name, root string
		args       []string
		code       int
		out        string // regexp of stderr (gpu) or of doctor's nvml line
	}{
		{name: "inventory, no library under the root", root: empty, args: []string{"gpu", "inventory"}, code: 3,
			out: "^" + q("lifecycle-agent: gpu inventory: gpu.driverRoot "+empty+": no libnvidia-ml.so.1 in usr/lib/x86_64-linux-gnu, lib/x86_64-linux-gnu, ") + `.*\n$`},
		{name: "inventory, a library that does not load", root: broken, args: []string{"gpu", "inventory"}, code: 3,
			out: "^" + q("lifecycle-agent: gpu inventory: no NVML on this host: devices: no NVML: loading "+lib+" (Init: ERROR_LIBRARY_NOT_FOUND)") + `\n$`},
		{name: "doctor, no library under the root", root: empty, args: []string{"doctor"}, code: 1,
			out: q("✗ nvml: gpu.driverRoot "+empty+": no libnvidia-ml.so.1 in ") + ".*" + q(" — fix: start the GPU Operator's driver pod (nvidia-driver-daemonset), or fix or unset gpu.driverRoot")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := agent(t, []string{"LIFECYCLE_AGENT_GPU_DRIVER_ROOT=" + tc.root, "LIFECYCLE_AGENT_KUBECONFIG=" + filepath.Join(empty, "absent"),
				"DBUS_SYSTEM_BUS_ADDRESS=unix:path=" + filepath.Join(empty, "no-bus")}, tc.args...)
			if r.code != tc.code {
				t.Errorf("exit code %d, want %d\nstdout %s\nstderr %s", r.code, tc.code, r.stdout, r.stderr)
			}
			got := r.stderr
			if tc.args[0] == "doctor" {
				got = ""
				for _, l := range strings.Split(r.stdout, "\n") {
					if strings.Contains(l, " nvml: ") {
						got = l
					}
				}
			}
			if !regexp.MustCompile(tc.out).MatchString(got) {
				t.Errorf("got %q\nwant %s", got, tc.out)
			}
		})
	}
}
