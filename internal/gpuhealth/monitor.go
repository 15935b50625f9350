package gpuhealth

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Defaults for Config fields left zero.
const (
	DefaultInterval = 30 * time.Second
	// DefaultLogEvery rate-limits repeated warnings with the same key.
	DefaultLogEvery = 5 * time.Minute
	// MaxReasonLength caps the False condition's reason (bytes).
	MaxReasonLength = 256
	// ReadFailuresBeforeUnknown debounces NVML read errors: after a good
	// reading, one failed reading keeps the conditions as they were (a
	// transient ERROR_UNKNOWN or a busy driver); this many in a row turn
	// them Unknown. Before any good reading the first failure does.
	ReadFailuresBeforeUnknown = 2
)

// Labels on automatically created events.
const (
	LabelRequestedBy = "lifecycle.x-k8s.io/requested-by"
	RequestedBy      = "gpu-health"
	AnnotationReason = "lifecycle.x-k8s.io/reason"
)

// Devices is what the monitor reads; *devices.Manager implements it.
type Devices interface {
	Snapshot() (devices.Snapshot, error)
	WatchEvents(ctx context.Context, uuids []string) (<-chan devices.Event, error)
	// LatchXID latches an XID seen elsewhere (the kernel log, the state
	// kept across restarts) as the watcher would, returning its class.
	LatchXID(uuid string, xid uint64) devices.XIDClass
}

// StateStore keeps the monitor's State across restarts; *journal.Journal
// implements it.
type StateStore interface {
	GPUHealth() (journal.GPUHealthState, bool, error)
	PutGPUHealth(journal.GPUHealthState) error
}

var _ StateStore = (*journal.Journal)(nil)

// ConditionSink writes Node conditions; *apiclient.Client implements it.
type ConditionSink interface {
	SetNodeConditions(ctx context.Context, now time.Time, conds ...apiclient.NodeCondition) error
}

var _ Devices = (*devices.Manager)(nil)
var _ ConditionSink = (*apiclient.Client)(nil)

// Config builds a Monitor.
type Config struct {
	// Node is this node's name. Required.
	Node string
	// Devices is read every Interval and on events. Required.
	Devices Devices
	// Conditions receives GPUHealthy. Required.
	Conditions ConditionSink
	// Registerer gets the metrics; nil registers nothing (they are still
	// kept: Monitor.Metrics).
	Registerer prometheus.Registerer
	// Clock drives the loop; nil means the real clock.
	Clock clock.Clock
	// Log; nil discards.
	Log *slog.Logger // names the node (the agent's logger does)
	// Interval between evaluations; 0 means DefaultInterval.
	Interval time.Duration
	// AutoRemediate is gpu.autoRemediate: request a gpu-reset event for a
	// GPU whose recovery action is GPU_RESET (or DRAIN_AND_RESET).
	AutoRemediate bool
	// CreateEvent creates a LifecycleEvent (the typed client's Create).
	// Required when AutoRemediate.
	CreateEvent func(ctx context.Context, ev *v1alpha1.LifecycleEvent) error
	// Released, when set, is called at each evaluation for every GPU whose
	// recovery action asks for no reset, so that the agent's Requester
	// (internal/needs) forgets a request once its need went away.
	Released func(ctx context.Context, uuid string)
	// BootID names requested events (one automatic reset per GPU per boot).
	// Required when AutoRemediate.
	BootID string
	// TransitionName of this node's gpu-reset transition; "" means
	// <Node>-gpu-reset.
	TransitionName string
	// RebootNeed, when set, receives the GPUs' part of RebootRequired
	// (RebootCause: "" when no GPU asks for a reboot) after each
	// evaluation that changed it, and once after the first.
	RebootNeed func(ctx context.Context, cause string)
	// BaselinePath is the file of every GPU seen on this node since the
	// first (Baseline); a GPU of it that NVML no longer lists makes
	// GPUHealthy False (GPUsMissing) and asks for a reboot. "": no baseline.
	BaselinePath string
	// State keeps the latched XIDs and the kernel log position across
	// restarts of the agent (the journal). Needs BootID. nil: they live in
	// memory only, and a restart forgets them.
	State StateStore
	// KernelLog is read for the XIDs the NVIDIA module logged
	// (devices.DefaultKernelLog): at start for those logged while the
	// agent was down, then at each evaluation. "": not read.
	KernelLog string
}

// Monitor is the GPU health loop. Run it once; Check and Rewatch may be
// called from other goroutines.
type Monitor struct {
	cfg      Config
	log      *slog.Logger
	clk      clock.Clock
	metrics  *Metrics
	rewatch  chan struct{}
	pauseReq chan chan struct{} // Pause asks Run to stop its watcher; Run closes the reply

	pmu     sync.Mutex
	paused  bool
	running bool

	mu          sync.Mutex                         // serializes evaluations
	published   map[string]apiclient.NodeCondition // by type: the last written successfully
	rebootCause *string                            // the last cause given to RebootNeed
	baseline    *Baseline                          // nil: none yet (or off)
	unsaved     bool                               // baseline changed since it was last saved
	last        devices.HealthReport
	goodRead    bool            // a snapshot was read since start
	readFails   int             // failed snapshots in a row
	requested   map[string]bool // event names created or found existing
	lastLog     map[string]time.Time

	// XIDs kept across restarts (xidstate.go).
	snap     devices.Snapshot // the last good reading (GPUs by PCI address)
	restored bool             // State read (at the first good reading)
	klog     *devices.KernelLog
	klogSeq  uint64                  // the last kernel log record read in this boot
	absent   map[string][]uint64     // restored XIDs of GPUs NVML does not list now
	saved    *journal.GPUHealthState // the state last written to State
}

// New validates cfg and registers the metrics.
func New(cfg Config) (*Monitor, error) {
	var errs []error
	if cfg.Node == "" {
		errs = append(errs, errors.New("Node is required"))
	}
	if cfg.Devices == nil {
		errs = append(errs, errors.New("Devices is required"))
	}
	if cfg.Conditions == nil {
		errs = append(errs, errors.New("Conditions is required"))
	}
	if cfg.AutoRemediate && (cfg.CreateEvent == nil || cfg.BootID == "") {
		errs = append(errs, errors.New("AutoRemediate needs CreateEvent and BootID"))
	}
	if cfg.State != nil && cfg.BootID == "" {
		errs = append(errs, errors.New("State needs BootID"))
	}
	if cfg.Interval < 0 {
		errs = append(errs, errors.New("Interval must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("gpuhealth: config: %w", err)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.TransitionName == "" {
		cfg.TransitionName = cfg.Node + "-gpu-reset"
	}
	met, err := NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Monitor{
		cfg: cfg, log: cfg.Log, clk: cfg.Clock, metrics: met,
		rewatch: make(chan struct{}, 1), pauseReq: make(chan chan struct{}), requested: map[string]bool{}, lastLog: map[string]time.Time{}, absent: map[string][]uint64{},
		published: map[string]apiclient.NodeCondition{},
	}
	if cfg.BaselinePath != "" {
		b, err := LoadBaseline(cfg.BaselinePath)
		if err != nil {
			// Replaced by the GPUs of the next reading: a broken file must
			// not keep the monitor from starting.
			m.log.Warn("GPU baseline unreadable; starting a new one from the GPUs seen now", "path", cfg.BaselinePath, "err", err)
		}
		m.baseline = b
	}
	return m, nil
}

// Metrics returns the monitor's metrics.
func (m *Monitor) Metrics() *Metrics { return m.metrics }

// Rewatch restarts the XID watcher at once (after a GPU reset). It never
// blocks.
func (m *Monitor) Rewatch() {
	select {
	case m.rewatch <- struct{}{}:
	default:
	}
}

// Pause stops the monitor's hold on the GPUs for a reset: it waits for an
// evaluation in progress, stops the XID watcher and waits until the
// watcher has freed its event set (within one devices EventWait), and
// evaluates nothing until Resume. The agent then shuts NVML down (Session).
// Idempotent; ctx bounds the wait.
func (m *Monitor) Pause(ctx context.Context) error {
	m.mu.Lock() // no evaluation in progress once we hold it
	if !m.Paused() {
		m.beforeReset()
	}
	m.pmu.Lock()
	m.paused = true
	running := m.running
	m.pmu.Unlock()
	m.mu.Unlock()
	if !running {
		return nil
	}
	done := make(chan struct{})
	select {
	case m.pauseReq <- done:
	case <-ctx.Done():
		return fmt.Errorf("gpuhealth: pausing the monitor: %w", ctx.Err())
	}
	select {
	case <-done:
		m.log.Info("GPU monitor paused")
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gpuhealth: pausing the monitor: waiting for the XID watcher to stop: %w", ctx.Err())
	}
}

// Resume undoes Pause: the watcher restarts and an evaluation runs at once.
// A no-op when not paused.
func (m *Monitor) Resume() {
	m.mu.Lock()
	m.pmu.Lock()
	was := m.paused
	m.paused = false
	m.pmu.Unlock()
	if was {
		m.afterReset()
	}
	m.mu.Unlock()
	if was {
		m.log.Info("GPU monitor resumed")
		m.Rewatch()
	}
}

// Unknown publishes GPUHealthy Unknown with reason and msg while the
// monitor is paused for something that is not a reset — the GPU
// Operator replacing the driver — so that the Node does not keep saying
// the GPUs are healthy while nothing reads them; the first evaluation
// after Resume publishes what it reads.
func (m *Monitor) Unknown(ctx context.Context, reason, msg string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.publish(ctx, apiclient.NodeCondition{Type: devices.ConditionType, Status: corev1.ConditionUnknown, Reason: reason, Message: msg})
}

// Paused reports whether the monitor is paused.
func (m *Monitor) Paused() bool {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	return m.paused
}

// Run evaluates at start, every Interval and on each batch of GPU events,
// until ctx ends. It returns nil when ctx ends.
func (m *Monitor) Run(ctx context.Context) error {
	m.pmu.Lock()
	m.running = true
	m.pmu.Unlock()
	defer func() {
		m.pmu.Lock()
		m.running = false
		m.pmu.Unlock()
	}()
	var events <-chan devices.Event
	stopWatch := func() {}
	defer func() { stopWatch() }()
	watch := func() {
		if m.Paused() {
			return
		}
		stopWatch()
		wctx, cancel := context.WithCancel(ctx)
		ch, err := m.cfg.Devices.WatchEvents(wctx, nil)
		if err != nil {
			cancel()
			events, stopWatch = nil, func() {}
			m.warn("watch", "GPU event watcher not running; retrying at the next evaluation", "err", err)
			return
		}
		events, stopWatch = ch, cancel
	}
	watch()
	m.Check(ctx)
	t := m.clk.NewTimer(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			if events == nil {
				watch()
			}
			m.Check(ctx)
			t.Reset(m.cfg.Interval)
		case done := <-m.pauseReq:
			stopWatch()
			stopWatch = func() {}
			// The watcher closes its channel after freeing the event set.
			for events != nil {
				select {
				case _, ok := <-events:
					if !ok {
						events = nil
					}
				case <-ctx.Done():
					return nil
				}
			}
			close(done)
		case <-m.rewatch:
			watch()
			m.Check(ctx)
		case ev, ok := <-events:
			if !ok {
				events = nil // restarted at the next tick
				continue
			}
			m.observe(ctx, ev)
			// Coalesce a burst into one evaluation.
			for more := true; more && events != nil; {
				select {
				case ev, ok := <-events:
					if !ok {
						events = nil
						break
					}
					m.observe(ctx, ev)
				default:
					more = false
				}
			}
			m.Check(ctx)
		}
	}
}

// observe counts an event and acts on a recovery action at once.
func (m *Monitor) observe(ctx context.Context, ev devices.Event) {
	switch ev.Kind {
	case devices.EventXID:
		m.metrics.XIDEvents.WithLabelValues(ev.UUID, strconv.FormatUint(ev.XID, 10)).Inc()
		m.log.Warn("GPU XID event", "gpu", ev.UUID, "xid", ev.XID)
	case devices.EventRecoveryAction:
		if ev.UUID != "" {
			m.mu.Lock()
			m.remediate(ctx, ev.UUID, ev.RecoveryAction)
			m.mu.Unlock()
		}
	}
}

// Check evaluates the GPUs once: gauges, the condition (written when it
// changed) and, with AutoRemediate, reset requests. It returns the report.
//
// While paused (a GPU reset) it reads nothing and returns the last report.
func (m *Monitor) Check(ctx context.Context) devices.HealthReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.Paused() {
		return m.last
	}
	s, err := m.cfg.Devices.Snapshot()
	if err != nil && devices.DriverGone(err) {
		s, err = m.reopen(err)
	}
	var rep devices.HealthReport
	var conds []apiclient.NodeCondition
	if err != nil && m.goodRead && m.readFails+1 < ReadFailuresBeforeUnknown {
		m.readFails++
		m.log.Warn("reading the GPUs failed; keeping the last conditions unless the next reading fails too", "err", err,
			"failures", m.readFails, "limit", ReadFailuresBeforeUnknown)
		return m.last
	}
	if err != nil {
		m.readFails++
		m.metrics.forgetAll()
		rep = devices.HealthReport{At: m.clk.Now(), Condition: devices.Condition{Type: devices.ConditionType,
			Status: devices.ConditionUnknown, Reason: devices.ReasonNVMLError, Message: err.Error()}}
		m.warn("snapshot", "reading the GPUs failed", "err", err)
		// The reboot cause stays as last read: an unreadable NVML neither
		// raises nor clears it.
		conds = []apiclient.NodeCondition{NodeCondition(rep), NVMLUnknown(NeedReset, err), NVMLUnknown(NeedReplace, err)}
	} else {
		m.goodRead, m.readFails = true, 0
		m.recall(&s)
		rep = devices.Evaluate(s)
		needs := NeedsOf(s)
		m.metrics.update(s, rep, needs)
		for _, g := range s.GPUs {
			if g.UUID != "" {
				m.remediate(ctx, g.UUID, g.RecoveryAction)
			}
		}
		health, cause := NodeCondition(rep), RebootCause(needs, len(s.GPUs))
		if gone := m.checkBaseline(s); len(gone) > 0 {
			health = withMissing(health, m.baseline, gone)
			cause = strings.Trim(m.baseline.missingMessage(gone)+"; "+cause, "; ")
		}
		conds = []apiclient.NodeCondition{health,
			NeedCondition(NeedReset, needs, len(s.GPUs)), NeedCondition(NeedReplace, needs, len(s.GPUs))}
		m.rebootNeed(ctx, cause)
		m.snap = s
		m.saveState(s)
	}
	m.publish(ctx, conds...)
	m.last = rep
	return rep
}

// Reopener is what Devices implements when its NVML session can be
// opened again (*devices.Manager.Reinit).
type Reopener interface{ Reinit() error }

// reopen answers a reading that failed because the NVML session lost its
// driver (unloaded, or replaced by another version — the GPU Operator's
// driver pod restarting — or a session released and never taken back):
// it opens a new session, restarts the XID watcher on it and reads again.
// When the driver is not back yet the reading fails as before, naming
// both errors, and the next evaluation tries again: no restart needed.
func (m *Monitor) reopen(readErr error) (devices.Snapshot, error) {
	r, ok := m.cfg.Devices.(Reopener)
	if !ok {
		return devices.Snapshot{}, readErr
	}
	if err := r.Reinit(); err != nil {
		return devices.Snapshot{}, fmt.Errorf("%w; opening a new NVML session: %w", readErr, err)
	}
	m.log.Info("NVML session reopened after the driver went away or changed", "after", readErr)
	m.Rewatch() // the old watcher ended with the old session
	return m.cfg.Devices.Snapshot()
}

// checkBaseline compares the snapshot with the baseline (starting it at
// the first reading that lists GPUs, adding GPUs that appear), saves it
// when it changed, and returns the baseline's GPUs NVML does not list. A
// failed save is retried at the next evaluation.
func (m *Monitor) checkBaseline(s devices.Snapshot) []string {
	have := present(s)
	switch {
	case m.cfg.BaselinePath == "":
		return nil
	case m.baseline == nil && len(have) == 0:
		return nil
	case m.baseline == nil:
		m.baseline = &Baseline{V: BaselineVersion, FirstSeen: m.clk.Now(), UUIDs: have}
		m.unsaved = true
	case m.baseline.add(have):
		m.unsaved = true
	}
	if m.unsaved {
		if err := m.baseline.Save(m.cfg.BaselinePath); err != nil {
			m.warn("baseline", "saving the GPU baseline failed; retrying at the next evaluation", "path", m.cfg.BaselinePath, "err", err)
		} else {
			m.unsaved = false
			m.log.Info("GPU baseline saved", "path", m.cfg.BaselinePath, "gpus", len(m.baseline.UUIDs), "firstSeen", m.baseline.FirstSeen)
		}
	}
	m.metrics.Expected.Set(float64(len(m.baseline.UUIDs)))
	gone := m.baseline.missing(have)
	if len(gone) > 0 {
		m.warn("missing", "GPUs of the baseline missing", "missing", strings.Join(gone, ","), "expected", len(m.baseline.UUIDs), "present", len(have))
	}
	return gone
}

// withMissing makes GPUHealthy False for GPUs of the baseline that NVML no
// longer lists: reason GPUsMissing first, the message naming them first.
func withMissing(c apiclient.NodeCondition, b *Baseline, gone []string) apiclient.NodeCondition {
	msg := b.missingMessage(gone)
	if c.Status == corev1.ConditionFalse {
		c.Reason = capReason(append([]string{SignalGPUsMissing}, strings.Split(c.Reason, ",")...))
		c.Message = capMessage(msg + "; " + c.Message)
		return c
	}
	c.Status, c.Reason, c.Message = corev1.ConditionFalse, SignalGPUsMissing, capMessage(msg)
	return c
}

// rebootNeed hands the GPUs' reboot cause to Config.RebootNeed when it
// changed (and the first time).
func (m *Monitor) rebootNeed(ctx context.Context, cause string) {
	if m.cfg.RebootNeed == nil || (m.rebootCause != nil && *m.rebootCause == cause) {
		return
	}
	m.cfg.RebootNeed(ctx, cause)
	m.rebootCause = &cause
}

// publish writes, in one patch, those of conds that differ from the last
// ones written.
func (m *Monitor) publish(ctx context.Context, conds ...apiclient.NodeCondition) {
	var changed []apiclient.NodeCondition
	for _, c := range conds {
		if old, ok := m.published[c.Type]; !ok || old != c {
			changed = append(changed, c)
		}
	}
	if len(changed) == 0 {
		return
	}
	if err := m.cfg.Conditions.SetNodeConditions(ctx, m.clk.Now(), changed...); err != nil {
		m.warn("publish", "writing the GPU conditions failed; retrying at the next evaluation", "err", err)
		return
	}
	for _, c := range changed {
		from := "none"
		if old, ok := m.published[c.Type]; ok {
			from = string(old.Status) + "/" + old.Reason
		}
		m.log.Info(c.Type+" condition", "from", from, "to", string(c.Status)+"/"+c.Reason, "message", c.Message)
		m.published[c.Type] = c
	}
}

// remediate requests a gpu-reset event when the action calls for one and
// AutoRemediate is on. Call with m.mu held.
func (m *Monitor) remediate(ctx context.Context, uuid string, a devices.RecoveryAction) {
	if a != devices.RecoveryActionGPUReset && a != devices.RecoveryActionDrainAndReset {
		if m.cfg.AutoRemediate && m.cfg.Released != nil {
			m.cfg.Released(ctx, uuid)
		}
		return
	}
	if !m.cfg.AutoRemediate {
		m.warn("action/"+uuid, "GPU asks for a reset; gpu.autoRemediate is off, not requesting one", "gpu", uuid, "action", a.String())
		return
	}
	ev := ResetEvent(m.cfg.Node, m.cfg.TransitionName, uuid, m.cfg.BootID, a)
	if m.requested[ev.Name] {
		return
	}
	err := m.cfg.CreateEvent(ctx, ev)
	switch {
	case err == nil:
		m.log.Info("requested a GPU reset", "gpu", uuid, "action", a.String(), "lifecycleEvent", ev.Name)
	case apierrors.IsAlreadyExists(err):
		m.log.Info("GPU reset already requested in this boot", "gpu", uuid, "lifecycleEvent", ev.Name)
	default:
		m.warn("create/"+ev.Name, "requesting a GPU reset failed; retrying at the next evaluation", "gpu", uuid, "lifecycleEvent", ev.Name, "err", err)
		return
	}
	m.requested[ev.Name] = true
}

// warn logs once per key per DefaultLogEvery (STYLE 13).
func (m *Monitor) warn(key, msg string, args ...any) {
	now := m.clk.Now()
	if t, ok := m.lastLog[key]; ok && now.Sub(t) < DefaultLogEvery {
		return
	}
	m.lastLog[key] = now
	m.log.Warn(msg, args...)
}

// NodeCondition turns a health report into the GPUHealthy Node condition;
// see the package doc for the reason format.
func NodeCondition(r devices.HealthReport) apiclient.NodeCondition {
	c := apiclient.NodeCondition{
		Type: devices.ConditionType, Status: corev1.ConditionStatus(r.Condition.Status),
		Reason: r.Condition.Reason, Message: r.Condition.Message,
	}
	if r.Condition.Status != devices.ConditionFalse {
		return c
	}
	var parts []string
	for _, g := range r.Unhealthy() {
		for _, s := range g.Reasons {
			parts = append(parts, fmt.Sprintf("GPU%d:%s", g.Index, reasonToken(s)))
		}
	}
	if len(parts) > 0 {
		c.Reason = capReason(parts)
	}
	return c
}

// reasonToken keeps letters and digits, turns '=' into '_' and drops the
// rest: "XID 79" → XID79, "RecoveryAction=GPU_RESET" → RecoveryAction_GPU_RESET.
func reasonToken(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		case r == '=':
			b.WriteByte('_')
		}
	}
	return b.String()
}

func capReason(parts []string) string {
	const more = ",More"
	out := parts[0]
	for i, p := range parts[1:] {
		need := len(out) + 1 + len(p)
		if i+2 < len(parts) {
			need += len(more) // room to say that more were cut later
		}
		if need > MaxReasonLength {
			return out + more
		}
		out += "," + p
	}
	return out
}

// EventName is the name of the automatic gpu-reset event for one GPU in
// one boot: <node>-gpu-reset-<first 8 hex of the UUID>-<first 8 hex of the
// boot ID>, at most 253 characters.
func EventName(node, uuid, bootID string) string {
	short := func(s string) string {
		var b strings.Builder
		for _, r := range strings.ToLower(s) {
			if (r >= '0' && r <= '9') || (r >= 'a' && r <= 'f') {
				b.WriteRune(r)
				if b.Len() == 8 {
					break
				}
			}
		}
		return b.String()
	}
	suffix := "-gpu-reset-" + short(strings.TrimPrefix(strings.ToUpper(uuid), "GPU-")) + "-" + short(bootID)
	if max := 253 - len(suffix); len(node) > max {
		node = strings.TrimRight(node[:max], "-.")
	}
	return node + suffix
}

// ResetEvent is the LifecycleEvent requested for a GPU whose recovery
// action is a (possibly drain-first) reset.
func ResetEvent(node, transition, uuid, bootID string, a devices.RecoveryAction) *v1alpha1.LifecycleEvent {
	params := map[string]string{"gpus": uuid}
	if a == devices.RecoveryActionDrainAndReset {
		params["drain"] = "true"
	}
	return &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{
			Name:        EventName(node, uuid, bootID),
			Labels:      map[string]string{LabelRequestedBy: RequestedBy},
			Annotations: map[string]string{AnnotationReason: fmt.Sprintf("GPU %s recovery action %s (boot %s)", uuid, a, bootID)},
		},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: transition, BindingNode: node, Parameters: params},
	}
}
