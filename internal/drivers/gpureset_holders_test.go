package drivers_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/gpuhealth"
)

// gpuOperator is the Node and the GPU Operator's DaemonSet controller: a
// deploy label set to "false" deletes that component's pod, whose stand-in
// is a real child process holding the GPU device nodes open (as a device
// plugin or dcgm-exporter does); "true" again starts a new one.
type gpuOperator struct {
	t     *testing.T
	nodes []string // device nodes a component's pod holds

	mu     sync.Mutex
	labels map[string]string
	pods   map[string]*exec.Cmd // label key → running stand-in
	calls  []string
	// pollsBeforeGone: the pod lingers for this many listings after its
	// label is set to false (terminating), as a real pod does.
	pollsBeforeGone int
	lingering       map[string]int
}

func newGPUOperator(t *testing.T, nodes []string, labels map[string]string) *gpuOperator {
	o := &gpuOperator{t: t, nodes: nodes, labels: labels, pods: map[string]*exec.Cmd{}, lingering: map[string]int{}}
	for k, v := range labels {
		if v == "true" {
			o.startPod(k)
		}
	}
	t.Cleanup(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		for k := range o.pods {
			o.stopPod(k)
		}
	})
	return o
}

// startPod starts a stand-in holding every node open. Call under mu (or
// before sharing o).
func (o *gpuOperator) startPod(key string) {
	script := ""
	for i, n := range o.nodes {
		script += fmt.Sprintf("exec %d<%s; ", i+3, n)
	}
	cmd := exec.Command("sh", "-c", script+"echo ready; exec sleep 600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		o.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		o.t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		o.t.Fatalf("stand-in pod for %s: %q, %v", key, line, err)
	}
	o.pods[key] = cmd
}

func (o *gpuOperator) stopPod(key string) {
	if cmd, ok := o.pods[key]; ok {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		delete(o.pods, key)
	}
}

func (o *gpuOperator) NodeLabels(context.Context) (map[string]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return maps.Clone(o.labels), nil
}

func (o *gpuOperator) SetNodeLabels(_ context.Context, set map[string]*string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(set)) {
		v := set[k]
		if v == nil {
			delete(o.labels, k)
			o.calls = append(o.calls, "remove "+k)
			continue
		}
		o.labels[k] = *v
		o.calls = append(o.calls, k+"="+*v)
		switch {
		case *v == "true" && o.pods[k] == nil:
			o.startPod(k)
		case *v != "true":
			o.lingering[k] = o.pollsBeforeGone
		}
	}
	return nil
}

func (o *gpuOperator) PodsSelectingLabels(_ context.Context, keys []string) ([]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, k := range keys {
		if o.pods[k] == nil || o.labels[k] == "true" {
			continue
		}
		if o.lingering[k] > 0 {
			o.lingering[k]--
			out = append(out, "gpu-operator/"+strings.TrimPrefix(k, drivers.DefaultGPUOperatorLabelPrefix))
			continue
		}
		o.stopPod(k) // the DaemonSet controller deleted it
	}
	return out, nil
}

type gpuNoConditions struct{}

func (gpuNoConditions) SetNodeConditions(context.Context, time.Time, ...apiclient.NodeCondition) error {
	return nil
}

// TestGPUResetClearsHolders runs a reset against doubles as strict as the
// real tools: nvidia-smi refuses while any process holds the GPU's node,
// and the agent's own NVML session (the fleet's, opened at Init) and the
// GPU Operator's pods (real child processes) hold every node. The reset
// succeeds only when the driver clears both first; what it cannot clear is
// named and nvidia-smi is never called.
func TestGPUResetClearsHolders(t *testing.T) {
	const dp, exporter = "nvidia.com/gpu.deploy.device-plugin", "nvidia.com/gpu.deploy.dcgm-exporter"
	tests := []struct {
		name       string
		noSession  bool // the driver does not pause the agent's session
		noOperator bool // the driver does not pause the GPU Operator
		lingering  int
		wantErr    string
		wantProg   []string
	}{
		{name: "everything cleared: reset, then restored", lingering: 2,
			wantProg: []string{"GPU Operator components paused", "waiting for 2 GPU Operator pod(s) to leave", "GPU Operator pods gone",
				"GPU Operator labels restored (2)"}},
		{name: "our own NVML session left open: refused, naming us", noSession: true,
			wantErr: "processes hold the GPUs being reset"},
		{name: "GPU Operator pods left: refused, naming them", noOperator: true,
			wantErr: "(pid "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": "3"})
			dev, err := e.fleet.DeviceNodes(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			d := e.agent(devices.ResetMethodSMI)
			d.DevRoot = dev
			d.FindHolders = nil // the real /proc scan
			d.Services = nil
			e.host.mu.Lock()
			e.host.active = map[string]bool{}
			e.host.mu.Unlock()
			d.Runner = e.fleet.SMIRunner()
			mon, err := gpuhealth.New(gpuhealth.Config{Node: "node-a", Devices: d.Devices, Conditions: gpuNoConditions{}, Clock: e.clk})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			runDone := make(chan struct{})
			go func() { defer close(runDone); _ = mon.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-runDone })
			if !tc.noSession {
				d.Session = gpuhealth.Session{Monitor: mon, NVML: d.Devices}
			}
			op := newGPUOperator(t, []string{e.fleet.DevicePath(3)}, map[string]string{dp: "true", exporter: "true"})
			op.labels["nvidia.com/gpu.deploy.driver"] = "true" // its pod holds no GPU node here
			op.pollsBeforeGone = tc.lingering
			if !tc.noOperator {
				d.Operator, d.OperatorComponents = op, drivers.DefaultGPUOperatorComponents()
				d.OperatorPodPoll = time.Second
			}
			// The wait polls on the fake clock: step it whenever it waits.
			stop := make(chan struct{})
			stepped := make(chan struct{})
			go func() {
				defer close(stepped)
				tick := time.NewTicker(time.Millisecond) // test pacing only, not logic
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if e.clk.HasWaiters() {
						e.clk.Step(time.Second)
					}
				}
			}()
			defer func() { close(stop); <-stepped }()

			_, err = gpuRunEvent(t, d, e.rt, gpuCrash{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if n := e.fleet.Resets()[e.fleet.UUID(3)]; n != 0 || slices.ContainsFunc(e.fleet.Calls(), func(c string) bool { return strings.HasPrefix(c, "nvidia-smi") }) {
					t.Errorf("nvidia-smi was called (%d resets, calls %q); the driver must refuse first", n, e.fleet.Calls())
				}
				containsEach(t, "progress", e.rt.messages(), "gpu-reset refused: processes hold the GPUs being reset")
			} else if err != nil {
				t.Fatalf("event: %v\nprogress: %q", err, e.rt.messages())
			} else {
				e.wantResets(e.fleet.UUIDs(3))
			}
			containsEach(t, "progress", e.rt.messages(), tc.wantProg...)
			// Whatever happened: labels exactly as before, our session and
			// monitor back, nothing owned.
			if got := op.labels; got[dp] != "true" || got[exporter] != "true" || got["nvidia.com/gpu.deploy.driver"] != "true" {
				t.Errorf("labels after the event: %v", got)
			}
			if slices.Contains(op.calls, "nvidia.com/gpu.deploy.driver=false") {
				t.Error("the driver component was paused")
			}
			if !e.fleet.SessionOpen() || mon.Paused() {
				t.Errorf("session open %v, monitor paused %v: want resumed", e.fleet.SessionOpen(), mon.Paused())
			}
			if k := e.j.ownedKeys(); len(k) > 0 {
				t.Errorf("owned changes left: %v", k)
			}
		})
	}
}

// TestGPUResetResolvedPlan: the plan is fixed at claim; a replay reads it
// and never the live inventory, and gpus=all fails naming a GPU that did
// not come back.
func TestGPUResetResolvedPlan(t *testing.T) {
	tests := []struct {
		name    string
		params  map[string]string
		method  devices.ResetMethod
		noSMI   bool
		mutate  func(f *devicestest.Fleet)
		wantErr string
		want    map[string]string
	}{
		{name: "indices become UUIDs, route and services fixed", params: map[string]string{"gpus": "2"}, method: devices.ResetMethodAuto,
			want: map[string]string{"resolved.route": "nvidia-smi:/usr/bin/nvidia-smi", "resolved.gpuCount": "8",
				"resolved.services": "nvidia-dcgm.service,nvidia-persistenced.service,nvidia-device-plugin.service", "resolved.labels": "{}"}},
		{name: "auto without nvidia-smi fails, never PCI remove", params: map[string]string{"gpus": "2"}, method: devices.ResetMethodAuto, noSMI: true,
			wantErr: "set gpu.resetMethod=nvml"},
		{name: "reserved prefix refused", params: map[string]string{"gpus": "2", "resolved.route": "nvml"}, wantErr: "reserved"},
		{name: "gpus=all with a GPU gone after claim fails naming it", params: map[string]string{"gpus": "all"}, method: devices.ResetMethodNVML,
			mutate:  func(f *devicestest.Fleet) { f.Set(6, func(g *devicestest.GPU) { g.OffBus = true }) },
			wantErr: "unknown GPU"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, devicestest.DGXH100, tc.params)
			d := e.agent(tc.method)
			if tc.noSMI {
				d.LookPath = func(f string) (string, error) { return "", &exec.Error{Name: f, Err: exec.ErrNotFound} }
			}
			resolved, err := d.Resolve(context.Background(), tc.params)
			if tc.mutate == nil && tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if resolved[k] != v {
					t.Errorf("%s = %q, want %q", k, resolved[k], v)
				}
			}
			if tc.params["gpus"] == "2" && resolved["resolved.gpus"] != e.fleet.UUID(2) {
				t.Errorf("resolved.gpus = %q, want %s", resolved["resolved.gpus"], e.fleet.UUID(2))
			}
			if tc.mutate == nil {
				return
			}
			tc.mutate(e.fleet)
			// Plan from the journaled map must not consult NVML for the
			// selection: it still names all 8 GPUs.
			if _, err := d.Plan(resolved); err != nil {
				t.Fatalf("Plan(resolved) with a GPU gone: %v", err)
			}
			e.rt.params = resolved
			_, err = gpuRunEvent(t, d, e.rt, gpuCrash{})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), e.fleet.UUID(6)) {
				t.Fatalf("event err = %v, want %q naming %s", err, tc.wantErr, e.fleet.UUID(6))
			}
		})
	}
}

// TestGPUResetUnplugCrash: a crash after the NVML route removed a GPU and
// before the rescan leaves it off the bus; the replay rediscovers it from
// the journal, never resets twice, and the event succeeds.
func TestGPUResetUnplugCrash(t *testing.T) {
	e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": "4"})
	d := e.agent(devices.ResetMethodNVML)
	u := e.fleet.UUID(4)
	resolved, err := d.Resolve(context.Background(), e.rt.params)
	if err != nil {
		t.Fatal(err)
	}
	e.rt.params = resolved
	// Run up to the reset, then remove the GPU as the route would and die
	// before DeviceDiscoverGpus: the journal holds the unplug record.
	steps, err := d.Plan(resolved)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range steps {
		if s.Name == "gpu-reset" {
			break
		}
		e.j.add(s.Name, "intent", e.rt.BootID())
		if err := s.Run(context.Background(), e.rt); err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		e.j.add(s.Name, "done", e.rt.BootID())
	}
	e.j.add("gpu-reset", "intent", e.rt.BootID())
	if err := e.rt.Own(drivers.Change{Kind: "gpu-reset-issued", Key: "gpu-reset-issued/reset-1"}); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Own(drivers.Change{Kind: "gpu-unplugged", Key: "gpu-unplugged/" + u}); err != nil {
		t.Fatal(err)
	}
	e.fleet.Set(4, func(g *devicestest.GPU) { g.Removed = true })

	d2 := e.agent(devices.ResetMethodNVML) // the restarted agent
	if _, err := gpuRunEvent(t, d2, e.rt, gpuCrash{}); err != nil {
		t.Fatalf("replay: %v\nprogress %q", err, e.rt.messages())
	}
	if g := e.fleet.GPU(4); g.Removed || g.Resets != 1 {
		t.Errorf("GPU 4 removed=%v resets=%d; want back and reset once (by the rescan)", g.Removed, g.Resets)
	}
	containsEach(t, "progress", e.rt.messages(), "rediscovered "+u)
	e.wantRestored()
}

// TestGPUResetServices: only units holding the GPUs being reset are
// stopped; Fabric Manager stays up for a single-GPU reset on Hopper
// NVSwitch and is stopped where the whole set resets (A100).
func TestGPUResetServices(t *testing.T) {
	const fm = "nvidia-fabricmanager.service"
	tests := []struct {
		name    string
		model   devicestest.Model
		holding []string
		want    string
	}{
		{name: "h100 one GPU: holders only, never Fabric Manager", model: devicestest.DGXH100, holding: []string{"nvidia-dcgm.service", fm}, want: "nvidia-dcgm.service"},
		{name: "h100 nothing holds: nothing stopped", model: devicestest.DGXH100, want: ""},
		{name: "a100 whole set: Fabric Manager stopped", model: devicestest.DGXA100, holding: []string{"nvidia-persistenced.service"}, want: "nvidia-persistenced.service," + fm},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, tc.model, map[string]string{"gpus": "0"})
			d := e.agent(devices.ResetMethodSMI)
			d.Services = append(slices.Clone(gpuServices), fm)
			d.FindHolders = func(paths []string) (devices.HolderScan, error) {
				var s devices.HolderScan
				for i, u := range tc.holding {
					s.Holders = append(s.Holders, devices.Holder{PID: 10 + i, Unit: u, Device: paths[0]})
				}
				return s, nil
			}
			resolved, err := d.Resolve(context.Background(), e.rt.params)
			if err != nil {
				t.Fatal(err)
			}
			if got := resolved["resolved.services"]; got != tc.want {
				t.Errorf("services = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGPUResetFabricManagerInDriverPod: on a GPU Operator node Fabric
// Manager is a process in the driver pod (comm "nv-fabricmanage", the
// kernel's 15 characters of nv-fabricmanager), in no systemd unit. A
// single-GPU reset on Hopper NVSwitch goes ahead with it running, as with
// the host's nvidia-fabricmanager.service; any other process of a pod
// holding the node is still named and refuses the reset.
func TestGPUResetFabricManagerInDriverPod(t *testing.T) {
	for _, tc := range []struct {
		name, comm string
		wantErr    string
	}{
		{name: "fabric manager in the driver pod: reset", comm: "nv-fabricmanage"},
		{name: "another process of a pod: refused, named", comm: "python3",
			wantErr: "python3 (pid 4242) holds /dev/nvidia"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": "0"})
			d := e.agent(devices.ResetMethodSMI)
			d.Runner = e.fleet.SMIRunner()
			d.Services = nil
			d.FindHolders = func(paths []string) (devices.HolderScan, error) {
				return devices.HolderScan{Holders: []devices.Holder{{PID: 4242, Comm: tc.comm, Pod: "0f1e2d3c", Device: paths[0]}}}, nil
			}
			_, err := gpuRunEvent(t, d, e.rt, gpuCrash{})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("reset refused: %v", err)
				}
				if n := e.fleet.Resets()[e.fleet.UUID(0)]; n != 1 {
					t.Errorf("GPU 0 reset %d times, want 1", n)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to name %q", err, tc.wantErr)
			}
			if n := e.fleet.Resets()[e.fleet.UUID(0)]; n != 0 {
				t.Errorf("GPU 0 reset %d times after a refusal", n)
			}
		})
	}
}

// TestGPUResetRouteDriverRoot: gpu.nvidiaSMI auto runs the driver root's
// nvidia-smi inside it when the root holds one (a GPU Operator node), is
// PATH's otherwise, and an explicit gpu.nvidiaSMI wins; with neither the
// claim fails naming both places looked at.
func TestGPUResetRouteDriverRoot(t *testing.T) {
	withSMI := t.TempDir()
	if err := os.MkdirAll(filepath.Join(withSMI, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(withSMI, drivers.DriverRootSMI), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	notFound := func(string) (string, error) { return "", errors.New("executable file not found in $PATH") }
	for _, tc := range []struct {
		name, root, smi string
		look            func(string) (string, error)
		want, wantErr   string
	}{
		{name: "driver root with nvidia-smi", root: withSMI, look: notFound, want: "nvidia-smi-in:" + withSMI},
		{name: "explicit path wins", root: withSMI, smi: "/opt/nvidia/nvidia-smi",
			look: func(p string) (string, error) { return p, nil }, want: "nvidia-smi:/opt/nvidia/nvidia-smi"},
		{name: "driver root without nvidia-smi: PATH", root: empty,
			look: func(string) (string, error) { return "/usr/bin/nvidia-smi", nil }, want: "nvidia-smi:/usr/bin/nvidia-smi"},
		{name: "nowhere: refused naming both", root: empty, look: notFound,
			wantErr: "nvidia-smi not found (executable file not found in $PATH) nor at " + filepath.Join(empty, drivers.DriverRootSMI)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": "0"})
			d := e.agent(devices.ResetMethodAuto)
			d.Services, d.DriverRoot, d.SMIPath, d.LookPath = nil, tc.root, tc.smi, tc.look
			resolved, err := d.Resolve(context.Background(), e.rt.params)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := resolved["resolved.route"]; got != tc.want {
				t.Errorf("route = %q, want %q", got, tc.want)
			}
		})
	}
}
