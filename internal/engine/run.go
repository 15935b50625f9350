package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	renewCtx, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	go e.renewLoop(renewCtx, a)
	if a.resumed {
		// The event may have been deleted while the agent was down: ask
		// before anything is done (offline, this proves nothing and the
		// event goes on; the guard below looks again).
		e.checkGone(ctx, a, true)
	}
	go e.guardLoop(renewCtx, a)

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
				if !e.sleep(ctx, backoff(attempts[s.Name])) {
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
		// acting again (rebuildSteps). It goes out at once.
		e.pushStatus(a)
	} else {
		e.pushStatusLazy(a)
	}
	e.pushNode(a, running) // MaintenanceInProgress from the first disruptive step on
	e.setState(fmt.Sprintf("event %s: step %s", a.name, s.Name), "event", a.name, "step", s.Name)

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
	return e.stepDone(a, i, attempt, "")
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
	st := &a.status.Steps[i]
	st.State, st.FinishTime, st.Message = v1alpha1.StepFailed, ptrTime(e.cfg.Clock.Now()), truncate(msg)
	e.recordEvent(a, corev1.EventTypeWarning, "StepFailed", msg)
	// With the abort's snapshot, which follows.
	e.note(a, journal.NoticeStepFailed, fmt.Sprintf("node %s: event %s: %s; undoing what it changed", e.cfg.Node, a.name, msg))
}

// abort undoes what the event owns: the driver's own abort, or by default
// the cordon we made. The outcome is journaled first, so a restart resumes
// straight into the abort and then the end state. It reports false when
// the agent is stopping (the abort resumes next time).
func (e *Engine) abort(ctx context.Context, a *active, outcome journal.Outcome, msg string) bool {
	a.outcome, a.outcomeMsg = outcome, truncate(msg)
	if !e.durably(ctx, a, "its abort", func() error { return e.snapshot(a, journal.EventAborting) }) {
		return false
	}
	// gofail: var engineDuringAbort struct{}
	if ctx.Err() != nil {
		return false
	}
	rt := &stepRuntime{e: e, a: a}
	var err error
	notOurs := false
	if ab, ok := a.driver.(drivers.Abortable); ok {
		// Every undo is idempotent, so an abort the API server did not
		// answer is run again, as the engine's own uncordon below is: an
		// abort right after a boot meets a network not up yet ("network
		// is unreachable"), and giving up there left the node cordoned
		// (the os-upgrade VM scenario found it).
		_, err = e.retryAPI(ctx, func(c context.Context) (bool, error) { return false, ab.Abort(c, rt) })
	} else {
		// The cordon this event made: the journal's ownership record, or
		// (when the journal lost it: moved aside as corrupt, a re-imaged
		// root) the Node's cordoned-by annotation naming this event.
		// Uncordon acts only on a cordon annotated with this event's name,
		// so a cordon of anyone else's is left alone.
		cordon := drivers.Change{Kind: "cordon", Key: e.cfg.Node}
		owned := rt.Owns(cordon)
		if kept := drivers.CordonKept(e.cfg.Node); rt.Owns(kept) {
			// The readiness checks timed out and readiness.onTimeout keeps
			// the node cordoned (drivers.Readiness): the cordon, its
			// annotation naming this event, is left for an admin; the
			// journal stops owning it, so nothing undoes it later.
			if owned {
				err = rt.Disown(cordon)
			}
			if err == nil {
				err = rt.Disown(kept)
			}
			notOurs = true // the node is not back
		} else {
			_, err = e.retryAPI(ctx, func(c context.Context) (bool, error) { return e.cfg.API.Uncordon(c, a.name, false) })
			if errors.Is(err, apiclient.ErrCordonNotOurs) {
				err, notOurs = nil, true // someone else's cordon: left alone, the node not back
			}
			if err == nil && owned {
				err = rt.Disown(cordon)
			}
		}
	}
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		e.log.Error("abort could not undo everything", "event", a.name, "err", err)
		a.outcomeMsg = truncate(a.outcomeMsg + "; abort: " + err.Error())
	}
	a.returned = err == nil && !notOurs
	return true
}

// durably retries a journal write until it succeeds or the agent stops:
// an event whose end is not journaled must not be reported or released
// (the finalizer stays, so nothing is lost). The failure shows in the
// agent's state (status, systemd STATUS=) and lifecycle_agent_finish_blocked.
func (e *Engine) durably(ctx context.Context, a *active, what string, f func() error) bool {
	for i := 1; ; i++ {
		err := f()
		if err == nil {
			if i > 1 {
				e.cfg.Metrics.FinishStuck.Set(0)
				e.log.Info("journal writes again", "event", a.name, "what", what)
			}
			return true
		}
		e.cfg.Metrics.FinishStuck.Set(1)
		e.log.Error("cannot journal "+what+"; the event is held (finalizer kept) until the journal accepts it", "event", a.name, "err", err)
		e.setState(fmt.Sprintf("event %s: blocked: cannot journal %s: %v", a.name, what, err), "event", a.name)
		if !e.sleep(ctx, backoff(i)) {
			return false
		}
	}
}

// retryAPI runs f until it succeeds, fails for a non-transient reason, or
// has failed for 2 minutes (counted from its first failure: an f that
// first waits, as os-upgrade's abort waits for its unit, still gets them).
func (e *Engine) retryAPI(ctx context.Context, f func(context.Context) (bool, error)) (bool, error) {
	var deadline time.Time
	for i := 1; ; i++ {
		v, err := f(ctx)
		if err == nil || !isTransient(err) {
			return v, err
		}
		if i == 1 {
			deadline = e.cfg.Clock.Now().Add(2 * time.Minute)
		} else if !e.cfg.Clock.Now().Before(deadline) {
			return v, err
		}
		if !e.sleep(ctx, backoff(i)) {
			return v, ctx.Err()
		}
	}
}

// finish ends an event in the order the cluster must see it
// (docs/reliability.md): the Node conditions for the end state, then the
// end status, then — once the API server has accepted both — the finalizer
// comes off, the slot and the node Lease are released, and the event moves
// to the journal's history. Replayed from Finishing it does the same,
// idempotently: the outbox still holds what was not delivered.
func (e *Engine) finish(ctx context.Context, a *active, outcome journal.Outcome, msg string) {
	now := e.cfg.Clock.Now()
	cs, reason := v1alpha1.LifecycleEventFailed, "Failed"
	// ended is the outcome as the journal, the log, the metrics and the
	// Kubernetes Event say it: cs, or Cancelled.
	ended := ""
	switch outcome {
	case journal.OutcomeSucceeded:
		cs, reason = v1alpha1.LifecycleEventSucceeded, a.status.Driver.End
	case journal.OutcomeSlaExpired:
		cs, reason = v1alpha1.LifecycleEventSlaExpired, "SlaExpired"
	case journal.OutcomeCancelled:
		// A cancel is not a failure: the event was deleted, and a deleted
		// event gets no end state (the KEP's are Succeeded, Failed and
		// SlaExpired). Its status keeps its claim, says it was cancelled,
		// and the object goes once the abort is done; the outcome is in
		// the journal's history and a Kubernetes Event, reason Cancelled.
		cs, reason, ended = a.status.ClaimStatus, ReasonCancelled, ReasonCancelled
	}
	if ended == "" {
		ended = string(cs)
	}
	if a.jstate != journal.EventFinishing {
		if a.outcomeMsg != "" && a.outcome == outcome {
			msg = a.outcomeMsg // with what the abort could not undo
		}
		a.outcome, a.outcomeMsg = outcome, truncate(msg)
		a.status.ClaimStatus = cs
		a.status.Message = truncate(msg)
		if outcome != journal.OutcomeCancelled {
			a.status.CompletionTime = ptrTime(now)
		}
		setCond(&a.status, v1alpha1.ConditionProgressing, metav1.ConditionFalse, ended, truncate(msg), now)
		setCond(&a.status, v1alpha1.ConditionWaitingForDisruptionBudget, metav1.ConditionFalse, "NotWaiting", "", now)
		e.note(a, journal.NoticeEnded, e.endedText(a, ended, a.outcomeMsg, now))
		// The end state is journaled, and both writes queued, before
		// anything is reported: a journal that refuses them holds the
		// event (finalizer kept) rather than release it unseen.
		// One transaction: an end state journaled without the writes
		// that report it would be replayed from Finishing with nothing
		// to deliver (the Node left mid-transition, the status never
		// written; the fault schedules found it).
		if !e.durably(ctx, a, "its end state", func() error {
			node, changed := a.nodeEntry(outcome)
			var push []journal.OutboxEntry
			if changed {
				push = append(push, node) // the Node first, then the status
			}
			if err := e.snapshot(a, journal.EventFinishing, append(push, a.statusEntry())...); err != nil {
				return err
			}
			if changed {
				a.nodePushed(node)
			}
			poke(e.flushWake)
			return nil
		}) {
			return
		}
		// One Kubernetes Event per event, with its outcome (a Warning per
		// failed step comes on top): the steps and their times are in
		// status.steps, and an Event per step would cost a write each.
		typ := corev1.EventTypeNormal
		if cs != v1alpha1.LifecycleEventSucceeded && outcome != journal.OutcomeCancelled {
			typ = corev1.EventTypeWarning
		}
		e.recordEvent(a, typ, reason, truncate(msg))
		if outcome == journal.OutcomeCancelled {
			// On the Node too: where an admin looks for what happened to it.
			e.recordNodeEvent(a, typ, reason, fmt.Sprintf("event %s cancelled: %s", a.name, truncate(msg)))
		}
	}
	e.setState(fmt.Sprintf("event %s: finishing (%s)", a.name, ended), "event", a.name)
	// Wait until the end state is delivered (the API may be down).
	for ctx.Err() == nil {
		e.alive()
		pending, err := e.cfg.Journal.OutboxPending()
		if err == nil && !hasUID(pending, a.uid) {
			break
		}
		poke(e.flushWake)
		select {
		case <-ctx.Done():
		case <-e.flushed:
		case <-e.cfg.Clock.After(500 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		return // stopping: replayed from Finishing at the next start
	}
	// The finalizer must come off, however long the API server takes: an
	// event moved to history with it would never be deleted.
	// gofail: var engineBeforeFinalizerRemove struct{}
	for i := 1; ; i++ {
		_, err := e.retryAPI(ctx, func(c context.Context) (bool, error) {
			if ev := e.recalled(a.uid); ev != nil {
				_, err := e.cfg.API.SetFinalizerOn(c, ev, false)
				e.forget(a.uid)
				return true, err
			}
			return true, e.cfg.API.SetFinalizer(c, a.name, a.uid, false)
		})
		if err == nil {
			break
		}
		e.log.Warn("finishing: removing the finalizer failed; will retry", "event", a.name, "err", err)
		e.setState(fmt.Sprintf("event %s: finishing (%s): removing the finalizer failed: %v", a.name, ended, err), "event", a.name)
		e.alive()
		if !e.sleep(ctx, backoff(i)) {
			return
		}
	}
	for _, f := range []func(context.Context) (bool, error){
		func(c context.Context) (bool, error) {
			slot := a.heldSlot()
			if slot == "" {
				return true, nil
			}
			return true, e.cfg.API.ReleaseSlot(c, slot, e.cfg.Identity)
		},
		func(c context.Context) (bool, error) { return true, e.cfg.API.ReleaseNodeLease(c, e.cfg.Identity) },
	} {
		if _, err := e.retryAPI(ctx, f); err != nil {
			e.log.Warn("finishing: API call failed", "event", a.name, "err", err)
		}
	}
	if ctx.Err() != nil {
		return
	}
	// gofail: var engineAfterFinalizerRemove struct{}
	if !e.durably(ctx, a, "its move to history", func() error { return e.cfg.Journal.FinishEvent(a.uid, outcome, truncate(msg)) }) {
		return
	}
	e.cfg.Metrics.Events.WithLabelValues(a.driver.Short(), ended).Inc()
	e.log.Info("event finished", "event", a.name, "outcome", ended, "message", msg)
	e.setState("idle")
}

func hasUID(es []journal.OutboxEntry, uid string) bool {
	for _, e := range es {
		if e.UID == uid {
			return true
		}
	}
	return false
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

// renewLoop renews the node Lease and the slot while the event runs.
func (e *Engine) renewLoop(ctx context.Context, a *active) {
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

// ---- outbox ----

type nodePayload struct {
	Conditions []apiclient.NodeCondition `json:"conditions"`
}

func (e *Engine) pushStatus(a *active) error {
	_, err := e.cfg.Journal.OutboxPush(a.statusEntry())
	if err != nil {
		e.log.Error("outbox push", "event", a.name, "err", err)
	}
	poke(e.flushWake)
	return err
}

// statusLinger is how long a lazy status entry (pushStatusLazy) waits at
// the head of the outbox for a newer status of its event to supersede it.
const statusLinger = time.Second

// pushStatusLazy queues the event's status as pushStatus does, for a write
// that only shows live progress: a step's Running (of a step without a
// Done check: repeating it is harmless) or a progress message. Such an
// entry is delivered statusLinger after it was queued, unless a newer
// status of the event supersedes it first — the next step's Running, a
// slot wait, the end state — so a step that ends within statusLinger
// costs no status write of its own. A lazy entry that supersedes another
// keeps the older one's time: a stream of progress messages still goes
// out, at most one write a second. Nothing is reordered: the outbox stays
// in order, entries queued behind it wait (at most statusLinger), and the
// Node's conditions still go out after the status queued before them and
// before the status queued after them.
//
// While a step with a Done check runs, an entry that supersedes a status
// still queued that must go out at once (pushStatus: that step's Running)
// is not lazy either: it carries that Running on. Once the step is done
// the journal holds the proof and its later progress lingers again.
// After a restart nothing is lazy.
func (e *Engine) pushStatusLazy(a *active) error {
	checked := a.runningCheckedStep()
	e.lazyMu.Lock()
	defer e.lazyMu.Unlock()
	until, urgent := e.cfg.Clock.Now().Add(statusLinger), false
	if pending, err := e.cfg.Journal.OutboxPending(); err == nil {
		for _, p := range pending {
			if p.UID != a.uid || p.Kind != journal.OutboxEventStatus {
				continue
			}
			if t, lazy := e.lazy[p.Seq]; lazy {
				until = minTime(until, t)
			} else {
				urgent = checked
			}
		}
	}
	seq, err := e.cfg.Journal.OutboxPush(a.statusEntry())
	if err != nil {
		e.log.Error("outbox push", "event", a.name, "err", err)
	} else if !urgent {
		if e.lazy == nil {
			e.lazy = map[uint64]time.Time{}
		}
		e.lazy[seq] = until
	}
	poke(e.flushWake)
	return err
}

// runningCheckedStep reports whether the current step has a Done check
// and is Running.
func (a *active) runningCheckedStep() bool {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	for i, s := range a.steps {
		if s.Name == a.status.CurrentStep && i < len(a.status.Steps) {
			return s.Done != nil && a.status.Steps[i].State == v1alpha1.StepRunning
		}
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// acked forgets the lazy time of an outbox entry delivered (or dropped).
func (e *Engine) acked(seq uint64) {
	e.lazyMu.Lock()
	delete(e.lazy, seq)
	e.lazyMu.Unlock()
}

// lingering is how long the outbox's head entry still waits (lazy), and
// forgets lazy entries that are gone from the outbox (superseded).
func (e *Engine) lingering(pending []journal.OutboxEntry) time.Duration {
	e.lazyMu.Lock()
	defer e.lazyMu.Unlock()
	if len(e.lazy) == 0 {
		return 0
	}
	if len(e.lazy) > len(pending) {
		// Superseded ones; not those queued since pending was read.
		in, last := map[uint64]bool{}, uint64(0)
		for _, p := range pending {
			in[p.Seq], last = true, max(last, p.Seq)
		}
		for seq := range e.lazy {
			if seq <= last && !in[seq] {
				delete(e.lazy, seq)
			}
		}
	}
	until, ok := e.lazy[pending[0].Seq]
	if !ok {
		return 0
	}
	// Past its time it stays lazy until acked: a status queued while it
	// is being delivered supersedes it with its (past) time, and goes out
	// right after it.
	return max(until.Sub(e.cfg.Clock.Now()), 0)
}

// statusEntry is the outbox entry of the event's status as it is now.
func (a *active) statusEntry() journal.OutboxEntry {
	a.statusMu.Lock()
	raw, _ := json.Marshal(a.status)
	a.statusMu.Unlock()
	return journal.OutboxEntry{UID: a.uid, Kind: journal.OutboxEventStatus, Payload: raw}
}

// flushLoop delivers the outbox in order while the API server answers.
func (e *Engine) flushLoop(ctx context.Context) {
	fails := 0
	for ctx.Err() == nil {
		pending, err := e.cfg.Journal.OutboxPending()
		e.cfg.Metrics.OutboxDepth.Set(float64(len(pending)))
		if err == nil && len(pending) > 0 {
			if wait := e.lingering(pending); wait > 0 {
				select {
				case <-ctx.Done():
				case <-e.flushWake: // maybe superseded
				case <-e.cfg.Clock.After(wait):
				}
				continue
			}
			if err := e.deliver(ctx, pending[0]); err != nil {
				if isInvalid(err) && ctx.Err() == nil {
					// The server refuses this write for good (422/400): drop
					// it rather than hold back every later one. Anything else
					// (403 while a restarted server's authorizer warms up,
					// conflicts, outages) is retried.
					e.log.Warn("outbox: the API server refused a write; dropping it", "seq", pending[0].Seq, "kind", pending[0].Kind.String(), "err", err)
					_ = e.cfg.Journal.OutboxAck(pending[0].Seq)
					e.acked(pending[0].Seq)
					poke(e.flushed)
					continue
				}
				fails++
				e.log.Info("outbox delivery failed; will retry", "seq", pending[0].Seq, "depth", len(pending), "err", err)
				if !e.sleep(ctx, backoff(fails)) {
					return
				}
				continue
			}
			fails = 0
			_ = e.cfg.Journal.OutboxAck(pending[0].Seq)
			e.acked(pending[0].Seq)
			poke(e.flushed)
			continue
		}
		select {
		case <-ctx.Done():
		case <-e.flushWake:
		case <-e.cfg.Clock.After(5 * time.Second):
		}
	}
}

func (e *Engine) deliver(ctx context.Context, en journal.OutboxEntry) error {
	switch en.Kind {
	case journal.OutboxNodeCondition:
		var p nodePayload
		if err := json.Unmarshal(en.Payload, &p); err != nil {
			return nil // undecodable: drop it rather than block the outbox
		}
		return e.cfg.API.SetNodeConditions(ctx, e.cfg.Clock.Now(), p.Conditions...)
	case journal.OutboxEventStatus:
		var st v1alpha1.LifecycleEventStatus
		if err := json.Unmarshal(en.Payload, &st); err != nil {
			return nil
		}
		for i := 0; i < 5; i++ {
			// First try with the object our last write returned (one
			// request); a conflict means someone else wrote since: read it.
			ev := e.recalled(en.UID)
			if ev == nil || i > 0 {
				var err error
				if ev, err = e.eventByUID(ctx, en.UID); err != nil {
					return err
				}
			}
			if ev == nil {
				return nil // gone: nothing to write
			}
			ev.Status = st
			// gofail: var engineBeforeStatusWrite struct{}
			got, err := e.cfg.API.UpdateEventStatus(ctx, ev)
			if err == nil {
				// gofail: var engineAfterStatusWrite struct{}
				e.remember(got)
				return nil
			}
			if isNotFound(err) {
				e.forget(en.UID)
				return nil
			}
			if !isConflict(err) {
				return err
			}
		}
		return fmt.Errorf("status of %s: too many conflicts", en.UID)
	}
	return nil
}

// remember keeps ev, as a write of ours returned it, for the next status
// write of the same event (see deliver). Only the running event is kept.
func (e *Engine) remember(ev *v1alpha1.LifecycleEvent) {
	if ev == nil {
		return
	}
	e.mu.Lock()
	e.last = ev.DeepCopy()
	e.mu.Unlock()
}

// recalled returns a copy of the remembered object of event uid, or nil.
func (e *Engine) recalled(uid string) *v1alpha1.LifecycleEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil || string(e.last.UID) != uid {
		return nil
	}
	return e.last.DeepCopy()
}

func (e *Engine) forget(uid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last != nil && string(e.last.UID) == uid {
		e.last = nil
	}
}

// eventByUID reads the event the outbox entry is about, by the name the
// journal recorded; nil if it is gone or was replaced.
func (e *Engine) eventByUID(ctx context.Context, uid string) (*v1alpha1.LifecycleEvent, error) {
	rec, ok, err := e.cfg.Journal.Event(uid)
	name := ""
	if err == nil && ok {
		name = rec.Name
	}
	if name == "" {
		e.mu.Lock()
		if e.current != nil && e.current.uid == uid {
			name = e.current.name
		}
		e.mu.Unlock()
	}
	if name == "" {
		return nil, nil
	}
	ev, err := e.cfg.API.GetEvent(ctx, name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if string(ev.UID) != uid {
		return nil, nil
	}
	return ev, nil
}
