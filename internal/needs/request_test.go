package needs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// api is a RequestAPI as strict as the API server on what the requester
// does: a second create of a name is AlreadyExists, a missing event is
// NotFound (both as apierrors knows them), an event without a name, node,
// transition or group is refused, and the breaker's list is append-only
// and idempotent like apiclient.RecordBreakerFailure. down makes every
// call fail as an unreachable server does; lostAnswer creates the event
// but loses the answer.
type api struct {
	mu         sync.Mutex
	events     map[string]*v1alpha1.LifecycleEvent
	breaker    map[string][]string
	creates    int
	down       bool
	lostAnswer bool
}

var eventsGR = schema.GroupResource{Group: v1alpha1.GroupName, Resource: "lifecycleevents"}

func newAPI() *api {
	return &api{events: map[string]*v1alpha1.LifecycleEvent{}, breaker: map[string][]string{}}
}

var errDown = errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")

func (a *api) CreateEvent(_ context.Context, ev *v1alpha1.LifecycleEvent) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return errDown
	}
	if ev.Name == "" || ev.Spec.BindingNode == "" || ev.Spec.TransitionName == "" || ev.Spec.Disruption == nil || ev.Spec.Disruption.Group == "" {
		return apierrors.NewBadRequest("name, spec.bindingNode, spec.transitionName and spec.disruption.group are required")
	}
	if _, ok := a.events[ev.Name]; ok {
		return apierrors.NewAlreadyExists(eventsGR, ev.Name)
	}
	a.creates++
	a.events[ev.Name] = ev.DeepCopy()
	if a.lostAnswer {
		a.lostAnswer = false
		return errors.New("http2: client connection lost")
	}
	return nil
}

func (a *api) GetEvent(_ context.Context, name string) (*v1alpha1.LifecycleEvent, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return nil, errDown
	}
	ev, ok := a.events[name]
	if !ok {
		return nil, apierrors.NewNotFound(eventsGR, name)
	}
	return ev.DeepCopy(), nil
}

func (a *api) BreakerFailures(_ context.Context, group string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return nil, errDown
	}
	return slices.Clone(a.breaker[group]), nil
}

func (a *api) RecordBreakerFailure(_ context.Context, group, event string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return nil, errDown
	}
	if !slices.Contains(a.breaker[group], event) {
		a.breaker[group] = append(a.breaker[group], event)
	}
	return slices.Clone(a.breaker[group]), nil
}

func (a *api) end(name string, s v1alpha1.LifecycleEventClaimStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events[name].Status.ClaimStatus = s
}

func (a *api) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.creates
}

type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type requestRig struct {
	t    *testing.T
	path string
	api  *api
	j    *journal.Journal
	r    *Requester
	reg  *prometheus.Registry
	log  *logBuf
}

func newRig(t *testing.T, breakerFailures int) *requestRig {
	rig := &requestRig{t: t, path: filepath.Join(t.TempDir(), "journal.db"), api: newAPI()}
	rig.restart(breakerFailures)
	return rig
}

// restart closes the journal and opens it again with a new Requester, as
// an agent restart does.
func (g *requestRig) restart(breakerFailures int) {
	g.t.Helper()
	if g.j != nil {
		if err := g.j.Close(); err != nil {
			g.t.Fatal(err)
		}
	}
	j, _, err := journal.Open(context.Background(), g.path, journal.Options{
		Checker: func(_ context.Context, p string) error { return journal.CheckFile(p, time.Second) }})
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { _ = j.Close() })
	g.j, g.reg, g.log = j, prometheus.NewRegistry(), &logBuf{}
	g.r, err = NewRequester(RequestConfig{Need: "reboot", KeyPrefix: RebootKey, Group: "auto-reboot", MaxConcurrent: 2,
		BreakerFailures: breakerFailures, API: g.api, Journal: j, Registerer: g.reg,
		Log: slog.New(slog.NewTextHandler(g.log, nil))})
	if err != nil {
		g.t.Fatal(err)
	}
}

func (g *requestRig) requests() []journal.AutoRequest {
	g.t.Helper()
	all, err := g.j.AutoRequests()
	if err != nil {
		g.t.Fatal(err)
	}
	return all
}

var bootA = "3f1c2a9e-0b7d-4e51-9c1a-77aa00bb11cc"

// One request per need: the event carries the group's budget and is bound
// to the node; asking again, and asking again after a restart, creates
// nothing more; once the event ended with the need still there nothing is
// requested either (a reboot that did not clear the need does not loop).
func TestRequestOncePerNeed(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, 3)
	ev := RebootEvent("n1", "n1-reboot", bootA, "/var/run/reboot-required exists")
	if ev.Name != "n1-reboot-3f1c2a9e" {
		t.Fatalf("event name %q, want n1-reboot-3f1c2a9e", ev.Name)
	}
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	got, err := g.api.GetEvent(ctx, ev.Name)
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Spec.Disruption; d == nil || d.Group != "auto-reboot" || d.MaxConcurrent != 2 || got.Spec.BindingNode != "n1" ||
		got.Labels[LabelRequestedBy] != RequestedByNeeds || !strings.Contains(got.Annotations[AnnotationReason], "reboot-required exists") {
		t.Fatalf("created event %+v %+v", got.ObjectMeta, got.Spec)
	}
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	g.restart(3)
	g.r.Reconcile(ctx)
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	if n := g.api.count(); n != 1 {
		t.Fatalf("%d creates after asking three times across a restart, want 1", n)
	}
	g.api.end(ev.Name, v1alpha1.LifecycleEventSucceeded)
	g.r.Reconcile(ctx)
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	if n := g.api.count(); n != 1 {
		t.Fatalf("%d creates after the event ended with the need still there, want 1", n)
	}
	if !strings.Contains(g.log.String(), "not requesting again") {
		t.Fatalf("no warning that the need outlived its request:\n%s", g.log)
	}
	if v := testutil.ToFloat64(g.r.requested); v != 0 { // this Requester (after the restart) created nothing
		t.Fatalf("auto_requests_total %v after the restart, want 0", v)
	}
	// The need goes away: forgotten; when it comes back (the next boot's
	// file) it is requested again.
	g.r.Release(ctx, RebootKey)
	if all := g.requests(); len(all) != 0 {
		t.Fatalf("journal keeps %+v after the need went away and its event ended", all)
	}
	next := RebootEvent("n1", "n1-reboot", "9a9a9a9a-0000", "again")
	if err := g.r.Request(ctx, RebootKey, next); err != nil {
		t.Fatal(err)
	}
	if n := g.api.count(); n != 2 {
		t.Fatalf("%d creates after the need came back, want 2", n)
	}
}

// The request is journaled before the event is created: with the API down
// the need is kept and the event created once the API is back; a create
// whose answer was lost is not made twice.
func TestRequestJournaledBeforeCreate(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, 3)
	ev := RebootEvent("n1", "n1-reboot", bootA, "kernel")
	g.api.lostAnswer = true
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	if all := g.requests(); len(all) != 1 || all[0].Published || all[0].Event != ev.Name {
		t.Fatalf("journal %+v, want one unpublished request for %s", all, ev.Name)
	}
	g.restart(3) // a crash before the retry
	g.r.Reconcile(ctx)
	if all := g.requests(); len(all) != 1 || !all[0].Published {
		t.Fatalf("journal %+v after reconcile, want it published", all)
	}
	if n := g.api.count(); n != 1 {
		t.Fatalf("%d creates, want 1 (the lost answer's create found by name)", n)
	}

	// The API down at the first ask: the breaker cannot be read, so
	// nothing is journaled and the error says so (fail closed).
	h := newRig(t, 3)
	h.api.down = true
	if err := h.r.Request(ctx, RebootKey, ev); err == nil || !strings.Contains(err.Error(), "circuit breaker") {
		t.Fatalf("Request with the API down: %v, want an error reading the breaker", err)
	}
	if all := h.requests(); len(all) != 0 {
		t.Fatalf("journal %+v after a refused request", all)
	}
}

// A need that goes away before its event was created is never created.
func TestRequestReleasedBeforeCreate(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, 3)
	ev := RebootEvent("n1", "n1-reboot", bootA, "kernel")
	// Create fails (the server answers 500 to the create only).
	failing := &failCreate{api: g.api}
	g.r.cfg.API = failing
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	g.r.Release(ctx, RebootKey)
	g.r.cfg.API = g.api
	g.r.Reconcile(ctx)
	if n := g.api.count(); n != 0 {
		t.Fatalf("%d creates for a need that went away before its event was created", n)
	}
	if all := g.requests(); len(all) != 0 {
		t.Fatalf("journal keeps %+v", all)
	}
}

type failCreate struct{ *api }

func (f *failCreate) CreateEvent(context.Context, *v1alpha1.LifecycleEvent) error {
	return apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
}

// A need that goes away while its event runs does not cancel it; the
// request is forgotten when the event ends.
func TestRequestReleasedWhileRunning(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, 3)
	ev := RebootEvent("n1", "n1-reboot", bootA, "kernel")
	if err := g.r.Request(ctx, RebootKey, ev); err != nil {
		t.Fatal(err)
	}
	g.r.Release(ctx, RebootKey)
	if _, err := g.api.GetEvent(ctx, ev.Name); err != nil {
		t.Fatalf("the running event is gone: %v", err)
	}
	if all := g.requests(); len(all) != 1 || !all[0].Released {
		t.Fatalf("journal %+v, want the request kept, released", all)
	}
	g.api.end(ev.Name, v1alpha1.LifecycleEventSucceeded)
	g.r.Reconcile(ctx)
	if all := g.requests(); len(all) != 0 {
		t.Fatalf("journal keeps %+v after the event ended", all)
	}
}

// The circuit breaker: each failed request is recorded once on the group's
// breaker (across restarts and repeated reconciles); at M failures no node
// requests, and the metric and the log say so; state is the API's, so a
// fresh agent (another node) sees it.
func TestRequestBreaker(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, 2)
	for i, boot := range []string{"aaaaaaaa-1", "bbbbbbbb-2"} {
		ev := RebootEvent("n1", "n1-reboot", boot, "kernel")
		if err := g.r.Request(ctx, RebootKey, ev); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		g.api.end(ev.Name, v1alpha1.LifecycleEventFailed)
		g.r.Reconcile(ctx)
		g.restart(2)
		g.r.Reconcile(ctx)
		g.r.Release(ctx, RebootKey) // the need goes, and comes back with the next boot
	}
	if got := g.api.breaker["auto-reboot"]; !slices.Equal(got, []string{"n1-reboot-aaaaaaaa", "n1-reboot-bbbbbbbb"}) {
		t.Fatalf("breaker %v, want each failure once", got)
	}
	// Another node's agent: the breaker is open for it too.
	other := newRig(t, 2)
	other.api = g.api
	other.r.cfg.API = g.api
	err := other.r.Request(ctx, RebootKey, RebootEvent("n2", "n2-reboot", "cccccccc", "kernel"))
	if !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("request with the breaker at its limit: %v, want ErrBreakerOpen", err)
	}
	if n := g.api.count(); n != 2 {
		t.Fatalf("%d creates, want 2 (none while the breaker is open)", n)
	}
	if all := other.requests(); len(all) != 0 {
		t.Fatalf("journal %+v after a refused request", all)
	}
	if v := testutil.ToFloat64(other.r.open); v != 1 {
		t.Fatalf("breaker_open gauge %v, want 1", v)
	}
	if !strings.Contains(other.log.String(), "circuit breaker open") || !strings.Contains(other.log.String(), "auto-reboot-breaker") {
		t.Fatalf("the log does not say the breaker is open and how to close it:\n%s", other.log)
	}
	// A SlaExpired counts too; a Gone (an admin deleted it) does not.
	h := newRig(t, 5)
	for _, end := range []string{"sla", "gone"} {
		ev := RebootEvent("n3", "n3-reboot", map[string]string{"sla": "dddddddd", "gone": "eeeeeeee"}[end], end)
		if err := h.r.Request(ctx, RebootKey, ev); err != nil {
			t.Fatal(err)
		}
		if end == "sla" {
			h.api.end(ev.Name, v1alpha1.LifecycleEventSlaExpired)
		} else {
			h.api.mu.Lock()
			delete(h.api.events, ev.Name)
			h.api.mu.Unlock()
		}
		h.r.Release(ctx, RebootKey)
	}
	if got := h.api.breaker["auto-reboot"]; !slices.Equal(got, []string{"n3-reboot-dddddddd"}) {
		t.Fatalf("breaker %v, want the SlaExpired only", got)
	}
	if v := testutil.ToFloat64(h.r.failed); v != 1 {
		t.Fatalf("auto_request_failures_total %v, want 1", v)
	}
}

// With eventRetention 0 the agent deletes a request's event as soon as it
// has ended, so the requester finds it gone: the outcome is the one the
// journal's history records for it (this agent ran it). A Failed end
// counts on the breaker; a cancel is Gone, and does not.
func TestRequestOutcomeOfADeletedEvent(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, 5)
	for i, c := range []struct {
		boot    string
		outcome journal.Outcome
	}{{"aaaaaaaa", journal.OutcomeFailed}, {"bbbbbbbb", journal.OutcomeCancelled}} {
		ev := RebootEvent("n1", "n1-reboot", c.boot, "kernel")
		if err := g.r.Request(ctx, RebootKey, ev); err != nil {
			t.Fatal(err)
		}
		// The engine runs it, moves it to history, deletes it.
		uid := fmt.Sprintf("uid-%d", i)
		if err := g.j.PutEvent(journal.EventRecord{UID: uid, Name: ev.Name, State: journal.EventFinishing}); err != nil {
			t.Fatal(err)
		}
		if err := g.j.FinishEvent(uid, c.outcome, ""); err != nil {
			t.Fatal(err)
		}
		g.api.mu.Lock()
		delete(g.api.events, ev.Name)
		g.api.mu.Unlock()
		g.r.Reconcile(ctx)
		g.r.Release(ctx, RebootKey)
	}
	if got := g.api.breaker["auto-reboot"]; !slices.Equal(got, []string{"n1-reboot-aaaaaaaa"}) {
		t.Fatalf("breaker %v, want the Failed event's only (found gone: its outcome is in the journal's history)", got)
	}
	if v := testutil.ToFloat64(g.r.failed); v != 1 {
		t.Fatalf("auto_request_failures_total %v, want 1", v)
	}
}

// NewRequester refuses what it cannot work with.
func TestNewRequesterRefuses(t *testing.T) {
	g := newRig(t, 1)
	base := RequestConfig{Need: "reboot", KeyPrefix: RebootKey, Group: "g", MaxConcurrent: 1, BreakerFailures: 1,
		API: g.api, Journal: g.j, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for name, mod := range map[string]func(*RequestConfig){
		"no group":          func(c *RequestConfig) { c.Group = "" },
		"maxConcurrent 0":   func(c *RequestConfig) { c.MaxConcurrent = 0 },
		"breakerFailures 0": func(c *RequestConfig) { c.BreakerFailures = 0 },
		"no journal":        func(c *RequestConfig) { c.Journal = nil },
	} {
		c := base
		mod(&c)
		if _, err := NewRequester(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := g.r.Request(context.Background(), "gpu-reset/GPU-1", RebootEvent("n1", "t", "b", "r")); err == nil {
		t.Error("a key of another requester was accepted")
	}
}
