package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// active is the event being run.
type active struct {
	name, uid, tn string
	ev            *v1alpha1.LifecycleEvent
	driver        drivers.Driver
	steps         []drivers.Step
	params        map[string]string // as resolved at claim (drivers.Resolver) and journaled
	status        v1alpha1.LifecycleEventStatus
	deadline      time.Time
	slot          string
	jstate        journal.EventState
	failNow       error  // refuse before the first step (bad parameters)
	nodeStarted   bool   // the Node condition "in progress" is queued
	lastNode      string // the Node conditions last queued (pushNode)
	resumed       bool   // from the journal after a restart (not claimed by this process)
	// seedSteps and seedOwned: an adoption's history rebuilt from the API,
	// committed with its first snapshot (then nil).
	seedSteps []journal.StepRecord
	seedOwned []journal.Change
	// planned: the Node's MaintenancePlanned=True named this event when it
	// was claimed (it waited for a window or the gates): its conditions
	// set it False. Journaled ("planned"), for a replay's conditions.
	planned bool
	// returned: the abort undid everything, the cordon included, so a
	// drain this event completed no longer holds (Drained=False/
	// ReturnedToService). Set again when an abort is replayed; the
	// engine's goroutine alone reads and writes it.
	returned bool
	// outcome is journaled (attrs) when the abort or the finish begins.
	outcome    journal.Outcome
	outcomeMsg string
	// notices wait for the next snapshot, which queues them (note).
	notices []journal.Notice

	// renew is the running renewLoop's, ended by finish before the
	// Leases are released (nil outside execute).
	renew *renewal

	mu         sync.Mutex
	cancelErr  error
	cancelStep context.CancelFunc
	confirmed  bool // a read since the start showed the event alive
	waiting    bool // waiting for a disruption slot

	// statusMu guards status against steps' Progress calls (from other
	// goroutines) and status readers; the engine's own goroutine writes it
	// only while no step runs.
	statusMu sync.Mutex
}

func (a *active) cancel(why error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cancelErr == nil {
		a.cancelErr = why
	}
	if a.cancelStep != nil {
		a.cancelStep()
	}
}

// heldSlot and setSlot guard slot between the engine and renewLoop.
func (a *active) heldSlot() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.slot
}

func (a *active) setSlot(s string) {
	a.mu.Lock()
	a.slot = s
	a.mu.Unlock()
}

func (a *active) waitingSlot() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waiting
}

func (a *active) setWaiting(w bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.waiting = w
}

func (a *active) cancelled() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cancelErr
}

// execute runs a claimed or resumed event to an end state.
func (e *Engine) execute(ctx context.Context, a *active) {
	e.mu.Lock()
	e.current = a
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.current = nil
		e.mu.Unlock()
	}()
	guardCtx, stopGuard := context.WithCancel(ctx)
	defer stopGuard()
	a.renew = newRenewal(ctx)
	defer a.renew.end()
	go e.renewLoop(a, a.renew)
	if a.resumed {
		// The event may have been deleted while the agent was down: ask
		// before anything is done (offline, this proves nothing and the
		// event goes on; the guard below looks again).
		e.checkGone(ctx, a, true)
	}
	go e.guardLoop(guardCtx, a)

	if a.jstate == journal.EventFinishing {
		outcome, msg := e.journaledOutcome(a)
		e.finish(ctx, a, outcome, msg)
		return
	}
	if a.jstate == journal.EventAborting {
		// The agent stopped (or died) during the abort: the outcome was
		// journaled when the abort began. Undo again (every undo is
		// idempotent) and end it; the failed step is never run again and a
		// cancel is never forgotten.
		outcome, msg := e.journaledOutcome(a)
		if !e.abort(ctx, a, outcome, msg) {
			return
		}
		e.finish(ctx, a, outcome, msg)
		return
	}
	if a.failNow != nil {
		// Refused before the first step (bad parameters), or on replay (the
		// driver is gone, the journaled plan does not decode): whatever a
		// started step may have changed is undone first.
		msg := a.failNow.Error()
		if e.anyStepStarted(a) && !e.abort(ctx, a, journal.OutcomeFailed, msg) {
			return
		}
		e.finish(ctx, a, journal.OutcomeFailed, msg)
		return
	}
	if len(a.status.Steps) != len(a.steps) {
		// A status from elsewhere (adopted) that does not match the plan.
		a.status.Steps = nil
		for _, s := range a.steps {
			a.status.Steps = append(a.status.Steps, v1alpha1.StepStatus{Name: s.Name, State: v1alpha1.StepPending})
		}
	}
	// Node condition: the transition is in progress (a fresh claim already
	// queued it, see claim).
	if !a.nodeStarted {
		e.pushNode(a, running)
	}
	outcome, msg := e.runSteps(ctx, a)
	if ctx.Err() != nil {
		return // the agent is stopping: resume from the journal next time
	}
	if outcome != journal.OutcomeSucceeded {
		if !e.abort(ctx, a, outcome, msg) {
			return // stopping during the abort: resumed into the abort next time
		}
	}
	e.finish(ctx, a, outcome, msg)
}

// anyStepStarted reports whether the journal holds a step record of a (an
// unreadable journal counts as started: the undo is idempotent).
func (e *Engine) anyStepStarted(a *active) bool {
	recs, err := e.cfg.Journal.Steps(a.uid)
	return err != nil || len(recs) > 0
}

// journaledOutcome is the outcome an event was ending with when the agent
// stopped: the one journaled when its abort or finish began, else (older
// journals) the one its status shows.
func (e *Engine) journaledOutcome(a *active) (journal.Outcome, string) {
	if a.outcome != 0 {
		return a.outcome, a.outcomeMsg
	}
	switch a.status.ClaimStatus {
	case v1alpha1.LifecycleEventSucceeded:
		return journal.OutcomeSucceeded, a.status.Message
	case v1alpha1.LifecycleEventSlaExpired:
		return journal.OutcomeSlaExpired, a.status.Message
	}
	return journal.OutcomeFailed, a.status.Message
}

// runSteps runs the remaining steps in order.
func (e *Engine) runSteps(ctx context.Context, a *active) (journal.Outcome, string) {
	recs, err := e.cfg.Journal.Steps(a.uid)
	if err != nil {
		return journal.OutcomeFailed, "journal: " + err.Error()
	}
	last := map[string]journal.StepRecord{}
	intents := map[string]journal.StepRecord{}
	attempts := map[string]int{}
	for _, r := range recs {
		last[r.Step] = r
		if r.Phase == journal.PhaseIntent {
			attempts[r.Step] = r.Attempt
			intents[r.Step] = r
		}
	}
	if a.jstate == journal.EventClaimed {
		if err := e.snapshot(a, journal.EventRunning); err != nil {
			return journal.OutcomeFailed, err.Error()
		}
	}
	for i, s := range a.steps {
		if r, ok := last[s.Name]; ok && r.Phase == journal.PhaseDone && r.State == journal.StepFailed {
			// Failed for good before a restart that came before the abort
			// was journaled (stepFailed, then the abort's snapshot): the
			// failure stands and goes to the abort. Run again, an upgrade
			// whose outcome could not be told (ErrUndecidable) would run
			// its profile a second time.
			st := &a.status.Steps[i]
			st.State, st.Attempt, st.Message = v1alpha1.StepFailed, int32(attempts[s.Name]), r.Message
			if in, ok := intents[s.Name]; ok {
				st.StartTime = ptrTime(in.At)
			}
			st.FinishTime = ptrTime(r.At)
			e.log.Info("resumed after a failed step: the failure stands", "event", a.name, "failed", s.Name)
			e.noteStepFailed(a, r.Message)
			return journal.OutcomeFailed, r.Message
		}
		if r, ok := last[s.Name]; ok && r.Phase == journal.PhaseDone && (r.State == journal.StepDone || r.State == journal.StepSkipped) {
			// Done before a restart: the status says what the journal says
			// (the snapshot it was resumed from may predate the step).
			st := &a.status.Steps[i]
			st.State = v1alpha1.StepDone
			if r.State == journal.StepSkipped {
				st.State = v1alpha1.StepSkipped
			}
			st.Attempt = int32(attempts[s.Name])
			if in, ok := intents[s.Name]; ok {
				st.StartTime = ptrTime(in.At)
			}
			st.FinishTime = ptrTime(r.At)
			if r.Message != "" {
				st.Message = r.Message
			}
			continue
		}
		if err := e.gate(ctx, a); err != nil {
			return e.stopped(a, err)
		}
		if s.Disruptive && a.ev.Spec.Disruption != nil && a.heldSlot() == "" {
			if err := e.waitSlot(ctx, a); err != nil {
				return e.stopped(a, err)
			}
		}
		rt := &stepRuntime{e: e, a: a}
		// A step whose intent was committed but not its completion: ask the
		// driver whether it took effect before doing it again.
		if r, ok := last[s.Name]; ok && r.Phase == journal.PhaseIntent && s.Done != nil {
			done, err := s.Done(ctx, rt, r.BootID)
			if errors.Is(err, drivers.ErrUndecidable) {
				// The attempt the intent was journaled for ends here.
				msg := fmt.Sprintf("step %s failed: %v", s.Name, err)
				a.status.Steps[i].StartTime, a.status.Steps[i].Attempt = ptrTime(r.At), int32(attempts[s.Name])
				e.stepFailed(a, i, attempts[s.Name], msg)
				return journal.OutcomeFailed, msg
			}
			if err == nil && done {
				a.status.Steps[i].StartTime = ptrTime(r.At) // when the intent was committed
				if err := e.stepDone(a, i, attempts[s.Name], "found done on replay"); err != nil {
					return journal.OutcomeFailed, err.Error()
				}
				continue
			}
		}
		for {
			attempts[s.Name]++
			err := e.runStep(ctx, a, i, attempts[s.Name], rt)
			if err == nil {
				break
			}
			if cerr := e.gate(ctx, a); cerr != nil {
				return e.stopped(a, cerr)
			}
			if s.NeedsAPI && isTransient(err) {
				e.log.Warn("step failed for a transient reason; retrying", "event", a.name, "step", s.Name, "err", err)
				if !e.sleep(ctx, retryWait(attempts[s.Name], err)) {
					return journal.OutcomeFailed, "agent stopping"
				}
				continue
			}
			msg := fmt.Sprintf("step %s failed: %v", s.Name, err)
			e.stepFailed(a, i, attempts[s.Name], msg)
			return journal.OutcomeFailed, msg
		}
	}
	return journal.OutcomeSucceeded, fmt.Sprintf("transition %s → %s complete", a.status.Driver.Start, a.status.Driver.End)
}

func backoff(attempt int) time.Duration {
	d := time.Second << min(attempt, 5)
	return min(d, 30*time.Second)
}

// unansweredRetry is how often a call is tried again while the API server
// cannot be reached at all (the connection refused or reset, no route, the
// name not resolvable): the cadence of the main loop's direct list in an
// outage, so that work held up by the outage (an event's finish, a step,
// the outbox) goes on within a second of the server's return rather than
// after a back-off grown to 30 s over the outage. Such a try costs the
// server nothing. timedOutRetry caps the back-off after a try that timed
// out or lost its connection (a blackholed link, or a server up but slow:
// each try there costs a TLS handshake). An answer that refuses (429, 5xx,
// a conflict) keeps the whole exponential back-off.
const (
	unansweredRetry = time.Second
	timedOutRetry   = 5 * time.Second
)

// retryWait is how long to wait before the next try of a call whose
// attempt-th try failed with err.
func retryWait(attempt int, err error) time.Duration {
	var st apierrors.APIStatus
	switch {
	case err == nil || errors.As(err, &st):
		// The server answered (429, 5xx, a conflict).
	case unreached(err):
		return min(backoff(attempt), unansweredRetry)
	case timedOut(err):
		return min(backoff(attempt), timedOutRetry)
	}
	return backoff(attempt)
}

// gate is the safe point between steps: cancellation and the deadline.
func (e *Engine) gate(ctx context.Context, a *active) error {
	if err := a.cancelled(); err != nil {
		return err
	}
	if !a.deadline.IsZero() && !e.cfg.Clock.Now().Before(a.deadline) {
		return errDeadline
	}
	return ctx.Err()
}

func (e *Engine) stopped(a *active, err error) (journal.Outcome, string) {
	switch {
	case errors.Is(err, errDeadline):
		return journal.OutcomeSlaExpired, fmt.Sprintf("sla deadline %s passed during step %s%s", a.deadline.UTC().Format(time.RFC3339), a.status.CurrentStep, lastWord(a))
	case errors.Is(err, errCancelled):
		return journal.OutcomeCancelled, errCancelled.Error()
	case errors.Is(err, errSlotLost):
		return journal.OutcomeFailed, fmt.Sprintf("stopped before step %s: %v", a.status.CurrentStep, err)
	}
	return journal.OutcomeFailed, err.Error()
}

func lastWord(a *active) string {
	if a.status.Message != "" && !strings.HasPrefix(a.status.Message, "claimed by") {
		return ": " + a.status.Message
	}
	return ""
}

// runStep is intent → commit → status → act → done → status for one step.
func (e *Engine) runStep(ctx context.Context, a *active, i, attempt int, rt *stepRuntime) error {
	s := a.steps[i]
	now := e.cfg.Clock.Now()
	if _, err := e.cfg.Journal.AppendStep(a.uid, journal.StepRecord{Step: s.Name, Phase: journal.PhaseIntent,
		State: journal.StepRunning, Attempt: attempt, BootID: e.cfg.Host.BootID()}); err != nil {
		return fmt.Errorf("journal intent: %w", err)
	}
	st := &a.status.Steps[i]
	st.State, st.Attempt, st.Message = v1alpha1.StepRunning, int32(attempt), ""
	st.StartTime, st.FinishTime = ptrTime(now), nil
	a.status.CurrentStep = s.Name
	setCond(&a.status, v1alpha1.ConditionProgressing, metav1.ConditionTrue, "StepRunning", "running step "+s.Name, now)
	if s.Done != nil {
		// A step with a Done check is not simply repeated: after a lost
		// journal the status's Running is what makes a replay ask before
		// acting again (rebuiltSteps). It goes out at once.
		e.pushStatus(a)
	} else {
		e.pushStatusLazy(a)
	}
	e.pushNode(a, running) // MaintenanceInProgress from the first disruptive step on
	e.setState(fmt.Sprintf("event %s: step %s", a.name, s.Name), "event", a.name, "step", s.Name)
	if s.Done != nil && !e.awaitStatus(ctx, a, runningDeliveryWait) {
		e.log.Info("acting before the API server has the step's Running (the journal holds its intent)", "event", a.name, "step", s.Name)
	}

	stepCtx, cancel := context.WithCancel(ctx)
	if !a.deadline.IsZero() {
		stepCtx, cancel = context.WithDeadline(ctx, a.deadline)
	}
	a.mu.Lock()
	a.cancelStep = cancel
	a.mu.Unlock()
	start := e.cfg.Clock.Now()
	// gofail: var engineBeforeSideEffect struct{}
	err := s.Run(stepCtx, rt)
	cancel()
	// gofail: var engineAfterSideEffect struct{}
	e.cfg.Metrics.StepDuration.WithLabelValues(a.driver.Short(), s.Name).Observe(e.cfg.Clock.Since(start).Seconds())
	if err != nil {
		return err
	}
	msg := ""
	if s.Cordons && e.ownsNot(a.uid, change(rt, drivers.Change{Kind: "cordon", Key: e.cfg.Node}).Key()) {
		// The node was cordoned already (an earlier drain event's cordon,
		// an admin's): this event's uncordon will leave it, and its done
		// record and status say so, which the Node's conditions read
		// (eventConditions: not back in service at the end). Decided here,
		// not at the uncordon, where a restart after the lift but before
		// its done record would find nothing owned either.
		msg = drivers.CordonNotOurs
	}
	return e.stepDone(a, i, attempt, msg)
}

func (e *Engine) stepDone(a *active, i, attempt int, msg string) error {
	s := a.steps[i]
	if _, err := e.cfg.Journal.AppendStep(a.uid, journal.StepRecord{Step: s.Name, Phase: journal.PhaseDone,
		State: journal.StepDone, Attempt: attempt, BootID: e.cfg.Host.BootID(), Message: msg}); err != nil {
		return fmt.Errorf("journal done: %w", err)
	}
	st := &a.status.Steps[i]
	st.State, st.FinishTime = v1alpha1.StepDone, ptrTime(e.cfg.Clock.Now())
	if attempt > 0 {
		st.Attempt = int32(attempt)
	}
	if msg != "" {
		st.Message = msg
	}
	e.pushNode(a, running) // DrainInProgress and Drained once wait-empty is done
	// No status write of its own: what comes next always writes one that
	// carries this step's Done — the next step's Running, the wait for a
	// disruption slot, or the end state — so a step costs one status write
	// and the event one more. The journal already holds the done record.
	return nil
}

func (e *Engine) stepFailed(a *active, i, attempt int, msg string) {
	s := a.steps[i]
	if _, err := e.cfg.Journal.AppendStep(a.uid, journal.StepRecord{Step: s.Name, Phase: journal.PhaseDone,
		State: journal.StepFailed, Attempt: attempt, BootID: e.cfg.Host.BootID(), Message: truncate(msg)}); err != nil {
		e.log.Error("journal step failure", "event", a.name, "step", s.Name, "err", err)
	}
	// gofail: var engineAfterStepFailed struct{}
	st := &a.status.Steps[i]
	st.State, st.FinishTime, st.Message = v1alpha1.StepFailed, ptrTime(e.cfg.Clock.Now()), truncate(msg)
	e.recordEvent(a, corev1.EventTypeWarning, "StepFailed", msg)
	e.noteStepFailed(a, msg)
}

// noteStepFailed queues the notice of a step's failure, committed with the
// abort's snapshot, which follows.
func (e *Engine) noteStepFailed(a *active, msg string) {
	e.note(a, journal.NoticeStepFailed, fmt.Sprintf("node %s: event %s: %s; undoing what it changed", e.cfg.Node, a.name, msg))
}

// waitSlot takes a disruption-budget slot, waiting (with the condition
// WaitingForDisruptionBudget) while all are taken.
func (e *Engine) waitSlot(ctx context.Context, a *active) error {
	d := a.ev.Spec.Disruption
	h := apiclient.LeaseHolder{Identity: e.cfg.Identity, Event: a.name, EventUID: a.uid, Duration: e.cfg.LeaseDuration}
	waiting := false
	for {
		slot, err := e.cfg.API.AcquireSlot(ctx, d.Group, int(d.MaxConcurrent), h, e.cfg.Clock.Now())
		if err == nil {
			a.setSlot(slot)
			a.setWaiting(false)
			if err := e.snapshot(a, journal.EventRunning); err != nil {
				return err
			}
			setCond(&a.status, v1alpha1.ConditionWaitingForDisruptionBudget, metav1.ConditionFalse, "SlotHeld", "holding "+slot, e.cfg.Clock.Now())
			e.pushStatus(a)
			e.pushNode(a, running)
			return nil
		}
		if !waiting {
			waiting = true
			a.setWaiting(true)
			msg := fmt.Sprintf("waiting for one of %d disruption slots of group %s", d.MaxConcurrent, d.Group)
			setCond(&a.status, v1alpha1.ConditionWaitingForDisruptionBudget, metav1.ConditionTrue, "AllSlotsTaken", msg, e.cfg.Clock.Now())
			a.status.Message = msg
			e.pushStatus(a)
			e.pushNode(a, running) // MaintenancePlanned
			e.setState(fmt.Sprintf("event %s: waiting for a disruption slot (%s)", a.name, d.Group))
		}
		if err := e.gate(ctx, a); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-e.cfg.Clock.After(2 * time.Second):
		}
	}
}

// guardLoop cancels the running event when the API says it was deleted or
// replaced, between the watch's notifications: right after a restart the
// watch has not synced, and a deletion that happened while the agent was
// down never shows as a watch event (see checkGone).
func (e *Engine) guardLoop(ctx context.Context, a *active) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.cfg.Clock.After(time.Second):
		}
		e.alive()
		if a.cancelled() != nil {
			continue
		}
		e.mu.Lock()
		w := e.watch
		e.mu.Unlock()
		a.mu.Lock()
		confirmed := a.confirmed
		a.mu.Unlock()
		if (w == nil || !w.Synced()) && confirmed {
			continue // seen alive; the watch takes over once it has synced
		}
		e.checkGone(ctx, a, false)
	}
}

// renewal stops an event's renewLoop.
type renewal struct {
	ctx    context.Context // the renewals' requests
	cancel context.CancelFunc
	done   chan struct{} // closed by renewLoop as it returns
}

func newRenewal(parent context.Context) *renewal {
	ctx, cancel := context.WithCancel(parent)
	return &renewal{ctx: ctx, cancel: cancel, done: make(chan struct{})}
}

// end stops the renewal and waits until renewLoop has returned, so that no
// renewal is sent after the Leases' release (finish): one that was took
// the just-released node Lease or slot back for an event that had ended,
// held at rest until it expired (a renewal reads a released Lease as
// free). A renewal in flight is cancelled rather than waited for (a
// silent server would hold it for the request timeout, per slot); if it
// still lands it carries the resourceVersion it read, so it lands before
// the release (which then reads it again on its 409) or is refused
// (both orders: test/e2e TestRenewalInFlightAtTheEnd). Idempotent; nil
// (no renewal) does nothing.
func (r *renewal) end() {
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

// renewLoop renews the node Lease and the slot while the event runs, until
// r.end or ctx's end.
func (e *Engine) renewLoop(a *active, r *renewal) {
	defer close(r.done)
	ctx := r.ctx
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.cfg.Clock.After(e.cfg.LeaseDuration / 3):
		}
		now := e.cfg.Clock.Now()
		h := apiclient.LeaseHolder{Identity: e.cfg.Identity, Event: a.name, EventUID: a.uid, Duration: e.cfg.LeaseDuration}
		if err := e.cfg.API.AcquireNodeLease(ctx, h, now); err != nil {
			e.log.Warn("renewing the node lease failed", "event", a.name, "err", err)
		}
		if slot := a.heldSlot(); slot != "" && a.ev.Spec.Disruption != nil {
			got, err := e.cfg.API.AcquireSlot(ctx, a.ev.Spec.Disruption.Group, int(a.ev.Spec.Disruption.MaxConcurrent), h, now)
			switch {
			case errors.Is(err, apiclient.ErrNoSlot):
				// Someone took our slot (an admin deleted or edited its
				// Lease) and every slot is taken: the budget is no longer
				// ours to spend. Stop at the next safe point.
				e.log.Error("the disruption slot was lost; stopping the event at the next safe point", "event", a.name, "slot", slot)
				a.cancel(fmt.Errorf("%w: %s of group %s is held by another event", errSlotLost, slot, a.ev.Spec.Disruption.Group))
			case err != nil:
				e.log.Warn("renewing the disruption slot failed", "event", a.name, "err", err)
			case got != slot:
				e.log.Warn("the disruption slot was lost, another one was free and is held now", "event", a.name, "lost", slot, "held", got)
				a.setSlot(got)
			}
		}
	}
}

func (e *Engine) recordEvent(a *active, typ, reason, msg string) {
	ev := a.ev
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.cfg.API.RecordEvent(ctx, ev, typ, reason, msg, e.cfg.Clock.Now()); err != nil {
			e.log.Debug("kubernetes event not recorded", "event", a.name, "err", err)
		}
	}()
}

// recordNodeEvent records a Kubernetes Event on this Node about a.
func (e *Engine) recordNodeEvent(a *active, typ, reason, msg string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.cfg.API.RecordNodeEvent(ctx, typ, reason, msg, e.cfg.Clock.Now()); err != nil {
			e.log.Debug("kubernetes event not recorded on the node", "event", a.name, "err", err)
		}
	}()
}

func ptrTime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }

func truncate(s string) string {
	if len(s) > 1024 {
		return s[:1021] + "..."
	}
	return s
}
