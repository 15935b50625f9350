package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// Config wires an Engine. Every field but Metrics and Notify is required.
type Config struct {
	Node     string
	Identity string // unique per agent process lineage: node + machine + journal
	// FormerIdentities are older identities of this agent lineage (an
	// older agent's on this journal): its finished events are collected as
	// ours. They never make an event adoptable from the API alone.
	FormerIdentities []string
	API              *apiclient.Client
	Journal          *journal.Journal
	Drivers          []drivers.Driver
	// Host performs (or simulates) host actions; its BootID stamps intents.
	Host  drivers.HostOps
	Clock clock.Clock
	Log   *slog.Logger
	// EventRetention keeps finished events this long (0: delete at once).
	EventRetention time.Duration
	// LeaseDuration of the node and slot Leases (default 40 s), renewed every third.
	LeaseDuration time.Duration
	// Resync is how often the engine looks again without a watch event (default 5 s).
	Resync time.Duration
	// Notify receives a one-line state for systemd's STATUS=.
	Notify  func(status string)
	Metrics *Metrics
	// Windows: a disruptive event starts only inside one (none: any time).
	Windows maintenance.Windows
	// Gates must pass before a disruptive event starts.
	Gates []maintenance.Gate
	// Notices, when set, turns notifications on: the engine queues a
	// notice in the journal at a claim, a failed step and an end state
	// (notices.go) and calls Notices after each commit that queued one,
	// to wake the notifier (internal/notify). It must not block.
	Notices func()
	// UnfilteredWatch watches every LifecycleEvent instead of this node's
	// (spec.bindingNode, filtered by the server). Only bench/ sets it, to
	// measure what the server-side filter saves; candidates() still keeps
	// this node's events only.
	UnfilteredWatch bool
	// ShutdownReturn is what the boot after a shutdown waits for before
	// the uncordon that gives the node back (shutdown_return.go): the
	// reboot driver's wait-ready and wait-workloads-ready. Zero: nothing,
	// the node is uncordoned as soon as the API server answers.
	ShutdownReturn drivers.NodeReturn
}

// watchDegraded is how long after a failure of the event watch the engine
// does not trust it alone: client-go's reflector backs off up to 30 s.
const watchDegraded = 35 * time.Second

// Engine runs this node's events.
type Engine struct {
	cfg Config
	log *slog.Logger
	// dmu guards drivers and cfg.Drivers: AddDriver adds to them after
	// start (the GPU stack once NVML loads), the control socket reads them.
	dmu       sync.RWMutex
	drivers   map[string]drivers.Driver
	republish bool // a driver was added: publish the transitions again

	wake      chan struct{}
	flushWake chan struct{}
	flushed   chan struct{}        // poked after each outbox delivery (finish waits on it)
	deleted   map[string]time.Time // UIDs collect deleted, until the watch catches up
	// ended: UIDs of the events finish moved to history, and when. The
	// watch can run behind our own writes (a loaded server: seconds at
	// 1,000 agents) and still show an event just finished as it was
	// created, Pending; it is never claimed again from that copy
	// (candidates) nor released as an orphan (releaseOrphans). Kept 10
	// minutes; past that the claim's resourceVersion guard still refuses.
	ended    map[string]time.Time
	nextUndo time.Time            // when retryLeftoverUndo looks again
	orphanAt map[string]time.Time // releaseOrphans: when it last tried each event (by UID)
	// leaseSweep: releaseStaleLeases is due (after the start, a failed
	// claim, an orphan released) and runs at the next idle round.
	leaseSweep bool
	sweepAfter time.Time // after a failed sweep: not before then
	// planned is the event whose MaintenancePlanned=True the Node shows
	// (queueForSlot); plannedRead: the Node was read for it since the start.
	planned     string
	plannedRead bool
	// tookOverAt: when takeOver last looked at an event (by UID), so that
	// a live twin's event costs its reads once per takeOverEvery, not at
	// every pass.
	tookOverAt map[string]time.Time
	slotQueued bool // an event waits for a disruption slot: look again soon
	// The gates' last blockers, how many evaluations in a row blocked, and
	// when they are evaluated again (startWait).
	gateBlockers []string
	gateFails    int
	gateNext     time.Time
	watch        *apiclient.EventWatch

	beat atomic.Int64 // UnixNano of the engine's last sign of progress (Healthy)

	// lazy: outbox entries (by seq) of pushStatusLazy and when they go out.
	lazyMu sync.Mutex
	lazy   map[uint64]time.Time

	mu      sync.Mutex
	current *active
	last    *v1alpha1.LifecycleEvent // the running event as our last write of it returned (remember)
	state   string
	// preShutdown is the state a same-boot shutdown replaced ("shutting
	// down"): a cancel puts it back.
	preShutdown string
	// returning stops the wait of a shutdown's close-out
	// (returnAfterShutdown) when logind announces another shutdown.
	returning context.CancelFunc
	// closeOutAgain: a shutdown cancelled after it cut an earlier one's
	// close-out short; the loop closes that one out again.
	closeOutAgain atomic.Bool
	// shutdownCordon serialises the shutdown cordon's hand-over in this
	// process (a one-slot semaphore): PrepareShutdown's ownership read and
	// cordon (or, past its budget, lateShutdownCordon's), and an earlier
	// shutdown's close-out check and uncordon.
	shutdownCordon chan struct{}
	// runCtx is Run's context, for work that outlives a call: a shutdown's
	// cordon made once an earlier shutdown's close-out is done
	// (lateShutdownCordon). Nil before Run.
	runCtx context.Context
	// pastTurn: a shutdown of this boot queued its Node conditions
	// without waiting for an earlier shutdown's close-out (its budget ran
	// out, ownShutdownCordon); that close-out then queues none of its own
	// while the shutdown is underway (closeShutdown). turnMu orders the
	// two: the close-out checks and queues, or the shutdown marks, first.
	// lateCancel stops that shutdown's late cordon (a cancel).
	turnMu     sync.Mutex
	pastTurn   bool
	lateCancel context.CancelFunc
}

// New checks cfg and returns an Engine.
func New(cfg Config) (*Engine, error) {
	switch {
	case cfg.Node == "", cfg.API == nil, cfg.Journal == nil, cfg.Clock == nil, cfg.Log == nil, cfg.Host == nil:
		return nil, errors.New("engine: Config needs Node, API, Journal, Clock, Log and Host")
	}
	if cfg.Identity == "" {
		cfg.Identity = cfg.Node
	}
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 40 * time.Second
	}
	if cfg.Resync == 0 {
		cfg.Resync = 5 * time.Second
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	e := &Engine{cfg: cfg, log: cfg.Log, drivers: map[string]drivers.Driver{},
		wake: make(chan struct{}, 1), flushWake: make(chan struct{}, 1), flushed: make(chan struct{}, 1), deleted: map[string]time.Time{},
		ended: map[string]time.Time{}, shutdownCordon: make(chan struct{}, 1)}
	for _, d := range cfg.Drivers {
		e.drivers[d.Name()] = d
	}
	return e, nil
}

// stallAfter is how long the engine may show no progress before Healthy
// fails: well above its longest quiet stretch (a 2-minute retry inside
// finish, where the outbox wait still beats every 500 ms; Resync 5 s).
const stallAfter = 3 * time.Minute

// alive records progress: the main loop's turns, a running event's guard
// (every second), the end's wait for the outbox, the publish retries.
func (e *Engine) alive() { e.beat.Store(e.cfg.Clock.Now().UnixNano()) }

// Healthy fails when the engine has shown no progress for stallAfter: a
// wedged loop. systemd's watchdog and /healthz use it, so systemd restarts
// a wedged agent (which then resumes from the journal).
func (e *Engine) Healthy() error {
	last := e.beat.Load()
	if last == 0 {
		return nil // not started yet: start-up has its own timeout (READY)
	}
	if age := e.cfg.Clock.Since(time.Unix(0, last)); age > stallAfter {
		return fmt.Errorf("engine: no progress for %s (state %q)", age.Round(time.Second), e.State())
	}
	return nil
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// setState is the one place a state change is announced: it logs from → to
// and updates systemd's STATUS=.
func (e *Engine) setState(s string, attrs ...any) {
	e.mu.Lock()
	from := e.state
	if from == s {
		e.mu.Unlock()
		return
	}
	e.state = s
	e.mu.Unlock()
	e.log.Info("state", append([]any{"from", from, "to", s}, attrs...)...)
	if e.cfg.Notify != nil {
		e.cfg.Notify(s)
	}
}

// swapState is setState(to) only while the state is still from: a change
// announced in between (an event's step) is kept.
func (e *Engine) swapState(from, to string) {
	e.mu.Lock()
	if e.state != from {
		e.mu.Unlock()
		return
	}
	e.state = to
	e.mu.Unlock()
	e.log.Info("state", "from", from, "to", to)
	if e.cfg.Notify != nil {
		e.cfg.Notify(to)
	}
}

// State returns the current one-line state.
func (e *Engine) State() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

// Run publishes transitions, watches this node's events and runs them until
// ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	e.mu.Lock()
	e.runCtx = ctx
	e.mu.Unlock()
	go e.flushLoop(ctx)
	e.alive()
	e.setState("starting")
	// The watch starts first, so that an event resumed from the journal
	// sees its own deletion (a cancel while the agent was down) as soon as
	// the API answers; it never blocks: offline, the informer retries.
	w, err := e.cfg.API.WatchEvents(ctx, func(name string) { e.onEvent(name) }, e.cfg.UnfilteredWatch)
	if err != nil {
		return err
	}
	e.cfg.API.WatchTransitions(ctx) // the claim reads this node's transitions from it
	e.mu.Lock()
	e.watch = w
	e.mu.Unlock()
	// Local work first: resume what the journal says is unfinished, even
	// while the API server is unreachable.
	recs, err := e.cfg.Journal.Events()
	if err != nil {
		return fmt.Errorf("engine: read journal: %w", err)
	}
	for _, r := range recs {
		if r.Driver == ShutdownDriver || r.Driver == requestDriver {
			continue // closed out or published below, once the API answers
		}
		a, err := e.resume(r)
		if err != nil {
			e.log.Error("cannot resume event from journal", "event", r.Name, "err", err)
			continue
		}
		e.execute(ctx, a)
	}
	// Then the API: publish our transitions and watch our events.
	for ctx.Err() == nil {
		e.alive()
		if err := e.publish(ctx); err == nil {
			break
		} else {
			e.log.Warn("publishing transitions failed; retrying", "err", err)
		}
		if !e.sleep(ctx, e.cfg.Resync) {
			return nil
		}
	}
	e.closeOutShutdowns(ctx)
	e.publishRequests(ctx)
	e.leaseSweep = true // a claim cut short by the last stop may have left Leases held
	e.mu.Lock()
	cur := e.state
	if cur == stateShuttingDown {
		// A shutdown announced meanwhile holds the state; its cancel
		// puts back idle, not the start's state.
		e.preShutdown = "idle"
	}
	e.mu.Unlock()
	if cur != stateShuttingDown {
		e.swapState(cur, "idle")
	}
	// relist: after the API server answers again following failures, the
	// watch may have missed events (a dead connection is found late, and
	// the reflector backs off up to 30 s before it lists again): read this
	// node's events directly and claim from that (docs/reliability.md).
	relist := false
	for ctx.Err() == nil {
		e.alive()
		var fresh []*v1alpha1.LifecycleEvent
		if relist {
			// A short timeout of its own: a connection dialled during the
			// outage can sit in its TLS handshake for 10 s; the next try
			// dials anew.
			lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var err error
			fresh, err = e.cfg.API.ListEvents(lctx)
			cancel()
			if err != nil {
				e.log.Info("listing this node's events after an outage failed; will retry", "err", err)
				fresh = nil
			} else {
				relist = false
				e.cfg.Metrics.Relists.Inc()
				e.log.Debug("listed this node's events after an outage", "events", len(fresh))
			}
		}
		e.republishIfAdded(ctx)
		if e.closeOutAgain.Swap(false) {
			e.closeOutShutdowns(ctx) // an earlier shutdown's, cut short by a cancelled one
			e.swapState(stateReturning, "idle")
		}
		if w.Synced() || fresh != nil {
			if a := e.tryClaim(ctx, fresh); a != nil {
				e.execute(ctx, a)
				continue
			}
			if w.Synced() {
				e.collect(ctx)
			}
			e.retryLeftoverUndo(ctx)
			if w.Synced() {
				e.releaseOrphans(ctx)
				e.sweepLeases(ctx)
			}
			e.publishRequests(ctx)
		}
		// While the server does not answer, or for watchDegraded after the
		// watch failed (the reflector backs off up to 30 s before it lists
		// again), look every second with one direct list, so that an event
		// created meanwhile is claimed within a second of the server's
		// return, whatever the watch's back-off.
		next := e.cfg.Resync
		if e.slotQueued && next > 2*time.Second {
			next = 2 * time.Second // slot Leases are not watched
		}
		if e.untrusted(w) {
			next, relist = time.Second, true
		}
		select {
		case <-ctx.Done():
		case <-e.wake:
		case <-e.cfg.API.ContactRegained():
			relist = true
		case <-e.cfg.Clock.After(next):
		}
	}
	return nil
}

func (e *Engine) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-e.cfg.Clock.After(d):
		return true
	}
}

// onEvent is the watch callback: wake the loop, and cancel the running
// event at its next safe point when it is being deleted.
func (e *Engine) onEvent(name string) {
	poke(e.wake)
	e.mu.Lock()
	a, w := e.current, e.watch
	e.mu.Unlock()
	if a == nil || a.name != name || w == nil {
		return
	}
	ev, ok := w.Get(name)
	if !ok || !sameLive(ev, a) {
		a.cancel(errCancelled)
	}
}

// untrusted reports whether the watch's cache may be missing changes: the
// server does not answer, no watch is open (the reflector is backing off),
// or the watch failed within watchDegraded.
func (e *Engine) untrusted(w *apiclient.EventWatch) bool {
	return !e.cfg.API.Contact().Reachable || !w.Watching() || e.cfg.Clock.Since(w.LastError()) < watchDegraded
}

// sameLive reports whether ev is a's event (same UID, when a has one) and
// not being deleted.
func sameLive(ev *v1alpha1.LifecycleEvent, a *active) bool {
	return ev.DeletionTimestamp == nil && (a.uid == "" || string(ev.UID) == a.uid)
}

// behind reports whether the watch's copy of the running event is older
// than what our own last write of it returned: the watch has not shown our
// write, so it is lagging or dead (a half-open connection is found only
// seconds later) and a deletion may be missing from it too.
func (e *Engine) behind(cached *v1alpha1.LifecycleEvent) bool {
	last := e.recalled(string(cached.UID))
	if last == nil {
		return false
	}
	c, err1 := strconv.ParseUint(cached.ResourceVersion, 10, 64)
	l, err2 := strconv.ParseUint(last.ResourceVersion, 10, 64)
	if err1 != nil || err2 != nil {
		return cached.ResourceVersion != last.ResourceVersion
	}
	return c < l
}

// checkGone cancels a when the API says its event is being deleted, is
// gone, or was replaced by another of the same name. The watch's cache
// answers when it has synced and agrees; anything else (not synced yet, as
// right after a restart, or the cache disagrees) is confirmed by a read, so
// a lagging cache never cancels a live event. An unreachable server proves
// nothing: offline, the event goes on.
func (e *Engine) checkGone(ctx context.Context, a *active, mustRead bool) {
	e.mu.Lock()
	w := e.watch
	e.mu.Unlock()
	if w != nil && w.Synced() && !mustRead {
		ev, ok := w.Get(a.name)
		if ok && sameLive(ev, a) && !e.behind(ev) && !e.untrusted(w) {
			return
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev, err := e.cfg.API.GetEvent(rctx, a.name)
	switch {
	case apiclient.IsNotFound(err):
	case err != nil:
		return
	case sameLive(ev, a):
		a.mu.Lock()
		a.confirmed = true
		a.mu.Unlock()
		return
	}
	e.log.Info("the event was deleted: cancelling at the next safe point", "event", a.name)
	a.cancel(errCancelled)
}

func (e *Engine) publish(ctx context.Context) error {
	node, err := e.cfg.API.GetNode(ctx)
	if err != nil {
		return err
	}
	var want []v1alpha1.LifecycleTransition
	for _, d := range e.driverList() {
		nodeName := e.cfg.Node
		t := v1alpha1.LifecycleTransition{
			ObjectMeta: metav1.ObjectMeta{Name: TransitionName(e.cfg.Node, d)},
			Spec: v1alpha1.LifecycleTransitionSpec{Start: v1alpha1.StateName(d.Start()), End: v1alpha1.StateName(d.End()),
				NodeName: &nodeName, Driver: d.Name()},
		}
		if d.SLA() > 0 { // 0: no deadline (an exec driver without sla)
			t.Spec.Sla = &metav1.Duration{Duration: d.SLA()}
		}
		want = append(want, t)
	}
	return e.cfg.API.PublishTransitions(ctx, node, want)
}

// AddDriver registers a driver after the engine started — the gpu-reset
// driver once NVML loads, when the GPU Operator started the driver after
// the agent — and has the engine publish its transition at its next turn.
// A driver already registered under that name is left as it is.
func (e *Engine) AddDriver(d drivers.Driver) {
	e.dmu.Lock()
	if _, ok := e.drivers[d.Name()]; !ok {
		e.drivers[d.Name()] = d
		e.cfg.Drivers = append(e.cfg.Drivers, d)
		e.republish = true
	}
	e.dmu.Unlock()
	poke(e.wake)
}

// driverList is a copy of the registered drivers, in registration order.
func (e *Engine) driverList() []drivers.Driver {
	e.dmu.RLock()
	defer e.dmu.RUnlock()
	return slices.Clone(e.cfg.Drivers)
}

// driverFor is the registered driver of that full name, if any.
func (e *Engine) driverFor(name string) (drivers.Driver, bool) {
	e.dmu.RLock()
	defer e.dmu.RUnlock()
	d, ok := e.drivers[name]
	return d, ok
}

// republishIfAdded publishes the transitions again after AddDriver; a
// failure is retried at the next turn.
func (e *Engine) republishIfAdded(ctx context.Context) {
	e.dmu.Lock()
	again := e.republish
	e.republish = false
	e.dmu.Unlock()
	if !again {
		return
	}
	if err := e.publish(ctx); err != nil {
		e.log.Warn("publishing the transitions of an added driver failed; will retry", "err", err)
		e.dmu.Lock()
		e.republish = true
		e.dmu.Unlock()
		return
	}
	e.log.Info("published the transitions again: a driver was added")
}

// TransitionName is the name of the transition the agent publishes for a driver.
func TransitionName(node string, d drivers.Driver) string { return node + "-" + d.Short() }

// candidates returns this node's claimable events, oldest first: from
// fresh (a direct list) when given, else from the watch's cache.
func (e *Engine) candidates(fresh []*v1alpha1.LifecycleEvent) []*v1alpha1.LifecycleEvent {
	if fresh == nil {
		fresh = e.watch.List()
	}
	var out []*v1alpha1.LifecycleEvent
	for _, ev := range fresh {
		if ev.DeletionTimestamp != nil || ev.Spec.BindingNode != e.cfg.Node {
			continue
		}
		if _, done := e.ended[string(ev.UID)]; done {
			continue // finished by us; the copy is older than its end
		}
		cs := ev.Status.ClaimStatus
		mine := cs == v1alpha1.LifecycleEventClaimed && ev.Status.Holder != nil && ev.Status.Holder.Identity == e.cfg.Identity
		if cs == "" || cs == v1alpha1.LifecycleEventPending || mine {
			out = append(out, ev)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		ti, tj := out[i].CreationTimestamp, out[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// collect deletes our finished events once eventRetention has passed.
func (e *Engine) collect(ctx context.Context) {
	now := e.cfg.Clock.Now()
	for _, ev := range e.watch.List() {
		if !ev.Status.ClaimStatus.Finished() || ev.Status.CompletionTime == nil || ev.DeletionTimestamp != nil {
			continue
		}
		if ev.Status.Holder == nil || ev.Status.Holder.Identity != e.cfg.Identity && !slices.Contains(e.cfg.FormerIdentities, ev.Status.Holder.Identity) {
			continue
		}
		if now.Before(ev.Status.CompletionTime.Add(e.cfg.EventRetention)) {
			continue
		}
		if _, done := e.deleted[string(ev.UID)]; done {
			continue // deleted; the watch has not said so yet
		}
		if err := e.cfg.API.DeleteEvent(ctx, ev); err != nil {
			e.log.Warn("deleting a finished event failed", "event", ev.Name, "err", err)
			continue
		}
		e.deleted[string(ev.UID)] = now
	}
	for _, m := range []map[string]time.Time{e.deleted, e.ended} {
		maps.DeleteFunc(m, func(_ string, at time.Time) bool { return now.Sub(at) > 10*time.Minute })
	}
}

// retryLeftoverUndo undoes, while idle, a cordon the journal says an event
// made whose event has ended without success: its abort could not undo it
// (the API refused for the 2 minutes abort retries). The journal's record is
// dropped once the node is uncordoned (or the cordon is no longer ours: its
// annotation names someone else). A succeeded drain's cordon is its
// contract and is kept. An os-upgrade's cordon is undone only once its
// upgrade unit is known to have ended (its abort keeps the node cordoned
// while the unit may still run). A kept cordon's record (drivers.CordonKept)
// of an ended event, left by a crash in finish, is dropped and the cordon
// left. It looks at most every 30 s.
func (e *Engine) retryLeftoverUndo(ctx context.Context) {
	now := e.cfg.Clock.Now()
	if now.Before(e.nextUndo) {
		return
	}
	e.nextUndo = now.Add(30 * time.Second)
	owned, err := e.cfg.Journal.Owned()
	if err != nil || len(owned) == 0 {
		return
	}
	hist, err := e.cfg.Journal.History()
	if err != nil {
		return
	}
	outcome := map[string]journal.Outcome{}
	for _, h := range hist {
		// An os-upgrade's abort keeps the node cordoned on purpose while
		// its unit may still run (drivers.OSUpgrade.Abort): retried only
		// once the unit has ended, never while its state is unknown.
		if strings.HasSuffix(h.Event.Driver, "/os-upgrade") {
			if active, err := e.cfg.Host.UnitActive(ctx, drivers.OSUpgradeUnit(h.Event.Name)); err != nil || active {
				continue
			}
		}
		outcome[h.Event.UID] = h.Outcome
	}
	for _, ch := range owned {
		if _, ended := outcome[ch.EventUID]; ended && ch.Kind == journal.ChangeCordon && ch.Node == drivers.CordonKept(e.cfg.Node).Key && ch.Name == "" {
			// A kept cordon's record left by a crash between the event's
			// move to history and finish dropping it (abort keeps it until
			// then): the cordon itself stays for an admin.
			if err := e.cfg.Journal.RemoveOwned(ch.Key()); err != nil {
				e.log.Warn("dropping a kept cordon's record failed", "event", ch.Value, "err", err)
			} else {
				e.log.Info("dropped the record of an ended event's kept cordon; the cordon stays for an admin", "event", ch.Value)
			}
			continue
		}
		if ch.Kind != journal.ChangeCordon || ch.Node != e.cfg.Node || ch.Name != "" || ch.Value == "" {
			continue
		}
		if o, ok := outcome[ch.EventUID]; !ok || o == journal.OutcomeSucceeded {
			continue // still running, or a drain's cordon by contract
		}
		_, err := e.cfg.API.Uncordon(ctx, ch.Value, false)
		if err != nil && !errors.Is(err, apiclient.ErrCordonNotOurs) {
			e.log.Warn("undoing a leftover cordon failed; will retry", "event", ch.Value, "err", err)
			continue
		}
		if err := e.cfg.Journal.RemoveOwned(ch.Key()); err != nil {
			e.log.Warn("dropping a leftover cordon record failed", "event", ch.Value, "err", err)
			continue
		}
		e.log.Info("undid a leftover cordon of an event that ended without success", "event", ch.Value, "outcome", outcome[ch.EventUID].String())
	}
}

// releaseOrphans lets go of deleted events of this node that carry our
// finalizer but that no agent will ever finish: not in our journal (it
// was lost, or moved aside as corrupt), held by us, by a former identity
// of ours, or by a holder whose node Lease is not live when this host is
// the Node's machine (its boot ID is the one the kubelet reports: an agent
// on a machine that was re-imaged or replaced, its identity gone for good).
// An event held by a live holder (another agent given this node name) is
// left to it. Releasing undoes what the event is known to have left on
// the Node — its cordon (cordoned-by names it) and a LifecycleTransition
// condition in progress for it — then removes the finalizer. An event
// that is not deleted is never taken over: an operator deletes it to
// cancel it (docs/reliability.md#identity). Each event is tried at most
// every 10 s.
func (e *Engine) releaseOrphans(ctx context.Context) {
	now := e.cfg.Clock.Now()
	var mine map[string]bool
	for _, ev := range e.watch.List() {
		if ev.DeletionTimestamp == nil || ev.Spec.BindingNode != e.cfg.Node || !slices.Contains(ev.Finalizers, v1alpha1.Finalizer) {
			continue
		}
		uid := string(ev.UID)
		if _, done := e.ended[uid]; done {
			continue // finished by us, finalizer off: the copy is older than that
		}
		if at, ok := e.orphanAt[uid]; ok && now.Sub(at) < 10*time.Second {
			continue
		}
		if e.orphanAt == nil {
			e.orphanAt = map[string]time.Time{}
		}
		e.orphanAt[uid] = now
		if mine == nil {
			mine = map[string]bool{}
			recs, err := e.cfg.Journal.Events()
			if err != nil {
				return
			}
			for _, r := range recs {
				mine[r.UID] = true
			}
		}
		if mine[uid] {
			continue // ours to finish: replay or the running event does it
		}
		holder := ""
		if ev.Status.Holder != nil {
			holder = ev.Status.Holder.Identity
		}
		if holder != "" && holder != e.cfg.Identity && !slices.Contains(e.cfg.FormerIdentities, holder) {
			live, err := e.cfg.API.NodeLeaseHolder(ctx, now)
			if err != nil || live == holder {
				continue // its holder is alive (or we cannot tell): its holder finishes it
			}
			// An expired Lease does not show that its holder is gone (a long
			// reboot or a partition outlasts any Lease: DESIGN §6): only
			// the Node's own machine — the host whose boot ID its kubelet
			// reports, as takeOver asks — lets another identity's event go.
			// A twin (another machine given this node's name) never does:
			// it would uncordon the node under a host still rebooting.
			if n, err := e.cfg.API.GetNode(ctx); err != nil || n.Status.NodeInfo.BootID != e.cfg.Host.BootID() {
				// A twin may wait for good: look again in 30 s, not 10.
				e.orphanAt[uid] = now.Add(20 * time.Second)
				continue
			}
		}
		if err := e.releaseOrphan(ctx, ev, now); err != nil {
			e.log.Warn("releasing a deleted event that no agent holds failed; will retry", "event", ev.Name, "holder", holder, "err", err)
			continue
		}
		e.log.Info("released a deleted event that no agent will finish: undid its cordon, removed the finalizer", "event", ev.Name, "holder", holder)
		e.leaseSweep = true // ours, its Leases may still be held for it
	}
}

func (e *Engine) releaseOrphan(ctx context.Context, ev *v1alpha1.LifecycleEvent, now time.Time) error {
	if _, err := e.cfg.API.Uncordon(ctx, ev.Name, false); err != nil && !errors.Is(err, apiclient.ErrCordonNotOurs) {
		return err
	}
	node, err := e.cfg.API.GetNode(ctx)
	if err != nil {
		return err
	}
	// Every condition still True for this event (its message names it) ends.
	var conds []apiclient.NodeCondition
	for _, c := range node.Status.Conditions {
		if c.Status == corev1.ConditionTrue && conditionOf(c.Message, ev.Name) {
			reason := ReasonEventCancelled
			if string(c.Type) == v1alpha1.NodeConditionLifecycleTransition {
				reason = journal.OutcomeCancelled.String()
			}
			conds = append(conds, apiclient.NodeCondition{Type: string(c.Type), Status: corev1.ConditionFalse, Reason: reason, Message: c.Message + "; cancelled: no agent holds it"})
		}
	}
	if len(conds) > 0 {
		if err := e.cfg.API.SetNodeConditions(ctx, now, conds...); err != nil {
			return err
		}
	}
	return e.cfg.API.SetFinalizer(ctx, ev.Name, string(ev.UID), false)
}

var (
	errCancelled = errors.New("cancelled: the event was deleted")
	errDeadline  = errors.New("the sla deadline passed")
	errSlotLost  = errors.New("the disruption slot was lost")
)

func errorsIs(err, target error) bool { return errors.Is(err, target) }
