package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The end of an event: the abort that undoes what it owns, the end state
// written durably (journal first, then the API, retried through outages),
// the finalizer released. Split out of run.go (issue 41: the end-of-event
// protocol in a file of its own); moved, not changed.

// abort undoes what the event owns: the driver's own abort, or by default
// the cordon we made. The outcome is journaled first, so a restart resumes
// straight into the abort and then the end state. It reports false when
// the agent is stopping (the abort resumes next time).
func (e *Engine) abort(ctx context.Context, a *active, outcome journal.Outcome, msg string) bool {
	rt := &stepRuntime{e: e, a: a}
	if rt.Owns(drivers.CordonKept(e.cfg.Node)) && !strings.Contains(msg, drivers.KeptSuffix) {
		// A readiness wait ended by the sla (or a step that failed after
		// the keep was decided): the end state says the cordon stays.
		msg += drivers.KeptSuffix
	}
	a.outcome, a.outcomeMsg = outcome, truncate(msg)
	if !e.durably(ctx, a, "its abort", func() error { return e.snapshot(a, journal.EventAborting) }) {
		return false
	}
	// gofail: var engineDuringAbort struct{}
	if ctx.Err() != nil {
		return false
	}
	var err error
	notOurs := false
	if ab, ok := a.driver.(drivers.Abortable); ok {
		// A driver's abort leaves a kept cordon (drivers.CordonKept) for
		// an admin, as the default below does: the node is not back.
		notOurs = rt.Owns(drivers.CordonKept(e.cfg.Node))
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
			// journal stops owning it, so nothing undoes it later. The
			// kept record itself stays until the event is in the history
			// (finish): an abort replayed after a crash here must find it
			// and leave the cordon again, not lift it.
			if owned {
				err = rt.Disown(cordon)
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
	// gofail: var engineAfterAbort struct{}
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
		if !e.sleep(ctx, retryWait(i, err)) {
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
	if !e.delivered(ctx, a.uid, 0) {
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
		if !e.sleep(ctx, retryWait(i, err)) {
			return
		}
	}
	// No renewal after this point (one in flight is cancelled first), so
	// the releases below are the last writes of this event to its Leases.
	a.renew.end()
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
	// gofail: var engineAfterLeaseRelease struct{}
	if ctx.Err() != nil {
		return
	}
	// gofail: var engineAfterFinalizerRemove struct{}
	if !e.durably(ctx, a, "its move to history", func() error { return e.cfg.Journal.FinishEvent(a.uid, outcome, truncate(msg)) }) {
		return
	}
	// The kept cordon's record outlived the abort (see abort): the event
	// is in the history now, so it goes; a crash before this leaves it to
	// retryLeftoverUndo.
	if rt := (&stepRuntime{e: e, a: a}); rt.Owns(drivers.CordonKept(e.cfg.Node)) {
		if err := rt.Disown(drivers.CordonKept(e.cfg.Node)); err != nil {
			e.log.Warn("dropping the kept cordon's record failed; will retry", "event", a.name, "err", err)
		}
	}
	e.ended[a.uid] = e.cfg.Clock.Now()
	e.cfg.Metrics.Events.WithLabelValues(a.driver.Short(), ended).Inc()
	e.log.Info("event finished", "event", a.name, "outcome", ended, "message", msg)
	// gofail: var engineBeforeFinishDelete struct{}
	if e.cfg.EventRetention == 0 && outcome != journal.OutcomeCancelled {
		// Deleted at once, not when our watch shows the end: a watch
		// that runs behind (a loaded server) would hold the deletion
		// that long. A cancelled event is already going. If this fails,
		// or the agent stops first, collect deletes it.
		ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: a.name, UID: types.UID(a.uid)}}
		if err := e.cfg.API.DeleteEvent(ctx, ev); err != nil {
			e.log.Info("deleting the finished event failed; will retry", "event", a.name, "err", err)
		} else {
			e.deleted[a.uid] = e.cfg.Clock.Now()
		}
	}
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
