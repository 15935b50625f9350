package needs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Label and annotation of the events the agent requests on its own.
const (
	LabelRequestedBy = "lifecycle.x-k8s.io/requested-by"
	// RequestedByNeeds is the label's value on a reboot this package
	// requests (the GPU monitor's requests say "gpu-health").
	RequestedByNeeds = "reboot-required"
	AnnotationReason = "lifecycle.x-k8s.io/reason"
)

// RebootKey is the Requester key of the reboot need.
const RebootKey = "reboot"

// DefaultLogEvery is how often a repeated warning is logged (STYLE 13).
const DefaultLogEvery = 5 * time.Minute

// DefaultRequestInterval is how often a Requester looks at its requests'
// events (and retries what failed) when Config leaves it zero.
const DefaultRequestInterval = 30 * time.Second

// ErrBreakerOpen refuses a request while the group's circuit breaker is open.
var ErrBreakerOpen = errors.New("needs: the group's circuit breaker is open")

// RequestAPI is what a Requester needs of the API: *apiclient.Client with
// its typed events (see agent's wiring).
type RequestAPI interface {
	CreateEvent(ctx context.Context, ev *v1alpha1.LifecycleEvent) error
	// GetEvent returns the event, or an error apierrors.IsNotFound knows.
	GetEvent(ctx context.Context, name string) (*v1alpha1.LifecycleEvent, error)
	BreakerFailures(ctx context.Context, group string) ([]string, error)
	RecordBreakerFailure(ctx context.Context, group, event string) ([]string, error)
}

// RequestJournal is where requests are kept: *journal.Journal.
type RequestJournal interface {
	PutAutoRequest(r journal.AutoRequest) error
	AutoRequests() ([]journal.AutoRequest, error)
	DeleteAutoRequest(key string) error
	// History is the events this agent finished: the outcome of a
	// request's event deleted at the end (eventRetention 0).
	History() ([]journal.HistoryRecord, error)
}

// RequestConfig configures a Requester: one per need kind, each with its
// own disruption group and breaker.
type RequestConfig struct {
	Need            string // "reboot" or "gpu-reset": the metrics' need label, and the log's
	KeyPrefix       string // the keys this requester owns: "reboot", "gpu-reset/"
	Group           string
	MaxConcurrent   int
	BreakerFailures int
	Interval        time.Duration // 0: DefaultRequestInterval

	API        RequestAPI
	Journal    RequestJournal
	Registerer prometheus.Registerer // nil: no metrics
	Clock      clock.Clock           // nil: the real clock
	Log        *slog.Logger
}

// Requester turns needs into LifecycleEvents of the node's own: once per
// need, journaled before the event is created, in a disruption group whose
// slots cap how many nodes act at once, and not at all while the group's
// circuit breaker is open. See the package doc.
type Requester struct {
	cfg       RequestConfig
	clk       clock.Clock
	requested prometheus.Counter
	failed    prometheus.Counter
	open      prometheus.Gauge

	mu      sync.Mutex // serializes Request, Release and Reconcile
	lastLog map[string]time.Time
}

// NewRequester checks cfg.
func NewRequester(cfg RequestConfig) (*Requester, error) {
	switch {
	case cfg.Need == "" || cfg.KeyPrefix == "" || cfg.Group == "":
		return nil, errors.New("needs: RequestConfig needs Need, KeyPrefix and Group")
	case cfg.MaxConcurrent < 1 || cfg.MaxConcurrent > 1000 || cfg.BreakerFailures < 1:
		return nil, fmt.Errorf("needs: maxConcurrent %d (want 1-1000), breakerFailures %d (want ≥ 1)", cfg.MaxConcurrent, cfg.BreakerFailures)
	case cfg.API == nil || cfg.Journal == nil || cfg.Log == nil:
		return nil, errors.New("needs: RequestConfig needs API, Journal and Log")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultRequestInterval
	}
	r := &Requester{cfg: cfg, clk: cfg.Clock, lastLog: map[string]time.Time{}}
	if r.clk == nil {
		r.clk = clock.RealClock{}
	}
	labels := prometheus.Labels{"need": cfg.Need, "group": cfg.Group}
	r.requested = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifecycle_agent_auto_requests_total", ConstLabels: labels,
		Help: "LifecycleEvents this agent created on its own for a need (needs.reboot.policy request, gpu.autoRemediate)."})
	r.failed = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifecycle_agent_auto_request_failures_total", ConstLabels: labels,
		Help: "This agent's own requests that ended Failed or SlaExpired (each one recorded on the group's circuit breaker)."})
	r.open = prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifecycle_agent_auto_request_breaker_open", ConstLabels: labels,
		Help: "1 while the group's circuit breaker is open (its failures reached breakerFailures): no automatic request is made."})
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{r.requested, r.failed, r.open} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// Run reconciles at start and every Interval until ctx ends: it creates
// what was journaled but not created (a crash or an outage in between),
// follows the events to their end, records failures on the breaker and
// forgets what is done.
func (r *Requester) Run(ctx context.Context) {
	for {
		r.Reconcile(ctx)
		t := r.clk.NewTimer(r.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// Request asks for ev for the need key, unless it was asked for already:
// while the journal holds key's request (its event unfinished, or ended
// with the need still there) nothing new is created, so that a need that
// outlives its event is not requested again and again. ev gets the
// group's disruption budget. The request is journaled before the event is
// created; a failed create is retried by Reconcile. It returns
// ErrBreakerOpen while the group's breaker is open (nothing journaled), or
// the error of reading the breaker (fail closed: retried at the next call).
func (r *Requester) Request(ctx context.Context, key string, ev *v1alpha1.LifecycleEvent) error {
	if !strings.HasPrefix(key, r.cfg.KeyPrefix) {
		return fmt.Errorf("needs: key %q is not this requester's (%s…)", key, r.cfg.KeyPrefix)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok, err := r.find(key)
	if err != nil {
		return err
	}
	if ok {
		if rec.Released { // the need came back before the last request was forgotten
			rec.Released = false
			return r.cfg.Journal.PutAutoRequest(rec)
		}
		if rec.Outcome != "" {
			r.warn("held/"+key, "the need is still there after its request ended; not requesting again (once per need: clear it, or request by hand)",
				"need", key, "lifecycleEvent", rec.Event, "outcome", rec.Outcome)
		}
		return nil
	}
	failures, err := r.cfg.API.BreakerFailures(ctx, r.cfg.Group)
	if err != nil {
		return fmt.Errorf("needs: reading the circuit breaker of group %s: %w", r.cfg.Group, err)
	}
	if len(failures) >= r.cfg.BreakerFailures {
		r.open.Set(1)
		r.warn("breaker", "circuit breaker open: not requesting; delete the Lease to close it once the cause is fixed",
			"need", key, "group", r.cfg.Group, "failures", strings.Join(failures, ","), "limit", r.cfg.BreakerFailures,
			"reset", "kubectl -n "+v1alpha1.SystemNamespace+" delete lifecyclelease "+apiclient.BreakerLeaseName(r.cfg.Group))
		return fmt.Errorf("%w: group %s has %d failed requests (limit %d)", ErrBreakerOpen, r.cfg.Group, len(failures), r.cfg.BreakerFailures)
	}
	r.open.Set(0)
	ev = ev.DeepCopy()
	ev.Spec.Disruption = &v1alpha1.DisruptionBudget{Group: r.cfg.Group, MaxConcurrent: int32(r.cfg.MaxConcurrent)}
	obj, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	rec = journal.AutoRequest{Key: key, Event: ev.Name, Group: r.cfg.Group, Object: obj}
	if err := r.cfg.Journal.PutAutoRequest(rec); err != nil {
		return err
	}
	r.publish(ctx, &rec)
	return nil
}

// Release says the need of key went away. A request not created yet is
// dropped; one whose event ended is forgotten; one still running goes on
// (a need that clears by itself mid-reboot is no reason to cancel) and is
// forgotten when it ends.
func (r *Requester) Release(ctx context.Context, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok, err := r.find(key)
	if err != nil || !ok {
		if err != nil {
			r.cfg.Log.Warn("reading the journal's requests failed", "err", err)
		}
		return
	}
	if !rec.Released {
		rec.Released = true
		if err := r.cfg.Journal.PutAutoRequest(rec); err != nil {
			r.cfg.Log.Warn("journaling the end of a need failed; retrying when it is reported again", "need", key, "err", err)
			return
		}
	}
	r.reconcile(ctx, rec)
}

// Reconcile looks at every request of this requester once.
func (r *Requester) Reconcile(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	all, err := r.cfg.Journal.AutoRequests()
	if err != nil {
		r.warn("journal", "reading the journal's requests failed", "err", err)
		return
	}
	for _, rec := range all {
		if strings.HasPrefix(rec.Key, r.cfg.KeyPrefix) && ctx.Err() == nil {
			r.reconcile(ctx, rec)
		}
	}
}

// endedAs is the outcome of rec's event, gone from the API: the end the
// journal's history records for it (the latest by that name finished
// after the request was made), or Gone when it has none or was cancelled
// — deleted before it ended.
func (r *Requester) endedAs(rec journal.AutoRequest) (string, error) {
	hist, err := r.cfg.Journal.History()
	if err != nil {
		return "", err
	}
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		if h.Event.Name != rec.Event || h.Finished.Before(rec.Created) {
			continue
		}
		if h.Outcome == journal.OutcomeCancelled {
			return journal.RequestGone, nil
		}
		return h.Outcome.String(), nil // Succeeded, Failed, SlaExpired: as the status says them
	}
	return journal.RequestGone, nil
}

// reconcile moves one request on. Call with r.mu held.
func (r *Requester) reconcile(ctx context.Context, rec journal.AutoRequest) {
	switch {
	case !rec.Published && rec.Released:
		// The need went away before the event was known created: never
		// create it, unless a create whose answer was lost made it.
		_, err := r.cfg.API.GetEvent(ctx, rec.Event)
		switch {
		case apierrors.IsNotFound(err):
			r.forget(rec, "the need went away before its event was created")
			return
		case err != nil:
			r.warn("get/"+rec.Key, "reading an automatic request's event failed; retrying", "lifecycleEvent", rec.Event, "err", err)
			return
		}
		rec.Published = true
	case !rec.Published:
		r.publish(ctx, &rec)
		if !rec.Published {
			return
		}
	}
	if rec.Outcome == "" {
		ev, err := r.cfg.API.GetEvent(ctx, rec.Event)
		switch {
		case apierrors.IsNotFound(err):
			// Deleted: at its end (eventRetention 0; this agent ran it,
			// its journal's history has the outcome), or by an admin.
			out, herr := r.endedAs(rec)
			if herr != nil {
				r.warn("history/"+rec.Key, "reading the journal's history for an automatic request's outcome failed; retrying", "lifecycleEvent", rec.Event, "err", herr)
				return
			}
			rec.Outcome = out
		case err != nil:
			r.warn("get/"+rec.Key, "reading an automatic request's event failed; retrying", "lifecycleEvent", rec.Event, "err", err)
			return
		case ev.Status.ClaimStatus.Finished():
			rec.Outcome = string(ev.Status.ClaimStatus)
		default:
			return // still running
		}
		if err := r.cfg.Journal.PutAutoRequest(rec); err != nil {
			r.cfg.Log.Warn("journaling an automatic request's outcome failed; retrying", "lifecycleEvent", rec.Event, "err", err)
			return
		}
		r.cfg.Log.Info("automatic request ended", "need", rec.Key, "lifecycleEvent", rec.Event, "outcome", rec.Outcome)
	}
	if rec.Failed() && !rec.Counted {
		failures, err := r.cfg.API.RecordBreakerFailure(ctx, rec.Group, rec.Event)
		if err != nil {
			r.warn("breaker/"+rec.Key, "recording a failed request on the circuit breaker failed; retrying", "lifecycleEvent", rec.Event, "err", err)
			return
		}
		rec.Counted = true
		if err := r.cfg.Journal.PutAutoRequest(rec); err != nil {
			r.cfg.Log.Warn("journaling an automatic request's breaker record failed; retrying (recording it again is harmless)", "lifecycleEvent", rec.Event, "err", err)
			return
		}
		r.failed.Inc()
		args := []any{"need", rec.Key, "lifecycleEvent", rec.Event, "group", rec.Group, "failures", len(failures), "limit", r.cfg.BreakerFailures}
		if len(failures) >= r.cfg.BreakerFailures {
			r.open.Set(1)
			r.cfg.Log.Error("automatic request failed: the group's circuit breaker is now open, no node of the group requests on its own until an admin deletes Lease "+apiclient.BreakerLeaseName(rec.Group), args...)
		} else {
			r.cfg.Log.Warn("automatic request failed; recorded on the group's circuit breaker", args...)
		}
	}
	if rec.Released {
		r.forget(rec, "its event ended and the need went away")
	}
}

// publish creates rec's event and marks it published; an event of that name
// that exists already is ours from before a crash (the names are per node,
// need and boot). Call with r.mu held.
func (r *Requester) publish(ctx context.Context, rec *journal.AutoRequest) {
	var ev v1alpha1.LifecycleEvent
	if err := json.Unmarshal(rec.Object, &ev); err != nil {
		r.warn("object/"+rec.Key, "an automatic request's journaled event does not decode", "need", rec.Key, "err", err)
		return
	}
	err := r.cfg.API.CreateEvent(ctx, &ev)
	switch {
	case err == nil:
		r.requested.Inc()
		r.cfg.Log.Info("requested an event on its own", "need", rec.Key, "lifecycleEvent", rec.Event, "group", rec.Group,
			"maxConcurrent", r.cfg.MaxConcurrent, "reason", ev.Annotations[AnnotationReason])
	case apierrors.IsAlreadyExists(err):
		r.cfg.Log.Info("automatic request already made", "need", rec.Key, "lifecycleEvent", rec.Event)
	default:
		r.warn("create/"+rec.Key, "creating an automatic request failed; retrying", "need", rec.Key, "lifecycleEvent", rec.Event, "err", err)
		return
	}
	rec.Published = true
	if err := r.cfg.Journal.PutAutoRequest(*rec); err != nil {
		// Not journaled: the next reconcile creates it again and finds it there.
		r.cfg.Log.Warn("journaling a created request failed", "lifecycleEvent", rec.Event, "err", err)
	}
}

func (r *Requester) forget(rec journal.AutoRequest, why string) {
	if err := r.cfg.Journal.DeleteAutoRequest(rec.Key); err != nil {
		r.cfg.Log.Warn("forgetting an automatic request failed; retrying", "need", rec.Key, "err", err)
		return
	}
	r.cfg.Log.Info("automatic request done: "+why, "need", rec.Key, "lifecycleEvent", rec.Event, "outcome", rec.Outcome)
}

func (r *Requester) find(key string) (journal.AutoRequest, bool, error) {
	all, err := r.cfg.Journal.AutoRequests()
	if err != nil {
		return journal.AutoRequest{}, false, err
	}
	for _, rec := range all {
		if rec.Key == key {
			return rec, true, nil
		}
	}
	return journal.AutoRequest{}, false, nil
}

// warn logs once per key per DefaultLogEvery (STYLE 13).
func (r *Requester) warn(key, msg string, args ...any) {
	now := r.clk.Now()
	if t, ok := r.lastLog[key]; ok && now.Sub(t) < DefaultLogEvery {
		return
	}
	r.lastLog[key] = now
	r.cfg.Log.Warn(msg, args...)
}

// RebootEvent is the reboot LifecycleEvent requested for the node's
// RebootRequired: <node>-reboot-<first 8 hex of the boot ID>, so that a
// boot requests at most one; reason is the condition's message.
func RebootEvent(node, transition, bootID, reason string) *v1alpha1.LifecycleEvent {
	var short strings.Builder
	for _, c := range strings.ToLower(bootID) {
		if (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') {
			short.WriteRune(c)
			if short.Len() == 8 {
				break
			}
		}
	}
	suffix, prefix := "-reboot-"+short.String(), node
	if max := 253 - len(suffix); len(prefix) > max {
		prefix = strings.TrimRight(prefix[:max], "-.")
	}
	return &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{
			Name:        prefix + suffix,
			Labels:      map[string]string{LabelRequestedBy: RequestedByNeeds},
			Annotations: map[string]string{AnnotationReason: capMessage("RebootRequired: " + reason)},
		},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: transition, BindingNode: node},
	}
}
