package drivers_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// The fakes below are prefixed gpu* so they never meet other drivers' test
// helpers in this directory.

var (
	gpuEpoch    = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	gpuServices = []string{"nvidia-dcgm.service", "nvidia-persistenced.service", "nvidia-device-plugin.service"}
	errGPUCrash = errors.New("simulated crash")
)

// gpuJournal is what survives an agent restart: the step log and the owned
// changes, as the engine's journal keeps them.
type gpuJournal struct {
	mu      sync.Mutex
	records []gpuRecord
	owned   map[string]bool // Kind + "|" + Key
}

type gpuRecord struct{ step, phase, bootID string }

func newGPUJournal() *gpuJournal { return &gpuJournal{owned: map[string]bool{}} }

func (j *gpuJournal) add(step, phase, bootID string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.records = append(j.records, gpuRecord{step, phase, bootID})
}

func (j *gpuJournal) last(step string) (gpuRecord, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := len(j.records) - 1; i >= 0; i-- {
		if j.records[i].step == step {
			return j.records[i], true
		}
	}
	return gpuRecord{}, false
}

func (j *gpuJournal) ownedKeys() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out []string
	for k := range j.owned {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// gpuHost is a recording HostOps: units, inhibitors, and nvidia-smi played
// by the fleet.
type gpuHost struct {
	fleet *devicestest.Fleet

	mu         sync.Mutex
	log        []string
	bootID     string
	simulated  bool
	active     map[string]bool
	held       int
	inhibitErr error
	// unreadable are PIDs whose open files the holder scan cannot read.
	unreadable []int
}

var _ drivers.HostOps = (*gpuHost)(nil)

func newGPUHost(f *devicestest.Fleet) *gpuHost {
	h := &gpuHost{fleet: f, bootID: "boot-1", active: map[string]bool{}}
	for _, u := range gpuServices {
		h.active[u] = true
	}
	return h
}

func (h *gpuHost) record(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

func (h *gpuHost) ops() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.log)
}

func (h *gpuHost) totalResets() int {
	n := 0
	for _, c := range h.fleet.Resets() {
		n += c
	}
	return n
}

func (h *gpuHost) BootID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bootID
}
func (h *gpuHost) BootTime() time.Time                              { return time.Time{} }
func (h *gpuHost) Reboot(context.Context) error                     { return errors.New("gpuHost: no reboot") }
func (h *gpuHost) OSRelease() (string, string, error)               { return "12", "6.1.0", nil }
func (h *gpuHost) RebootRequired() bool                             { return false }
func (h *gpuHost) Simulated() bool                                  { return h.simulated }
func (h *gpuHost) UnitActive(context.Context, string) (bool, error) { return false, nil }
func (h *gpuHost) RunTransient(context.Context, string, []string, []string, time.Duration) error {
	return errors.New("gpuHost: no transient units")
}

func (h *gpuHost) Run(_ context.Context, argv, _ []string, _ time.Duration) (string, error) {
	h.record("run %s", strings.Join(argv, " "))
	if h.simulated {
		return "", errors.New("gpuHost: a command ran in simulate mode")
	}
	return h.fleet.RunSMI(argv)
}

func (h *gpuHost) Inhibit(_ context.Context, what, _ string) (func(), error) {
	if h.inhibitErr != nil {
		return nil, h.inhibitErr
	}
	resets := h.totalResets()
	h.mu.Lock()
	h.held++
	h.log = append(h.log, fmt.Sprintf("inhibit %s (resets so far %d)", what, resets))
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			resets := h.totalResets()
			h.mu.Lock()
			defer h.mu.Unlock()
			h.held--
			h.log = append(h.log, fmt.Sprintf("release %s (resets so far %d)", what, resets))
		})
	}, nil
}

func (h *gpuHost) StopUnits(_ context.Context, units ...string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, "stop "+strings.Join(units, " "))
	for _, u := range units {
		h.active[u] = false
	}
	return nil
}

func (h *gpuHost) StartUnits(_ context.Context, units ...string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, "start "+strings.Join(units, " "))
	for _, u := range units {
		h.active[u] = true
	}
	return nil
}

// gpuAPI is a recording NodeAPI. onDrain runs when the node is drained (the
// test ends the pods' GPU processes there).
type gpuAPI struct {
	mu       sync.Mutex
	log      []string
	cordoned bool
	onDrain  func()
}

var _ drivers.NodeAPI = (*gpuAPI)(nil)

func (a *gpuAPI) record(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.log = append(a.log, s)
}

func (a *gpuAPI) calls() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.log)
}

func (a *gpuAPI) Cordon(context.Context, string) (bool, error) {
	a.record("cordon")
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cordoned = true
	return true, nil
}

func (a *gpuAPI) Uncordon(context.Context, string, bool) (bool, error) {
	a.record("uncordon")
	a.mu.Lock()
	defer a.mu.Unlock()
	was := a.cordoned
	a.cordoned = false
	return was, nil
}

func (a *gpuAPI) CordonOwner(context.Context) (string, bool, error) { return "", a.cordoned, nil }

func (a *gpuAPI) Drain(context.Context, apiclient.DrainOptions) (apiclient.DrainResult, error) {
	a.record("drain")
	if a.onDrain != nil {
		a.onDrain()
	}
	return apiclient.DrainResult{Evicted: []string{"ml/train-0"}}, nil
}

func (a *gpuAPI) PodsLeft(context.Context, apiclient.DrainOptions) ([]string, error) {
	a.record("pods-left")
	return nil, nil
}

func (a *gpuAPI) NodeReady(context.Context, string) (bool, error) { return true, nil }

// gpuRuntime is a recording Runtime over a gpuJournal.
type gpuRuntime struct {
	j      *gpuJournal
	host   *gpuHost
	api    *gpuAPI
	params map[string]string

	mu       sync.Mutex
	progress []string
}

var _ drivers.Runtime = (*gpuRuntime)(nil)

func (r *gpuRuntime) EventName() string             { return "reset-1" }
func (r *gpuRuntime) Node() string                  { return "node-a" }
func (r *gpuRuntime) BootID() string                { return r.host.BootID() }
func (r *gpuRuntime) API() drivers.NodeAPI          { return r.api }
func (r *gpuRuntime) Host() drivers.HostOps         { return r.host }
func (r *gpuRuntime) Params() map[string]string     { return r.params }
func (r *gpuRuntime) StepStarted() time.Time        { return time.Time{} }
func (r *gpuRuntime) Own(c drivers.Change) error    { return r.setOwned(c, true) }
func (r *gpuRuntime) Disown(c drivers.Change) error { return r.setOwned(c, false) }

func (r *gpuRuntime) Progress(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress = append(r.progress, msg)
}

func (r *gpuRuntime) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.progress)
}

func (r *gpuRuntime) setOwned(c drivers.Change, on bool) error {
	r.j.mu.Lock()
	defer r.j.mu.Unlock()
	if on {
		r.j.owned[c.Kind+"|"+c.Key] = true
	} else {
		delete(r.j.owned, c.Kind+"|"+c.Key)
	}
	return nil
}

func (r *gpuRuntime) Owns(c drivers.Change) bool {
	r.j.mu.Lock()
	defer r.j.mu.Unlock()
	return r.j.owned[c.Kind+"|"+c.Key]
}

// gpuCrash says where the first run stops as if the agent died: at a step
// boundary (after its intent is committed, before Run; or after Run,
// before its done record) or at a failpoint inside a step.
type gpuCrash struct {
	step      string
	afterRun  bool
	failpoint string
}

func (c gpuCrash) String() string {
	switch {
	case c.failpoint != "":
		return "failpoint " + c.failpoint
	case c.afterRun:
		return "after " + c.step
	case c.step != "":
		return "before " + c.step
	}
	return "none"
}

// gpuRunEvent runs a plan the way the engine does: steps whose done record
// exists are skipped; a step with an intent but no done record is asked
// Done(intentBootID) and run only when not done; every step is intent →
// Run → done; a failed step ends the event and runs Abort. A crash stops
// everything at once: no done record, no Abort (the inhibitor is released
// because the process dies; here the step's defer does it).
func gpuRunEvent(t *testing.T, d drivers.GPUReset, rt *gpuRuntime, crash gpuCrash) (crashed bool, err error) {
	t.Helper()
	ctx := context.Background()
	if rt.params["resolved.v"] == "" {
		// The engine resolves once at claim and journals the plan.
		resolved, err := d.Resolve(ctx, rt.params)
		if err != nil {
			return false, err
		}
		rt.params = resolved
	}
	steps, err := d.Plan(rt.params)
	if err != nil {
		return false, err
	}
	for _, s := range steps {
		last, ok := rt.j.last(s.Name)
		if ok && last.phase == "done" {
			continue
		}
		if ok && last.phase == "intent" && s.Done != nil {
			done, err := s.Done(ctx, rt, last.bootID)
			if err == nil && done {
				rt.j.add(s.Name, "done", rt.BootID())
				continue
			}
		}
		rt.j.add(s.Name, "intent", rt.BootID())
		if crash.step == s.Name && !crash.afterRun {
			return true, nil
		}
		err := s.Run(ctx, rt)
		if errors.Is(err, errGPUCrash) {
			return true, nil
		}
		if err != nil {
			rt.j.add(s.Name, "failed", rt.BootID())
			if aerr := d.Abort(ctx, rt); aerr != nil {
				t.Errorf("Abort: %v", aerr)
			}
			return false, fmt.Errorf("step %s failed: %w", s.Name, err)
		}
		if crash.step == s.Name && crash.afterRun {
			return true, nil
		}
		rt.j.add(s.Name, "done", rt.BootID())
	}
	return false, nil
}

// gpuEnv is one node: the fleet (hardware), host, API and journal survive
// restarts; each Manager and driver is one agent process.
type gpuEnv struct {
	t     *testing.T
	fleet *devicestest.Fleet
	host  *gpuHost
	api   *gpuAPI
	j     *gpuJournal
	clk   *clocktesting.FakeClock
	rt    *gpuRuntime
}

func newGPUEnv(t *testing.T, model devicestest.Model, params map[string]string) *gpuEnv {
	f := devicestest.New(model)
	e := &gpuEnv{t: t, fleet: f, host: newGPUHost(f), api: &gpuAPI{}, j: newGPUJournal(),
		clk: clocktesting.NewFakeClock(gpuEpoch)}
	e.rt = &gpuRuntime{j: e.j, host: e.host, api: e.api, params: params}
	return e
}

// agent starts an agent process: a new Manager over the fleet and a driver.
func (e *gpuEnv) agent(method devices.ResetMethod, mods ...func(*devices.Config)) drivers.GPUReset {
	e.t.Helper()
	m, err := e.fleet.Manager(devicestest.Options{Clock: e.clk, Logger: gpuLogger(e.t),
		FabricPollInterval: time.Second, FabricTimeout: 30 * time.Second})
	if err != nil {
		e.t.Fatalf("Manager: %v", err)
	}
	e.t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			e.t.Errorf("Shutdown: %v", err)
		}
	})
	return drivers.GPUReset{
		Devices: m, Method: method, Services: gpuServices, Log: gpuLogger(e.t), Clock: e.clk,
		LookPath:    func(string) (string, error) { return "/usr/bin/nvidia-smi", nil },
		FindHolders: e.host.holders,
	}
}

// holders is the strict holder scan of the host: every running unit of
// gpuServices holds every GPU node open (DCGM, persistenced and a device
// plugin do), so a reset with one left running is refused.
func (h *gpuHost) holders(paths []string) (devices.HolderScan, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	scan := devices.HolderScan{Unreadable: slices.Clone(h.unreadable)}
	for i, u := range gpuServices {
		if !h.active[u] {
			continue
		}
		for _, p := range paths {
			scan.Holders = append(scan.Holders, devices.Holder{PID: 100 + i, Comm: strings.TrimSuffix(u, ".service"), Unit: u, Device: p})
		}
	}
	return scan, nil
}

func gpuLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// wantResets asserts exactly one reset on each GPU of group and none elsewhere.
func (e *gpuEnv) wantResets(group []string) {
	e.t.Helper()
	for u, n := range e.fleet.Resets() {
		want := 0
		if slices.Contains(group, u) {
			want = 1
		}
		if n != want {
			e.t.Errorf("GPU %s (index %d) reset %d times, want %d", u, e.fleet.Index(u), n, want)
		}
	}
}

// wantRestored asserts the host is back as before: persistence mode on
// exactly where it was, every service running, no inhibitor held, nothing
// owned.
func (e *gpuEnv) wantRestored(persistenceOn ...int) {
	e.t.Helper()
	for i := range e.fleet.Len() {
		if got, want := e.fleet.GPU(i).Persistence, slices.Contains(persistenceOn, i); got != want {
			e.t.Errorf("GPU %d persistence mode %v, want %v", i, got, want)
		}
	}
	e.host.mu.Lock()
	for u, on := range e.host.active {
		if !on {
			e.t.Errorf("unit %s left stopped", u)
		}
	}
	if e.host.held != 0 {
		e.t.Errorf("%d inhibitors still held", e.host.held)
	}
	e.host.mu.Unlock()
	if k := e.j.ownedKeys(); len(k) > 0 {
		e.t.Errorf("owned changes left: %v", k)
	}
}

func containsEach(t *testing.T, what string, got []string, subs ...string) {
	t.Helper()
	all := strings.Join(got, "\n")
	for _, s := range subs {
		if !strings.Contains(all, s) {
			t.Errorf("%s does not mention %q:\n%s", what, s, all)
		}
	}
}

func stepNamesOf(steps []drivers.Step) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}

var (
	gpuStepsNoDrain = []string{"check-gpus", "pause-gpu-operator", "wait-gpu-operator-pods", "stop-gpu-services", "persistence-off", "gpu-reset",
		"restore-persistence", "start-gpu-services", "wait-fabric", "verify-gpus", "restore-gpu-operator", "wait-workloads-ready"}
	gpuStepsDrain = []string{"check-gpus", "cordon", "evict", "wait-empty", "pause-gpu-operator", "wait-gpu-operator-pods", "stop-gpu-services", "persistence-off",
		"gpu-reset", "restore-persistence", "start-gpu-services", "wait-fabric", "verify-gpus", "restore-gpu-operator", "wait-workloads-ready", "uncordon"}
)

func TestGPUResetIdentity(t *testing.T) {
	var d drivers.GPUReset
	if d.Name() != "lifecycle-agent.x-k8s.io/gpu-reset" || d.Short() != "gpu-reset" ||
		d.Start() != "GPUResetStarted" || d.End() != "GPUResetComplete" || d.SLA() <= 0 {
		t.Errorf("identity: %s %s %s→%s %s", d.Name(), d.Short(), d.Start(), d.End(), d.SLA())
	}
	var _ drivers.Abortable = d
}

func TestGPUResetPlan(t *testing.T) {
	tests := []struct {
		name      string
		params    map[string]string
		wantSteps []string
		wantErr   []string // substrings; nil means success
		badParam  bool
	}{
		{name: "all", params: map[string]string{"gpus": "all"}, wantSteps: gpuStepsNoDrain},
		{name: "indices", params: map[string]string{"gpus": "0,3"}, wantSteps: gpuStepsNoDrain},
		{name: "drain plans the drain steps before any process check", params: map[string]string{"gpus": "1", "drain": "true", "gracePeriodSeconds": "30"}, wantSteps: gpuStepsDrain},
		{name: "drain=false", params: map[string]string{"gpus": "1", "drain": "false"}, wantSteps: gpuStepsNoDrain},
		{name: "gpus missing", params: map[string]string{}, badParam: true, wantErr: []string{"parameters.gpus", "required"}},
		{name: "gpus empty", params: map[string]string{"gpus": " "}, badParam: true, wantErr: []string{"parameters.gpus", "required"}},
		{name: "index out of range", params: map[string]string{"gpus": "9"}, badParam: true, wantErr: []string{"parameters.gpus", "no GPU with index 9"}},
		{name: "unknown UUID", params: map[string]string{"gpus": "GPU-00000000-0000-0000-0000-000000000000"}, badParam: true, wantErr: []string{"parameters.gpus", "no such GPU"}},
		{name: "MIG device", params: map[string]string{"gpus": "MIG-1234"}, badParam: true, wantErr: []string{"parameters.gpus", "MIG devices cannot be reset"}},
		{name: "not a number", params: map[string]string{"gpus": "first"}, badParam: true, wantErr: []string{"parameters.gpus", "not a GPU UUID"}},
		{name: "bad drain", params: map[string]string{"gpus": "0", "drain": "maybe"}, badParam: true, wantErr: []string{"parameters.drain", "not true or false"}},
		{name: "drain parameter without drain", params: map[string]string{"gpus": "0", "podSelector": "app=x"}, badParam: true, wantErr: []string{"parameters.podSelector applies only with parameters.drain=true"}},
		{name: "unknown parameter", params: map[string]string{"gpus": "0", "force": "true"}, badParam: true, wantErr: []string{`unknown parameter "force"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, devicestest.DGXH100, tc.params)
			steps, err := e.agent(devices.ResetMethodNVML).Plan(tc.params)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Plan: %v", err)
				}
				if got := stepNamesOf(steps); !slices.Equal(got, tc.wantSteps) {
					t.Errorf("steps %v, want %v", got, tc.wantSteps)
				}
				return
			}
			if err == nil {
				t.Fatalf("Plan succeeded, want an error with %q", tc.wantErr)
			}
			if tc.badParam && !errors.Is(err, drivers.ErrBadParameter) {
				t.Errorf("error %v does not wrap ErrBadParameter", err)
			}
			containsEach(t, "error", []string{err.Error()}, tc.wantErr...)
		})
	}
	t.Run("no NVML", func(t *testing.T) {
		_, err := drivers.GPUReset{}.Plan(map[string]string{"gpus": "all"})
		if err == nil || !strings.Contains(err.Error(), "no NVML") {
			t.Errorf("Plan without a manager: %v, want a no-NVML error", err)
		}
	})
}

func TestGPUResetHappyPath(t *testing.T) {
	tests := []struct {
		name      string
		model     devicestest.Model
		method    devices.ResetMethod
		gpus      string
		group     []int // GPU indices reset
		wantExtra []string
	}{
		{name: "dgxh100 nvml two GPUs", model: devicestest.DGXH100, method: devices.ResetMethodNVML, gpus: "0,1", group: []int{0, 1}},
		{name: "dgxh100 nvidia-smi two GPUs", model: devicestest.DGXH100, method: devices.ResetMethodSMI, gpus: "0,1", group: []int{0, 1}},
		{name: "dgxh100 auto picks nvidia-smi", model: devicestest.DGXH100, method: devices.ResetMethodAuto, gpus: "1,0", group: []int{0, 1}},
		{name: "dgxa100 nvml expands to the whole set", model: devicestest.DGXA100, method: devices.ResetMethodNVML, gpus: "0,1",
			group: []int{0, 1, 2, 3, 4, 5, 6, 7}, wantExtra: []string{"reset group expanded to 8", "pre-Hopper NVSwitch",
				"warning: pre-Hopper NVSwitch system: Fabric Manager must be stopped for the reset, but gpu.services does not name nvidia-fabricmanager.service"}},
		{name: "dgxa100 nvidia-smi all", model: devicestest.DGXA100, method: devices.ResetMethodSMI, gpus: "all",
			group: []int{0, 1, 2, 3, 4, 5, 6, 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, tc.model, map[string]string{"gpus": tc.gpus})
			e.fleet.Set(0, func(g *devicestest.GPU) { g.Persistence = true })
			e.fleet.Set(1, func(g *devicestest.GPU) { g.Persistence = true; g.RemappedRowsPending = true })
			d := e.agent(tc.method)
			group := e.fleet.UUIDs(tc.group...)

			crashed, err := gpuRunEvent(t, d, e.rt, gpuCrash{})
			if err != nil || crashed {
				t.Fatalf("event: crashed=%v err=%v\nprogress: %q", crashed, err, e.rt.messages())
			}
			e.wantResets(group)
			e.wantRestored(0, 1)

			// Services stopped before and started after, in reverse order;
			// the inhibitor held exactly around the reset.
			want := []string{
				"stop nvidia-dcgm.service nvidia-persistenced.service nvidia-device-plugin.service",
				"inhibit shutdown:sleep (resets so far 0)",
			}
			if tc.method != devices.ResetMethodNVML {
				bin := "nvidia-smi"
				if tc.method == devices.ResetMethodAuto {
					bin = "/usr/bin/nvidia-smi"
				}
				want = append(want, "run "+bin+" --gpu-reset -i "+strings.Join(group, ","))
			}
			want = append(want,
				fmt.Sprintf("release shutdown:sleep (resets so far %d)", len(group)),
				"start nvidia-device-plugin.service nvidia-persistenced.service nvidia-dcgm.service")
			if got := e.host.ops(); !slices.Equal(got, want) {
				t.Errorf("host operations:\n got %q\nwant %q", got, want)
			}

			// Persistence off before the reset, restored after it.
			calls := e.fleet.Calls()
			for _, i := range []int{0, 1} {
				u := e.fleet.UUID(i)
				off, reset, on := slices.Index(calls, "persistence "+u+" off"), slices.Index(calls, "reset "+u), slices.Index(calls, "persistence "+u+" on")
				if off < 0 || reset < 0 || on < 0 || off > reset || reset > on {
					t.Errorf("GPU %d: persistence off at %d, reset at %d, on at %d; want off < reset < on in %q", i, off, reset, on, calls)
				}
			}
			if got := e.fleet.GPU(1).RemappedRowsPending; got {
				t.Errorf("GPU 1 still has remapped rows pending after the reset")
			}
			containsEach(t, "progress", e.rt.messages(), append([]string{
				"preconditions met: ",
				"persistence mode on for " + e.fleet.UUID(0) + ", " + e.fleet.UUID(1),
				"stopped nvidia-dcgm.service, nvidia-persistenced.service, nvidia-device-plugin.service",
				"persistence mode turned off on " + e.fleet.UUID(0) + ", " + e.fleet.UUID(1),
				"resetting " + strings.Join(group, ", "),
				"persistence mode restored on " + e.fleet.UUID(0) + ", " + e.fleet.UUID(1),
				"started nvidia-device-plugin.service, nvidia-persistenced.service, nvidia-dcgm.service",
				fmt.Sprintf("%d GPU(s) re-resolved by UUID and healthy: %s (index %d, ", len(group), group[0], tc.group[0]),
			}, tc.wantExtra...)...)
		})
	}
}

func TestGPUResetSimulate(t *testing.T) {
	for _, model := range devicestest.Models {
		t.Run(string(model), func(t *testing.T) {
			e := newGPUEnv(t, model, map[string]string{"gpus": "0"})
			e.host.simulated = true
			e.fleet.Set(0, func(g *devicestest.GPU) { g.Persistence = true; g.RetiredPagesPending = true })
			crashed, err := gpuRunEvent(t, e.agent(devices.ResetMethodSMI), e.rt, gpuCrash{})
			if err != nil || crashed {
				t.Fatalf("event: crashed=%v err=%v", crashed, err)
			}
			e.wantResets(nil)
			e.wantRestored(0)
			if calls := e.fleet.Calls(); len(calls) > 0 {
				t.Errorf("NVML changed in simulate mode: %q", calls)
			}
			for _, s := range gpuStepsNoDrain {
				if r, _ := e.j.last(s); r.phase != "done" {
					t.Errorf("step %s not journaled done: %+v", s, r)
				}
			}
			containsEach(t, "progress", e.rt.messages(), "simulate: would turn persistence mode off on "+e.fleet.UUID(0),
				"simulate: would reset", "run nvidia-smi --gpu-reset -i "+e.fleet.UUID(0),
				"simulate: would restore persistence mode", "simulate: GPUs were not reset; health now: ", "RetiredPagesPending")
		})
	}
}

func TestGPUResetRefusals(t *testing.T) {
	pids := func(i int, pids ...uint32) func(*gpuEnv) {
		return func(e *gpuEnv) { e.fleet.Set(i, func(g *devicestest.GPU) { g.ComputePIDs = pids }) }
	}
	tests := []struct {
		name     string
		model    devicestest.Model
		params   map[string]string
		setup    func(*gpuEnv)
		onDrain  func(*gpuEnv)
		wantErr  []string // substrings of the failure; the GPU's UUID is added by index
		wantGPU  int
		wantAPI  []string
		wantHost []string
		// wantRefusal: a refusal after the host was changed (wantHost),
		// as the status reads it.
		wantRefusal string
	}{
		{name: "compute processes", model: devicestest.DGXH100, params: map[string]string{"gpus": "0,1"},
			setup:   pids(1, 4343, 4242),
			wantErr: []string{"step check-gpus failed", "processes running (compute PIDs 4242, 4343)", "set parameters.drain=true"}, wantGPU: 1},
		{name: "graphics processes on the expanded set", model: devicestest.DGXA100, params: map[string]string{"gpus": "0"},
			setup: func(e *gpuEnv) {
				e.fleet.Set(6, func(g *devicestest.GPU) { g.GraphicsPIDs = []uint32{77} })
			},
			wantErr: []string{"step check-gpus failed", "processes running (graphics PIDs 77)"}, wantGPU: 6},
		{name: "MIG enabled", model: devicestest.DGXH100, params: map[string]string{"gpus": "2"},
			setup:   func(e *gpuEnv) { e.fleet.Set(2, func(g *devicestest.GPU) { g.MIG = true }) },
			wantErr: []string{"step check-gpus failed", "MIG enabled; destroy its GPU instances and disable MIG first"}, wantGPU: 2},
		{name: "MIG enabled with drain: refused before draining", model: devicestest.DGXA100, params: map[string]string{"gpus": "all", "drain": "true"},
			setup:   func(e *gpuEnv) { e.fleet.Set(5, func(g *devicestest.GPU) { g.MIG = true }) },
			wantErr: []string{"step check-gpus failed", "MIG enabled"}, wantGPU: 5},
		{name: "processes outlive the drain", model: devicestest.DGXH100, params: map[string]string{"gpus": "3", "drain": "true"},
			setup:   pids(3, 999),
			wantErr: []string{"step stop-gpu-services failed", "processes running (compute PIDs 999)"}, wantGPU: 3,
			wantAPI: []string{"cordon", "drain", "pods-left", "uncordon"}},
		{name: "inhibitor refused", model: devicestest.DGXH100, params: map[string]string{"gpus": "0"},
			setup:   func(e *gpuEnv) { e.host.inhibitErr = errors.New("access denied") },
			wantErr: []string{"step gpu-reset failed", "taking the shutdown:sleep block inhibitor for the reset of ", "access denied"}, wantGPU: 0,
			wantHost: []string{
				"stop nvidia-dcgm.service nvidia-persistenced.service nvidia-device-plugin.service",
				"start nvidia-device-plugin.service nvidia-persistenced.service nvidia-dcgm.service",
			}},
		{name: "a process whose open files cannot be read", model: devicestest.DGXH100, params: map[string]string{"gpus": "4"},
			setup:   func(e *gpuEnv) { e.host.unreadable = []int{4711, 4712} },
			wantErr: []string{"step gpu-reset failed", "the open files of PIDs 4711, 4712 could not be read (permission denied), so whether they hold "},
			wantGPU: 4, wantRefusal: "gpu-reset refused: the open files of PIDs 4711, 4712 could not be read",
			wantHost: []string{
				"stop nvidia-dcgm.service nvidia-persistenced.service nvidia-device-plugin.service",
				"start nvidia-device-plugin.service nvidia-persistenced.service nvidia-dcgm.service",
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, tc.model, tc.params)
			e.fleet.Set(tc.wantGPU, func(g *devicestest.GPU) { g.Persistence = true })
			tc.setup(e)
			_, err := gpuRunEvent(t, e.agent(devices.ResetMethodNVML), e.rt, gpuCrash{})
			if err == nil {
				t.Fatal("event succeeded, want a refusal")
			}
			containsEach(t, "error", []string{err.Error()}, append(tc.wantErr, e.fleet.UUID(tc.wantGPU))...)
			if !errors.Is(err, devices.ErrPreconditions) && (tc.wantHost == nil || tc.wantRefusal != "") {
				t.Errorf("error %v does not wrap devices.ErrPreconditions", err)
			}
			// The refusal is in the status too.
			switch {
			case tc.wantRefusal != "":
				containsEach(t, "progress", e.rt.messages(), tc.wantRefusal)
			case tc.wantHost == nil:
				containsEach(t, "progress", e.rt.messages(), "gpu-reset refused: "+e.fleet.UUID(tc.wantGPU))
			}
			e.wantResets(nil)
			e.wantRestored(tc.wantGPU)
			if got := e.host.ops(); !slices.Equal(got, tc.wantHost) {
				t.Errorf("host operations %q, want %q", got, tc.wantHost)
			}
			if got := e.api.calls(); !slices.Equal(got, tc.wantAPI) {
				t.Errorf("API calls %q, want %q", got, tc.wantAPI)
			}
		})
	}
}

func TestGPUResetDrainFirst(t *testing.T) {
	e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": "2", "drain": "true"})
	e.fleet.Set(2, func(g *devicestest.GPU) { g.ComputePIDs = []uint32{1234} })
	// The pods are the processes: evicting them ends them.
	e.api.onDrain = func() { e.fleet.Set(2, func(g *devicestest.GPU) { g.ComputePIDs = nil }) }
	crashed, err := gpuRunEvent(t, e.agent(devices.ResetMethodNVML), e.rt, gpuCrash{})
	if err != nil || crashed {
		t.Fatalf("event: crashed=%v err=%v", crashed, err)
	}
	e.wantResets(e.fleet.UUIDs(2))
	e.wantRestored()
	if got, want := e.api.calls(), []string{"cordon", "drain", "pods-left", "uncordon"}; !slices.Equal(got, want) {
		t.Errorf("API calls %q, want %q", got, want)
	}
	containsEach(t, "progress", e.rt.messages(), "processes running now, draining first: "+e.fleet.UUID(2), "evicted 1 pods", "node uncordoned")
}

func TestGPUResetFabricWait(t *testing.T) {
	tests := []struct {
		name    string
		gpus    string // "" means "4,5"
		polls   int
		wantErr []string
	}{
		{name: "waits until completed", polls: 4},
		{name: "fabric never registers", polls: 1000, wantErr: []string{"step wait-fabric failed", "timed out waiting for fabric registration"}},
		// The whole set: the event ends only once every GPU's fabric has
		// registered again, not the first one's.
		{name: "gpus=all waits for every GPU", gpus: "all", polls: 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gpus, idx := tc.gpus, []int{4, 5}
			if gpus == "" {
				gpus = "4,5"
			} else {
				idx = []int{0, 1, 2, 3, 4, 5, 6, 7}
			}
			e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": gpus})
			e.fleet.Set(4, func(g *devicestest.GPU) { g.Persistence = true })
			e.fleet.SetAll(func(g *devicestest.GPU) { g.FabricPollsAfterReset = tc.polls })
			d := e.agent(devices.ResetMethodNVML)

			type result struct {
				crashed bool
				err     error
			}
			done := make(chan result, 1)
			go func() {
				c, err := gpuRunEvent(t, d, e.rt, gpuCrash{})
				done <- result{c, err}
			}()
			// Drive the injected clock while the step waits on it.
			timeout := time.After(30 * time.Second)
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var res result
		wait:
			for {
				select {
				case res = <-done:
					break wait
				case <-timeout:
					t.Fatal("event did not finish")
				case <-tick.C:
					if e.clk.HasWaiters() {
						e.clk.Step(time.Second)
					}
				}
			}
			if res.crashed {
				t.Fatal("crashed")
			}
			e.wantResets(e.fleet.UUIDs(idx...))
			e.wantRestored(4)
			if tc.wantErr != nil {
				if res.err == nil {
					t.Fatal("event succeeded, want a fabric timeout")
				}
				containsEach(t, "error", []string{res.err.Error()}, append(tc.wantErr, e.fleet.UUID(4))...)
				if !errors.Is(res.err, devices.ErrFabricTimeout) {
					t.Errorf("error %v does not wrap ErrFabricTimeout", res.err)
				}
				return
			}
			if res.err != nil {
				t.Fatalf("event: %v", res.err)
			}
			for _, i := range idx {
				if st := e.fleet.GPU(i).FabricState; st != devices.FabricCompleted {
					t.Errorf("GPU %d fabric %s, want COMPLETED", i, st)
				}
			}
			if waited := e.clk.Since(gpuEpoch); waited < time.Duration(tc.polls-1)*time.Second {
				t.Errorf("clock advanced %s; the fabric needed %d polls", waited, tc.polls)
			}
			containsEach(t, "progress", e.rt.messages(), fmt.Sprintf("NVSwitch system: waiting for fabric registration of %d GPU(s)", len(idx)),
				fmt.Sprintf("fabric registration completed on %d GPU(s)", len(idx)))
		})
	}
}

func TestGPUResetFailedReset(t *testing.T) {
	tests := []struct {
		name    string
		model   devicestest.Model
		method  devices.ResetMethod
		gpus    string
		fail    int
		wantErr []string
	}{
		{name: "dgxh100 nvml", model: devicestest.DGXH100, method: devices.ResetMethodNVML, gpus: "0,1", fail: 1,
			wantErr: []string{"DeviceRemoveGpu_v2: ERROR_IN_USE"}},
		{name: "dgxh100 nvidia-smi", model: devicestest.DGXH100, method: devices.ResetMethodSMI, gpus: "0,1", fail: 1,
			wantErr: []string{"nvidia-smi --gpu-reset -i", "In use by another client"}},
		{name: "dgxa100 nvml", model: devicestest.DGXA100, method: devices.ResetMethodNVML, gpus: "3", fail: 3,
			wantErr: []string{"DeviceRemoveGpu_v2: ERROR_IN_USE"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, tc.model, map[string]string{"gpus": tc.gpus})
			e.fleet.Set(0, func(g *devicestest.GPU) { g.Persistence = true })
			e.fleet.Set(tc.fail, func(g *devicestest.GPU) { g.FailReset = true })
			_, err := gpuRunEvent(t, e.agent(tc.method), e.rt, gpuCrash{})
			if err == nil {
				t.Fatal("event succeeded, want the reset error")
			}
			containsEach(t, "error", []string{err.Error()}, append(tc.wantErr, "step gpu-reset failed", e.fleet.UUID(tc.fail))...)
			// Abort: services restarted, persistence restored, inhibitor
			// released, nothing left owned; no GPU reset twice.
			e.wantRestored(0)
			ops := e.host.ops()
			if last := ops[len(ops)-1]; last != "start nvidia-device-plugin.service nvidia-persistenced.service nvidia-dcgm.service" {
				t.Errorf("last host operation %q, want the services started (all: %q)", last, ops)
			}
			for u, n := range e.fleet.Resets() {
				if n > 1 {
					t.Errorf("GPU %s reset %d times", u, n)
				}
			}
			if n := e.fleet.GPU(tc.fail).Resets; n != 0 {
				t.Errorf("failing GPU reset %d times", n)
			}
			containsEach(t, "progress", e.rt.messages(), "abort: persistence mode restored on "+e.fleet.UUID(0), "abort: started nvidia-device-plugin.service")
		})
	}
}

// TestGPUResetCrashResumes kills the agent at every crash boundary — each
// step boundary and each failpoint — then restarts it (a new Manager and
// driver over the same hardware and journal) and replays: every GPU of the
// group is reset exactly once and the host ends as it started.
func TestGPUResetCrashResumes(t *testing.T) {
	type setup struct {
		model  devicestest.Model
		method devices.ResetMethod
		gpus   string
		group  []int
	}
	setups := []setup{
		{model: devicestest.DGXH100, method: devices.ResetMethodNVML, gpus: "0,2", group: []int{0, 2}},
		{model: devicestest.DGXH100, method: devices.ResetMethodSMI, gpus: "2", group: []int{2}},
		{model: devicestest.DGXA100, method: devices.ResetMethodNVML, gpus: "0", group: []int{0, 1, 2, 3, 4, 5, 6, 7}},
	}
	var crashes []gpuCrash
	for _, s := range gpuStepsNoDrain {
		crashes = append(crashes, gpuCrash{step: s}, gpuCrash{step: s, afterRun: true})
	}
	for _, fp := range drivers.GPUResetFailpoints {
		crashes = append(crashes, gpuCrash{failpoint: fp})
	}
	for _, s := range setups {
		for _, c := range crashes {
			t.Run(fmt.Sprintf("%s %s %s", s.model, s.method, c), func(t *testing.T) {
				e := newGPUEnv(t, s.model, map[string]string{"gpus": s.gpus})
				e.fleet.Set(0, func(g *devicestest.GPU) { g.Persistence = true })
				e.fleet.Set(2, func(g *devicestest.GPU) { g.Persistence = true; g.RetiredPagesPending = true })

				d := e.agent(s.method)
				fired := false
				d.Failpoint = func(name string) error {
					if name == c.failpoint && !fired {
						fired = true
						return errGPUCrash
					}
					return nil
				}
				crashed, err := gpuRunEvent(t, d, e.rt, c)
				if err != nil || !crashed {
					t.Fatalf("first run: crashed=%v err=%v, want a crash", crashed, err)
				}

				// Restart: new process, same hardware and journal.
				crashed, err = gpuRunEvent(t, e.agent(s.method), e.rt, gpuCrash{})
				if err != nil || crashed {
					t.Fatalf("replay: crashed=%v err=%v\nprogress: %q", crashed, err, e.rt.messages())
				}
				e.wantResets(e.fleet.UUIDs(s.group...))
				e.wantRestored(0, 2)
				for _, st := range gpuStepsNoDrain {
					if r, _ := e.j.last(st); r.phase != "done" {
						t.Errorf("step %s ends %q, want done", st, r.phase)
					}
				}
			})
		}
	}
}

func TestGPUResetDoneCheck(t *testing.T) {
	tests := []struct {
		name         string
		intentBootID string
		issued       bool
		want         bool
		wantProgress string
	}{
		{name: "intent only: the reset never started", intentBootID: "boot-1", want: false},
		{name: "issued: maybe reset, never again", intentBootID: "boot-1", issued: true, want: true, wantProgress: "not resetting again: the health check decides"},
		{name: "rebooted since the intent", intentBootID: "boot-0", want: true, wantProgress: "boot ID changed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, devicestest.DGXH100, map[string]string{"gpus": "0"})
			d := e.agent(devices.ResetMethodNVML)
			resolved, err := d.Resolve(context.Background(), e.rt.params)
			if err != nil {
				t.Fatal(err)
			}
			e.rt.params = resolved
			steps, err := d.Plan(e.rt.params)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(steps, func(s drivers.Step) bool { return s.Name == "gpu-reset" })
			if i < 0 || steps[i].Done == nil || !steps[i].Disruptive {
				t.Fatalf("gpu-reset step missing, without Done, or not disruptive")
			}
			if tc.issued {
				// The reset step records this right before the Resetter call.
				d.Failpoint = func(name string) error {
					if name == drivers.FailpointGPUResetBeforeRelease {
						return errGPUCrash
					}
					return nil
				}
				steps, _ := d.Plan(e.rt.params)
				for _, s := range steps[:i+1] {
					if err := s.Run(context.Background(), e.rt); err != nil && !errors.Is(err, errGPUCrash) {
						t.Fatalf("step %s: %v", s.Name, err)
					}
				}
			}
			got, err := steps[i].Done(context.Background(), e.rt, tc.intentBootID)
			if err != nil || got != tc.want {
				t.Errorf("Done = %v, %v; want %v", got, err, tc.want)
			}
			if tc.wantProgress != "" {
				containsEach(t, "progress", e.rt.messages(), tc.wantProgress)
			}
		})
	}
}

func TestGPUResetCheck(t *testing.T) {
	tests := []struct {
		name         string
		model        devicestest.Model
		method       devices.ResetMethod
		params       map[string]string
		setup        func(*devicestest.Fleet)
		wantGroup    int
		wantResetter string
		wantBlockers []string
		wantErr      string
	}{
		{name: "dgxh100 nvidia-smi", model: devicestest.DGXH100, method: devices.ResetMethodSMI, params: map[string]string{"gpus": "1"},
			wantGroup: 1, wantResetter: "run nvidia-smi --gpu-reset -i "},
		{name: "dgxa100 nvml expanded", model: devicestest.DGXA100, method: devices.ResetMethodNVML, params: map[string]string{"gpus": "1"},
			wantGroup: 8, wantResetter: "NVML reset of "},
		{name: "processes and MIG", model: devicestest.DGXH100, method: devices.ResetMethodAuto, params: map[string]string{"gpus": "all", "drain": "true"},
			setup: func(f *devicestest.Fleet) {
				f.Set(3, func(g *devicestest.GPU) { g.ComputePIDs = []uint32{31} })
				f.Set(4, func(g *devicestest.GPU) { g.MIG = true })
			},
			wantGroup: 8, wantResetter: "run /usr/bin/nvidia-smi --gpu-reset -i ",
			wantBlockers: []string{"processes running (compute PIDs 31)", "MIG enabled"}},
		{name: "bad parameter", model: devicestest.DGXH100, params: map[string]string{"gpus": "0,GPU-x"}, wantErr: "parameters.gpus"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newGPUEnv(t, tc.model, tc.params)
			e.fleet.Set(0, func(g *devicestest.GPU) { g.Persistence = true })
			if tc.setup != nil {
				tc.setup(e.fleet)
			}
			c, err := e.agent(tc.method).Check(tc.params)
			if tc.wantErr != "" {
				if !errors.Is(err, drivers.ErrBadParameter) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Check: %v, want a bad parameter naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if len(c.Group.UUIDs) != tc.wantGroup || !strings.HasPrefix(c.Resetter, tc.wantResetter) {
				t.Errorf("group %d GPUs, resetter %q; want %d, %q…", len(c.Group.UUIDs), c.Resetter, tc.wantGroup, tc.wantResetter)
			}
			if !slices.Equal(c.Services, gpuServices) || len(c.Steps) == 0 || len(c.Fabric) != tc.wantGroup {
				t.Errorf("services %q, steps %q, fabric %v", c.Services, c.Steps, c.Fabric)
			}
			if slices.Contains(c.Group.UUIDs, e.fleet.UUID(0)) && !slices.Equal(c.PersistenceOn, e.fleet.UUIDs(0)) {
				t.Errorf("persistence on %q, want GPU 0", c.PersistenceOn)
			}
			containsEach(t, "blockers", c.Blockers, tc.wantBlockers...)
			if len(tc.wantBlockers) == 0 && len(c.Blockers) > 0 {
				t.Errorf("blockers %q, want none", c.Blockers)
			}
			// A dry run changes nothing.
			if calls := e.fleet.Calls(); len(calls) > 0 {
				t.Errorf("Check changed NVML state: %q", calls)
			}
			if ops := e.host.ops(); len(ops) > 0 {
				t.Errorf("Check touched the host: %q", ops)
			}
		})
	}
}

// GetNode and NodePods: nothing allocatable, no pods: the readiness
// checks find nothing missing (tested on the real API server in test/e2e).
func (a *gpuAPI) GetNode(context.Context) (*corev1.Node, error) { return &corev1.Node{}, nil }

func (a *gpuAPI) NodePods(context.Context) ([]corev1.Pod, error) { return nil, nil }
