package gpuhealth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
)

var epoch = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

const (
	testNode = "gpu-node-1"
	testBoot = "5e4d3c2b-1a09-4f8e-9d7c-6b5a4f3e2d1c"
)

// metav1.Condition's reason pattern: our False reason must satisfy it.
var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// sink records the conditions written.
type sink struct {
	mu    sync.Mutex
	got   []apiclient.NodeCondition
	times []time.Time
	fail  error
	ch    chan apiclient.NodeCondition
}

func newSink() *sink { return &sink{ch: make(chan apiclient.NodeCondition, 64)} }

func (s *sink) SetNodeConditions(_ context.Context, now time.Time, conds ...apiclient.NodeCondition) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	for _, c := range conds {
		if !reasonPattern.MatchString(c.Reason) {
			return fmt.Errorf("condition %s: invalid reason %q", c.Type, c.Reason) // as the API server's validation
		}
	}
	s.got = append(s.got, conds...)
	s.times = append(s.times, now)
	for _, c := range conds {
		if c.Type == devices.ConditionType {
			s.ch <- c
		}
	}
	return nil
}

// all is every GPUHealthy condition written, in order.
func (s *sink) all() []apiclient.NodeCondition { return s.ofType(devices.ConditionType) }

// ofType is every condition of that type written, in order.
func (s *sink) ofType(typ string) []apiclient.NodeCondition {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []apiclient.NodeCondition
	for _, c := range s.got {
		if c.Type == typ {
			out = append(out, c)
		}
	}
	return out
}

func (s *sink) setFail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = err
}

// next waits for the next written condition.
func (s *sink) next(t *testing.T) apiclient.NodeCondition {
	t.Helper()
	select {
	case c := <-s.ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no condition written")
		return apiclient.NodeCondition{}
	}
}

// creator records CreateEvent calls.
type creator struct {
	mu   sync.Mutex
	evs  []*v1alpha1.LifecycleEvent
	errs []error // returned by successive calls; past the end: nil
}

func (c *creator) create(_ context.Context, ev *v1alpha1.LifecycleEvent) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evs = append(c.evs, ev.DeepCopy())
	if len(c.errs) > 0 {
		err := c.errs[0]
		c.errs = c.errs[1:]
		return err
	}
	return nil
}

func (c *creator) calls() []*v1alpha1.LifecycleEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*v1alpha1.LifecycleEvent(nil), c.evs...)
}

// devs wraps a Manager to inject failures and count watchers.
type devs struct {
	*devices.Manager
	mu          sync.Mutex
	snapshotErr error
	watchErrs   []error
	watches     int
}

func (d *devs) Snapshot() (devices.Snapshot, error) {
	d.mu.Lock()
	err := d.snapshotErr
	d.mu.Unlock()
	if err != nil {
		return devices.Snapshot{}, err
	}
	return d.Manager.Snapshot()
}

func (d *devs) WatchEvents(ctx context.Context, uuids []string) (<-chan devices.Event, error) {
	d.mu.Lock()
	d.watches++
	var err error
	if len(d.watchErrs) > 0 {
		err, d.watchErrs = d.watchErrs[0], d.watchErrs[1:]
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return d.Manager.WatchEvents(ctx, uuids)
}

func (d *devs) watchCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.watches
}

type env struct {
	fleet *devicestest.Fleet
	devs  *devs
	sink  *sink
	cr    *creator
	clk   *clocktesting.FakeClock
	reg   *prometheus.Registry
	mon   *Monitor
}

func newEnv(t *testing.T, model devicestest.Model, mods ...func(*Config)) *env {
	t.Helper()
	f := devicestest.New(model)
	f.StableUUIDs() // a second env of the model is the same node restarted (TestBaseline)
	clk := clocktesting.NewFakeClock(epoch)
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	m, err := f.Manager(devicestest.Options{Clock: clk, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Shutdown(); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	e := &env{fleet: f, devs: &devs{Manager: m}, sink: newSink(), cr: &creator{}, clk: clk, reg: prometheus.NewRegistry()}
	cfg := Config{Node: testNode, Devices: e.devs, Conditions: e.sink, Registerer: e.reg, Clock: clk, Log: log,
		Interval: time.Minute, CreateEvent: e.cr.create, BootID: testBoot}
	for _, mod := range mods {
		mod(&cfg)
	}
	e.mon, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// metric returns the value of the series with these labels, and whether
// it exists.
func (e *env) metric(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue(), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

func (e *env) labels(i int) map[string]string {
	return map[string]string{"gpu": e.fleet.UUID(i), "index": fmt.Sprint(i)}
}

func TestNodeCondition(t *testing.T) {
	unhealthy := func(gpus ...devices.GPUHealth) devices.HealthReport {
		return devices.HealthReport{GPUs: gpus, Condition: devices.Condition{Type: devices.ConditionType,
			Status: devices.ConditionFalse, Reason: devices.ReasonGPUUnhealthy, Message: "some GPUs unhealthy"}}
	}
	var many []devices.GPUHealth
	for i := range 64 {
		many = append(many, devices.GPUHealth{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Reasons: []string{devices.SignalRemappedRowsPending, "XID 79"}})
	}
	tests := []struct {
		name       string
		report     devices.HealthReport
		wantStatus corev1.ConditionStatus
		wantReason string
	}{
		{name: "healthy", report: devices.HealthReport{Condition: devices.Condition{Status: devices.ConditionTrue, Reason: devices.ReasonAllHealthy, Message: "8 GPUs healthy"}},
			wantStatus: corev1.ConditionTrue, wantReason: "AllHealthy"},
		{name: "NVML error", report: devices.HealthReport{Condition: devices.Condition{Status: devices.ConditionUnknown, Reason: devices.ReasonNVMLError, Message: "x"}},
			wantStatus: corev1.ConditionUnknown, wantReason: "NVMLError"},
		{name: "names GPUs and signals", report: unhealthy(
			devices.GPUHealth{Index: 3, UUID: "GPU-a", Reasons: []string{"XID 79"}},
			devices.GPUHealth{Index: 4, UUID: "GPU-b", Healthy: true},
			devices.GPUHealth{Index: 5, UUID: "GPU-c", Reasons: []string{devices.SignalRemappedRowsPending, "RecoveryAction=GPU_RESET"}},
			devices.GPUHealth{Index: 6, Reasons: []string{devices.SignalGPULost}},
		), wantStatus: corev1.ConditionFalse, wantReason: "GPU3:XID79,GPU5:RemappedRowsPending,GPU5:RecoveryAction_GPU_RESET,GPU6:GPULost"},
		{name: "capped", report: unhealthy(many...), wantStatus: corev1.ConditionFalse},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NodeCondition(tc.report)
			if c.Type != "GPUHealthy" || c.Status != tc.wantStatus || c.Message != tc.report.Condition.Message {
				t.Errorf("condition %+v", c)
			}
			if tc.wantReason != "" && c.Reason != tc.wantReason {
				t.Errorf("reason %q, want %q", c.Reason, tc.wantReason)
			}
			if !reasonPattern.MatchString(c.Reason) || len(c.Reason) > MaxReasonLength {
				t.Errorf("reason %q (%d bytes) is not a valid condition reason", c.Reason, len(c.Reason))
			}
			if tc.name == "capped" && (!strings.HasPrefix(c.Reason, "GPU0:RemappedRowsPending,GPU0:XID79,GPU1:") || !strings.HasSuffix(c.Reason, ",More")) {
				t.Errorf("capped reason %q", c.Reason)
			}
		})
	}
}

func TestCheckPublishesOnlyChanges(t *testing.T) {
	tests := []struct {
		name        string
		model       devicestest.Model
		gpu         int
		breakIt     func(*devicestest.GPU)
		wantReason  string
		wantMetrics map[string]float64
	}{
		{name: "dgxh100 remapped rows", model: devicestest.DGXH100, gpu: 5,
			breakIt:     func(g *devicestest.GPU) { g.RemappedRowsPending = true },
			wantReason:  "GPU5:RemappedRowsPending",
			wantMetrics: map[string]float64{"lifecycle_agent_gpu_healthy": 0, "lifecycle_agent_gpu_remapped_rows_pending": 1, "lifecycle_agent_gpu_retired_pages_pending": 0}},
		{name: "dgxa100 retired pages and ECC", model: devicestest.DGXA100, gpu: 2,
			breakIt:     func(g *devicestest.GPU) { g.RetiredPagesPending = true; g.ECCVolatileUncorrected = 3 },
			wantReason:  "GPU2:RetiredPagesPending,GPU2:UncorrectableECC",
			wantMetrics: map[string]float64{"lifecycle_agent_gpu_healthy": 0, "lifecycle_agent_gpu_retired_pages_pending": 1, "lifecycle_agent_gpu_ecc_volatile_uncorrected": 3}},
		{name: "dgxh100 fabric lost", model: devicestest.DGXH100, gpu: 7,
			breakIt:    func(g *devicestest.GPU) { g.FabricState = devices.FabricInProgress },
			wantReason: "GPU7:FabricNotCompleted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.model)
			ctx := context.Background()
			for range 3 {
				e.mon.Check(ctx)
			}
			got := e.sink.all()
			if len(got) != 1 || got[0].Status != corev1.ConditionTrue || got[0].Reason != "AllHealthy" || !strings.HasPrefix(got[0].Message, "8 GPUs healthy") {
				t.Fatalf("after 3 healthy checks: %+v, want one True/AllHealthy", got)
			}
			if v, ok := e.metric(t, "lifecycle_agent_gpu_healthy", e.labels(tc.gpu)); !ok || v != 1 {
				t.Errorf("healthy gauge %v (present %v), want 1", v, ok)
			}

			e.fleet.Set(tc.gpu, tc.breakIt)
			e.mon.Check(ctx)
			e.mon.Check(ctx)
			got = e.sink.all()
			if len(got) != 2 {
				t.Fatalf("conditions %+v, want a second one", got)
			}
			c := got[1]
			if c.Status != corev1.ConditionFalse || c.Reason != tc.wantReason || !strings.Contains(c.Message, e.fleet.UUID(tc.gpu)) {
				t.Errorf("condition %+v, want False/%s naming %s", c, tc.wantReason, e.fleet.UUID(tc.gpu))
			}
			for name, want := range tc.wantMetrics {
				if v, ok := e.metric(t, name, e.labels(tc.gpu)); !ok || v != want {
					t.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
				}
			}
			if v, _ := e.metric(t, "lifecycle_agent_gpu_healthy", e.labels((tc.gpu+1)%8)); v != 1 {
				t.Errorf("other GPU healthy gauge %v, want 1", v)
			}

			// Back to healthy: one more write.
			e.fleet.SetAll(func(g *devicestest.GPU) {
				*g = devicestest.GPU{RecoveryAction: devices.RecoveryActionNone, FabricState: g.FabricState}
				if tc.model == devicestest.DGXH100 {
					g.FabricState = devices.FabricCompleted
				}
			})
			e.mon.Check(ctx)
			if got = e.sink.all(); len(got) != 3 || got[2].Status != corev1.ConditionTrue {
				t.Errorf("conditions %+v, want True again", got)
			}
		})
	}
}

func TestCheckRetriesFailedWrite(t *testing.T) {
	e := newEnv(t, devicestest.DGXH100)
	e.sink.setFail(errors.New("apiserver unreachable"))
	e.mon.Check(context.Background())
	e.mon.Check(context.Background())
	if got := e.sink.all(); len(got) != 0 {
		t.Fatalf("written while failing: %+v", got)
	}
	e.sink.setFail(nil)
	e.mon.Check(context.Background())
	e.mon.Check(context.Background())
	if got := e.sink.all(); len(got) != 1 || got[0].Reason != "AllHealthy" {
		t.Errorf("after recovery %+v, want one AllHealthy", got)
	}
}

func TestCheckNVMLError(t *testing.T) {
	e := newEnv(t, devicestest.DGXA100)
	e.mon.Check(context.Background())
	if _, ok := e.metric(t, "lifecycle_agent_gpu_healthy", e.labels(0)); !ok {
		t.Fatal("no healthy gauge after a good read")
	}
	e.devs.mu.Lock()
	e.devs.snapshotErr = errors.New("devices: DeviceGetCount: ERROR_UNKNOWN")
	e.devs.mu.Unlock()
	// One failed read is debounced: nothing written, the last report kept.
	if rep := e.mon.Check(context.Background()); rep.Condition.Status != devices.ConditionTrue || len(e.sink.all()) != 1 {
		t.Errorf("after one failed read: report %+v, conditions %+v; want both unchanged", rep.Condition, e.sink.all())
	}
	rep := e.mon.Check(context.Background())
	got := e.sink.all()
	if len(got) != 2 || got[1].Status != corev1.ConditionUnknown || got[1].Reason != "NVMLError" || !strings.Contains(got[1].Message, "ERROR_UNKNOWN") {
		t.Errorf("conditions %+v, want Unknown/NVMLError with the error", got)
	}
	if rep.Condition.Status != devices.ConditionUnknown {
		t.Errorf("report %+v", rep.Condition)
	}
	if _, ok := e.metric(t, "lifecycle_agent_gpu_healthy", e.labels(0)); ok {
		t.Error("gauges kept while NVML cannot be read")
	}
}

// TestCheckReopensAfterDriverReload: the driver under the monitor's NVML
// session is replaced (the GPU Operator's driver pod restarted with another
// version): the monitor opens a new session and reads on, without a restart
// and without an Unknown; while the driver is not loaded it reports Unknown
// naming both errors, and recovers at the next evaluation once it is.
func TestCheckReopensAfterDriverReload(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, devicestest.DGXH100)
	if rep := e.mon.Check(ctx); rep.Condition.Status != devices.ConditionTrue {
		t.Fatalf("first reading: %+v", rep.Condition)
	}
	e.fleet.DriverReload(nvml.ERROR_LIB_RM_VERSION_MISMATCH)
	for range ReadFailuresBeforeUnknown {
		if rep := e.mon.Check(ctx); rep.Condition.Status != devices.ConditionTrue {
			t.Fatalf("after a driver reload: %+v, want a new session and True", rep.Condition)
		}
	}
	if got := e.sink.all(); len(got) != 1 {
		t.Errorf("conditions written %+v, want only the first True", got)
	}
	if !e.fleet.SessionOpen() {
		t.Error("no NVML session open after the reload")
	}

	e.fleet.FailInit(nvml.ERROR_DRIVER_NOT_LOADED) // unloaded, the new one not loaded yet
	e.fleet.DriverReload(nvml.ERROR_DRIVER_NOT_LOADED)
	for range ReadFailuresBeforeUnknown {
		e.mon.Check(ctx)
	}
	got := e.sink.all()
	if last := got[len(got)-1]; last.Status != corev1.ConditionUnknown || !strings.Contains(last.Message, "ERROR_DRIVER_NOT_LOADED") ||
		!strings.Contains(last.Message, "opening a new NVML session") {
		t.Fatalf("while the driver is not loaded: %+v, want Unknown naming the read and the reopen", last)
	}
	e.fleet.FailInit(nvml.SUCCESS)
	if rep := e.mon.Check(ctx); rep.Condition.Status != devices.ConditionTrue {
		t.Fatalf("once the driver is back: %+v, want True without a restart", rep.Condition)
	}
	if got := e.sink.all(); got[len(got)-1].Status != corev1.ConditionTrue {
		t.Errorf("last condition written %+v, want True", got[len(got)-1])
	}
}

// TestRunTicksAndEvents drives Run with the injected clock: a change is
// seen at the next tick; an XID is seen at once, without a tick.
func TestRunTicksAndEvents(t *testing.T) {
	e := newEnv(t, devicestest.DGXH100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.mon.Run(ctx) }()

	if c := e.sink.next(t); c.Reason != "AllHealthy" {
		t.Fatalf("first condition %+v", c)
	}
	// A change waits for the tick.
	e.fleet.Set(2, func(g *devicestest.GPU) { g.ECCVolatileUncorrected = 1 })
	waitWaiters(t, e.clk)
	e.clk.Step(time.Minute)
	if c := e.sink.next(t); c.Reason != "GPU2:UncorrectableECC" {
		t.Fatalf("after the tick %+v", c)
	}

	// An application XID is ignored; a critical XID is seen at once.
	waitFor(t, "the watcher", func() bool { live, _ := e.fleet.EventSets(); return live == 1 })
	e.fleet.InjectXID(4, 13)
	e.fleet.InjectXID(4, 79)
	c := e.sink.next(t)
	if c.Reason != "GPU2:UncorrectableECC,GPU4:XID79" || !strings.Contains(c.Message, e.fleet.UUID(4)+" (index 4): XID 79") {
		t.Fatalf("after the XID %+v", c)
	}
	if e.clk.Since(epoch) != time.Minute {
		t.Errorf("clock at %s: the XID was not seen without a tick", e.clk.Since(epoch))
	}
	if v, ok := e.metric(t, "lifecycle_agent_gpu_xid_events_total", map[string]string{"gpu": e.fleet.UUID(4), "xid": "79"}); !ok || v != 1 {
		t.Errorf("xid counter %v (present %v), want 1", v, ok)
	}
	if _, ok := e.metric(t, "lifecycle_agent_gpu_xid_events_total", map[string]string{"xid": "13"}); ok {
		t.Error("application XID 13 counted")
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunRestartsWatcher(t *testing.T) {
	e := newEnv(t, devicestest.DGXH100)
	e.devs.watchErrs = []error{errors.New("devices: EventSetCreate: ERROR_UNKNOWN")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.mon.Run(ctx) }()
	e.sink.next(t)
	if n := e.devs.watchCount(); n != 1 {
		t.Fatalf("watch attempts %d, want 1", n)
	}
	// The failed watcher is started again at the next tick.
	waitWaiters(t, e.clk)
	e.clk.Step(time.Minute)
	waitFor(t, "second watch", func() bool { return e.devs.watchCount() == 2 })
	// Rewatch (after a GPU reset) starts a new one at once.
	e.mon.Rewatch()
	waitFor(t, "the new watcher in place of the old", func() bool {
		live, created := e.fleet.EventSets()
		return e.devs.watchCount() == 3 && live == 1 && created == 2
	})
	e.fleet.InjectXID(1, 48)
	if c := e.sink.next(t); c.Reason != "GPU1:XID48" {
		t.Errorf("after the XID on the new watcher %+v", c)
	}
	cancel()
	<-done
}

func TestAutoRemediate(t *testing.T) {
	conflict := apierrors.NewAlreadyExists(schema.GroupResource{Group: "lifecycle.x-k8s.io", Resource: "lifecycleevents"}, "x")
	tests := []struct {
		name      string
		auto      bool
		action    devices.RecoveryAction
		errs      []error
		checks    int
		wantCalls int
		wantDrain bool
	}{
		{name: "off by default: only reported", auto: false, action: devices.RecoveryActionGPUReset, checks: 2, wantCalls: 0},
		{name: "GPU_RESET requests one event", auto: true, action: devices.RecoveryActionGPUReset, checks: 3, wantCalls: 1},
		{name: "DRAIN_AND_RESET drains first", auto: true, action: devices.RecoveryActionDrainAndReset, checks: 2, wantCalls: 1, wantDrain: true},
		{name: "already requested in this boot", auto: true, action: devices.RecoveryActionGPUReset, errs: []error{conflict}, checks: 3, wantCalls: 1},
		{name: "failed request retried", auto: true, action: devices.RecoveryActionGPUReset, errs: []error{errors.New("connection refused")}, checks: 3, wantCalls: 2},
		{name: "NODE_REBOOT is not a reset", auto: true, action: devices.RecoveryActionNodeReboot, checks: 2, wantCalls: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, devicestest.DGXH100, func(c *Config) { c.AutoRemediate = tc.auto })
			e.cr.errs = tc.errs
			e.fleet.Set(3, func(g *devicestest.GPU) { g.RecoveryAction = tc.action })
			for range tc.checks {
				e.mon.Check(context.Background())
			}
			calls := e.cr.calls()
			if len(calls) != tc.wantCalls {
				t.Fatalf("CreateEvent called %d times, want %d", len(calls), tc.wantCalls)
			}
			if c := e.sink.all(); len(c) != 1 || !strings.Contains(c[0].Reason, "GPU3:RecoveryAction_") {
				t.Errorf("condition %+v, want the recovery action reported", c)
			}
			if tc.wantCalls == 0 {
				return
			}
			ev := calls[0]
			uuid := e.fleet.UUID(3)
			wantName := testNode + "-gpu-reset-" + strings.ToLower(strings.ReplaceAll(uuid[4:], "-", ""))[:8] + "-5e4d3c2b"
			if ev.Name != wantName || ev.Spec.BindingNode != testNode || ev.Spec.TransitionName != testNode+"-gpu-reset" ||
				ev.Spec.Parameters["gpus"] != uuid || (ev.Spec.Parameters["drain"] == "true") != tc.wantDrain ||
				ev.Labels[LabelRequestedBy] != RequestedBy {
				t.Errorf("event %s %+v labels %v, want name %s for %s", ev.Name, ev.Spec, ev.Labels, wantName, uuid)
			}
		})
	}
}

// Released: each evaluation hands the GPUs that ask for no reset to the
// agent's Requester (so a request whose need went away is forgotten), and
// never a GPU that asks for one; not at all without AutoRemediate.
func TestAutoRemediateReleased(t *testing.T) {
	for _, auto := range []bool{true, false} {
		var released []string
		e := newEnv(t, devicestest.DGXH100, func(c *Config) {
			c.AutoRemediate = auto
			c.Released = func(_ context.Context, uuid string) { released = append(released, uuid) }
		})
		e.fleet.Set(3, func(g *devicestest.GPU) { g.RecoveryAction = devices.RecoveryActionGPUReset })
		e.mon.Check(context.Background())
		if !auto {
			if len(released) != 0 {
				t.Fatalf("Released called %v without AutoRemediate", released)
			}
			continue
		}
		if len(released) != 7 || slices.Contains(released, e.fleet.UUID(3)) {
			t.Fatalf("Released %v, want the 7 GPUs other than GPU3 (%s)", released, e.fleet.UUID(3))
		}
	}
}

func TestEventName(t *testing.T) {
	if got := EventName("n1", "GPU-ABCDEF12-3456-7890-abcd-ef1234567890", "0123-4567-89ab"); got != "n1-gpu-reset-abcdef12-01234567" {
		t.Errorf("EventName = %q", got)
	}
	long := strings.Repeat("a", 250)
	if got := EventName(long, "GPU-abcdef12-0000", "deadbeefcafe"); len(got) > 253 || !strings.HasSuffix(got, "-gpu-reset-abcdef12-deadbeef") {
		t.Errorf("EventName of a long node = %q (%d)", got, len(got))
	}
}

func TestNewValidates(t *testing.T) {
	_, err := New(Config{AutoRemediate: true})
	for _, want := range []string{"Node is required", "Devices is required", "Conditions is required", "AutoRemediate needs CreateEvent and BootID"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New error %v, want %q", err, want)
		}
	}
}

func waitWaiters(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	waitFor(t, "the loop to wait on the clock", clk.HasWaiters)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// The GPUs' needs (issue 15.1): a reset, a replacement and a reboot, each
// from what the driver reports, each set and cleared as it comes and goes,
// written only when it changed, as conditions, per-GPU gauges and the
// reboot cause handed to internal/needs; an unreadable NVML makes the
// conditions Unknown and leaves the reboot cause alone.
func TestNeeds(t *testing.T) {
	var mu sync.Mutex
	var causes []string
	e := newEnv(t, devicestest.DGXH100, func(c *Config) {
		c.RebootNeed = func(_ context.Context, cause string) {
			mu.Lock()
			defer mu.Unlock()
			causes = append(causes, cause)
		}
	})
	ctx := context.Background()
	rebootCauses := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), causes...)
	}
	cond := func(typ string) apiclient.NodeCondition {
		t.Helper()
		got := e.sink.ofType(typ)
		if len(got) == 0 {
			t.Fatalf("no %s written", typ)
		}
		return got[len(got)-1]
	}
	e.mon.Check(ctx)
	e.mon.Check(ctx)
	for _, typ := range []string{v1alpha1.NodeConditionGPUResetRequired, v1alpha1.NodeConditionGPUReplacementRequired} {
		if got := e.sink.ofType(typ); len(got) != 1 || got[0].Status != corev1.ConditionFalse || got[0].Reason != ReasonNotRequired || !strings.Contains(got[0].Message, "(8 GPUs)") {
			t.Errorf("%s after two healthy checks: %+v, want one False/NotRequired", typ, got)
		}
	}
	if got := rebootCauses(); len(got) != 1 || got[0] != "" {
		t.Errorf("reboot causes %q, want one empty (the first evaluation)", got)
	}

	e.fleet.Set(3, func(g *devicestest.GPU) { g.RecoveryAction = devices.RecoveryActionGPUReset })
	e.fleet.Set(4, func(g *devicestest.GPU) { g.RemappedRowsPending = true })
	e.fleet.Set(5, func(g *devicestest.GPU) { g.RemappedRowsFailure = true })
	e.fleet.Set(6, func(g *devicestest.GPU) { g.RecoveryAction = devices.RecoveryActionNodeReboot })
	e.mon.Check(ctx)
	e.mon.Check(ctx)
	c := cond(v1alpha1.NodeConditionGPUResetRequired)
	if c.Status != corev1.ConditionTrue || c.Reason != "GPU3:RecoveryAction_GPU_RESET,GPU4:RemappedRowsPending" ||
		!strings.Contains(c.Message, "2 of 8 GPUs need a reset: "+e.fleet.UUID(3)+" (index 3): RecoveryAction_GPU_RESET; "+e.fleet.UUID(4)) {
		t.Errorf("GPUResetRequired %+v", c)
	}
	c = cond(v1alpha1.NodeConditionGPUReplacementRequired)
	if c.Status != corev1.ConditionTrue || c.Reason != "GPU5:RemappedRowsFailure" || !strings.Contains(c.Message, "1 of 8 GPUs needs a replacement: "+e.fleet.UUID(5)) {
		t.Errorf("GPUReplacementRequired %+v", c)
	}
	if got := rebootCauses(); len(got) != 2 || !strings.Contains(got[1], e.fleet.UUID(6)+" (index 6): RecoveryAction_NODE_REBOOT") {
		t.Errorf("reboot causes %q, want a second naming GPU 6", got)
	}
	for i, want := range map[int][2]float64{3: {1, 0}, 4: {1, 0}, 5: {0, 1}, 6: {0, 0}, 0: {0, 0}} {
		r, _ := e.metric(t, "lifecycle_agent_gpu_reset_required", e.labels(i))
		p, _ := e.metric(t, "lifecycle_agent_gpu_replacement_required", e.labels(i))
		if r != want[0] || p != want[1] {
			t.Errorf("GPU %d: reset_required %v, replacement_required %v; want %v", i, r, p, want)
		}
	}
	if n := len(e.sink.ofType(v1alpha1.NodeConditionGPUResetRequired)); n != 2 {
		t.Errorf("GPUResetRequired written %d times for two states", n)
	}

	e.devs.mu.Lock()
	e.devs.snapshotErr = errors.New("devices: DeviceGetCount: ERROR_UNKNOWN")
	e.devs.mu.Unlock()
	before := cond(v1alpha1.NodeConditionGPUResetRequired)
	e.mon.Check(ctx) // one failed read: debounced (ReadFailuresBeforeUnknown)
	if c := cond(v1alpha1.NodeConditionGPUResetRequired); c != before || c.Status != corev1.ConditionTrue {
		t.Errorf("GPUResetRequired after one failed read: %+v, want it kept as %+v", c, before)
	}
	e.mon.Check(ctx)
	if c := cond(v1alpha1.NodeConditionGPUResetRequired); c.Status != corev1.ConditionUnknown || c.Reason != ReasonNVMLError {
		t.Errorf("GPUResetRequired while NVML fails: %+v", c)
	}
	if got := rebootCauses(); len(got) != 2 {
		t.Errorf("reboot causes %q: an unreadable NVML changed them", got)
	}
	e.devs.mu.Lock()
	e.devs.snapshotErr = nil
	e.devs.mu.Unlock()

	e.fleet.SetAll(func(g *devicestest.GPU) {
		*g = devicestest.GPU{RecoveryAction: devices.RecoveryActionNone, FabricState: devices.FabricCompleted}
	})
	e.mon.Check(ctx)
	for _, typ := range []string{v1alpha1.NodeConditionGPUResetRequired, v1alpha1.NodeConditionGPUReplacementRequired} {
		if c := cond(typ); c.Status != corev1.ConditionFalse || c.Reason != ReasonNotRequired {
			t.Errorf("%s after the GPUs healed: %+v", typ, c)
		}
	}
	if got := rebootCauses(); len(got) != 3 || got[2] != "" {
		t.Errorf("reboot causes %q, want the cause cleared", got)
	}
}

// NeedsOf follows NVIDIA's resolutions: latched XIDs by class, a lost GPU
// asks for a reboot, the fabric-level recovery actions for nothing.
func TestNeedsOf(t *testing.T) {
	s := devices.Snapshot{GPUs: []devices.GPUInfo{
		{Index: 0, UUID: "GPU-0", CriticalXIDs: []uint64{48, 79, 64}},
		{Index: 1, UUID: "GPU-1", Lost: true},
		{Index: 2, UUID: "GPU-2", RecoveryAction: devices.RecoveryActionDrainP2P, ResetRequired: true},
		{Index: 3, UUID: "GPU-3", RecoveryAction: devices.RecoveryActionDrainAndReset, RetiredPagesPending: devices.TriTrue},
	}}
	got := NeedsOf(s)
	want := Needs{
		NeedReset: {{Index: 0, UUID: "GPU-0", Causes: []string{"XID48"}}, {Index: 2, UUID: "GPU-2", Causes: []string{devices.SignalResetRequired}},
			{Index: 3, UUID: "GPU-3", Causes: []string{"RecoveryAction_DRAIN_AND_RESET", devices.SignalRetiredPagesPending}}},
		NeedReboot:  {{Index: 0, UUID: "GPU-0", Causes: []string{"XID79"}}, {Index: 1, UUID: "GPU-1", Causes: []string{devices.SignalGPULost}}},
		NeedReplace: {{Index: 0, UUID: "GPU-0", Causes: []string{"XID64"}}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("NeedsOf:\n got %v\nwant %v", got, want)
	}
}

// The baseline (issue 14.6): the first reading that lists GPUs is saved
// next to the journal; a GPU of it that falls off the bus (NVML no longer
// lists it) makes GPUHealthy False/GPUsMissing naming it and asks for a
// reboot, also after a restart of the agent (a new Monitor on the same
// file), until it is back; a broken file is replaced, not fatal.
func TestBaseline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpu-baseline.json")
	var mu sync.Mutex
	var causes []string
	withBaseline := func(c *Config) {
		c.BaselinePath = path
		c.RebootNeed = func(_ context.Context, cause string) {
			mu.Lock()
			defer mu.Unlock()
			causes = append(causes, cause)
		}
	}
	lastCause := func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(causes) == 0 {
			return "(none)"
		}
		return causes[len(causes)-1]
	}
	ctx := context.Background()
	e := newEnv(t, devicestest.DGXH100, withBaseline)
	e.mon.Check(ctx)
	b, err := LoadBaseline(path)
	if err != nil || b == nil || len(b.UUIDs) != 8 || !b.FirstSeen.Equal(epoch) {
		t.Fatalf("baseline after the first reading: %+v, %v; want the 8 GPUs, first seen %s", b, err, epoch)
	}
	if v, _ := e.metric(t, "lifecycle_agent_gpus_expected", nil); v != 8 {
		t.Errorf("lifecycle_agent_gpus_expected %v, want 8", v)
	}

	e.fleet.Set(2, func(g *devicestest.GPU) { g.OffBus = true })
	e.clk.Step(time.Minute)
	e.mon.Check(ctx)
	c := e.sink.all()[len(e.sink.all())-1]
	want := "1 of the 8 GPUs seen since " + epoch.Format(time.RFC3339) + " missing (fallen off the bus?): " + e.fleet.UUID(2)
	if c.Status != corev1.ConditionFalse || c.Reason != SignalGPUsMissing || c.Message != want {
		t.Errorf("GPUHealthy with GPU 2 off the bus: %+v; want False/%s %q", c, SignalGPUsMissing, want)
	}
	if got := lastCause(); got != want {
		t.Errorf("reboot cause %q, want %q", got, want)
	}

	// A restart of the agent: the baseline is read back, the GPU is still
	// missing, and a second fault adds to the reason.
	e2 := newEnv(t, devicestest.DGXH100, withBaseline)
	e2.fleet.Set(2, func(g *devicestest.GPU) { g.OffBus = true })
	e2.fleet.Set(5, func(g *devicestest.GPU) { g.RemappedRowsPending = true })
	e2.mon.Check(ctx)
	c = e2.sink.all()[0]
	if c.Status != corev1.ConditionFalse || c.Reason != SignalGPUsMissing+",GPU5:RemappedRowsPending" || !strings.HasPrefix(c.Message, want+"; ") {
		t.Errorf("after a restart: %+v; want GPUsMissing first, then the other GPU", c)
	}
	if b2, _ := LoadBaseline(path); b2 == nil || !b2.FirstSeen.Equal(epoch) || len(b2.UUIDs) != 8 {
		t.Errorf("the restart rewrote the baseline: %+v", b2)
	}

	e2.fleet.SetAll(func(g *devicestest.GPU) {
		*g = devicestest.GPU{RecoveryAction: devices.RecoveryActionNone, FabricState: devices.FabricCompleted}
	})
	e2.mon.Check(ctx)
	if c = e2.sink.all()[len(e2.sink.all())-1]; c.Status != corev1.ConditionTrue {
		t.Errorf("GPU back on the bus: %+v, want True", c)
	}
	if got := lastCause(); got != "" {
		t.Errorf("reboot cause %q once the GPU is back, want none", got)
	}

	if err := os.WriteFile(path, []byte("{garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	e3 := newEnv(t, devicestest.DGXA100, withBaseline)
	e3.mon.Check(ctx)
	if b3, err := LoadBaseline(path); err != nil || b3 == nil || len(b3.UUIDs) != 8 {
		t.Errorf("a broken baseline was not replaced by the GPUs seen: %+v, %v", b3, err)
	}
	if c = e3.sink.all()[0]; c.Status != corev1.ConditionTrue {
		t.Errorf("after a broken baseline: %+v, want True (a new baseline)", c)
	}
}

// The monitor logs with the caller's logger, which names the node (the
// agent's does): a line says node= once, not twice.
func TestLogNamesNodeOnce(t *testing.T) {
	var buf syncBuf
	e := newEnv(t, devicestest.DGXH100, func(c *Config) {
		c.Log = slog.New(slog.NewTextHandler(&buf, nil)).With("node", testNode)
	})
	e.mon.Check(context.Background())
	line := ""
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.Contains(l, "GPUHealthy condition") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no GPUHealthy condition line logged:\n%s", buf.String())
	}
	if n := strings.Count(line, " node="); n != 1 {
		t.Errorf("node= %d times in %q, want once", n, line)
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
