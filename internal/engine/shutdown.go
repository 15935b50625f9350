package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The shutdown driver is not claimed: logind's PrepareForShutdown(true)
// starts it. It is journaled as a local event whose UID names the boot it
// began in, so that the next boot can tell it apart and close it out.
const (
	ShutdownDriver = "lifecycle-agent.x-k8s.io/shutdown"
	shutdownStart  = "ShuttingDown"
	shutdownEnd    = "ShutdownComplete"
	shutdownOwner  = "shutdown"

	stateShuttingDown = "shutting down"
)

func (e *Engine) shutdownUID(bootID string) string { return "local-shutdown-" + bootID }

// shutdownConditions are the Node conditions of the shutdown driver. When
// the shutdown comes from an event's own step (the reboot driver), that
// event owns the LifecycleTransition condition: only
// GracefulNodeShutdownInProgress is written.
func (e *Engine) shutdownConditions(reason string, status corev1.ConditionStatus, inProgress corev1.ConditionStatus, msg string, eventOwnsLT bool) []apiclient.NodeCondition {
	// GracefulNodeShutdownInProgress says why (KEP-5683: a cause, not the
	// state): logind's shutdown, the boot after it, or logind's cancel.
	gns := ReasonNodeStarted
	switch {
	case inProgress == corev1.ConditionTrue:
		gns = ReasonNodeShutdown
	case reason == "ShutdownCancelled":
		gns = ReasonShutdownCancelled
	}
	conds := []apiclient.NodeCondition{{Type: v1alpha1.NodeConditionGracefulNodeShutdownInProgress, Status: inProgress, Reason: gns, Message: msg}}
	if !eventOwnsLT {
		conds = append(conds, apiclient.NodeCondition{Type: v1alpha1.NodeConditionLifecycleTransition, Status: status, Reason: reason, Message: msg})
	}
	return conds
}

// PrepareShutdown runs the shutdown driver's steps within ctx's deadline
// (the shutdown budget): (1) journal the local event and its intent; (2)
// queue and try to post GracefulNodeShutdownInProgress=True and
// LifecycleTransition reason ShuttingDown; (3) cordon, recorded as ours. It
// returns once the journal is committed and the API was tried; the caller
// then releases the delay lock. The journal is written, and the function
// returns, even when the API server is unreachable.
func (e *Engine) PrepareShutdown(ctx context.Context) error {
	boot := e.cfg.Host.BootID()
	uid := e.shutdownUID(boot)
	name := fmt.Sprintf("shutdown-%s-%s", e.cfg.Node, short(boot))
	attrs := map[string]string{"bootID": boot, "local": "true"}
	e.mu.Lock()
	if e.current != nil {
		attrs["during"] = e.current.name // e.g. the reboot driver's own reboot
	}
	e.mu.Unlock()
	if prev, ok, err := e.cfg.Journal.Event(uid); err == nil && ok && prev.State == journal.EventRunning {
		// Announced again in this boot, the first not closed out: the
		// agent restarted in the delay window (logind still preparing),
		// or a cancel the API server did not take. What the first
		// announcement read stands: the node as it was before the
		// shutdown began (the kubelet may be stopping its pods by now),
		// and the event it came during.
		for k, v := range prev.Attrs {
			if _, set := attrs[k]; !set {
				attrs[k] = v
			}
		}
	}
	rec := journal.EventRecord{UID: uid, Name: name, Driver: ShutdownDriver, State: journal.EventRunning, Attrs: attrs}
	if err := e.cfg.Journal.PutEvent(rec); err != nil {
		return fmt.Errorf("engine: journal shutdown: %w", err)
	}
	if _, err := e.cfg.Journal.AppendStep(uid, journal.StepRecord{Step: "shutdown", Phase: journal.PhaseIntent,
		State: journal.StepRunning, Attempt: 1, BootID: boot}); err != nil {
		return fmt.Errorf("engine: journal shutdown intent: %w", err)
	}
	e.mu.Lock()
	if e.returning != nil {
		e.returning() // the node is going down again: no more waiting for it
		e.returning = nil
	}
	if e.state != stateShuttingDown {
		e.preShutdown = e.state
	}
	e.mu.Unlock()
	e.setState(stateShuttingDown, "event", name)
	// What the node has now, for its next boot to require before it is
	// given back (shutdown_return.go): read beside the conditions and the
	// cordon, journaled before the lock is released.
	var snap chan map[string]string
	if _, taken := attrs[drivers.ResolvedReadiness]; e.cfg.ShutdownReturn.Snapshot != nil && !taken {
		snap = make(chan map[string]string, 1)
		go func() { snap <- e.cfg.ShutdownReturn.Snapshot(ctx, e.log.Warn) }()
	}
	// The cordon's owner, journaled before any API call (the budget may
	// run out in them: a server that does not answer), with the close-out
	// of an earlier shutdown kept out until the cordon is made.
	own, err := e.ownShutdownCordon(ctx, uid, name)
	if err != nil {
		return err
	}
	defer own.release()
	msg := transitionMsg("shutdown", name) + ": the node is shutting down"
	conds := e.shutdownConditions(shutdownStart, corev1.ConditionTrue, corev1.ConditionTrue, msg, attrs["during"] != "")
	raw, _ := json.Marshal(nodePayload{Conditions: conds})
	if _, err := e.cfg.Journal.OutboxPush(journal.OutboxEntry{UID: uid, Kind: journal.OutboxNodeCondition, Payload: raw}); err != nil {
		e.log.Error("outbox push", "event", name, "err", err)
	}
	// Best effort within the budget: post the conditions and cordon now.
	if err := e.cfg.API.SetNodeConditions(ctx, e.cfg.Clock.Now(), conds...); err != nil {
		e.log.Warn("shutdown: Node conditions not posted (queued in the outbox)", "event", name, "err", err)
	}
	cordoned := e.makeShutdownCordon(ctx, own, uid, name, boot)
	own.release()
	if snap != nil {
		p, ok := snapshotRead(ctx, snap)
		if !ok {
			e.log.Warn("shutdown: what the node has was not read within the shutdown budget; its next boot compares against nothing", "event", name)
		}
		if v, ok := p[drivers.ResolvedReadiness]; ok {
			attrs[drivers.ResolvedReadiness] = v
			if err := e.cfg.Journal.PutEvent(rec); err != nil {
				e.log.Error("shutdown: journaling what the node has failed; its next boot compares against nothing", "event", name, "err", err)
			}
		}
	}
	e.log.Info("shutdown prepared", "event", name, "cordoned", cordoned)
	return nil
}

// snapshotRead waits for the snapshot of what the node has until ctx (the
// shutdown budget) ends; one read already is taken even when the budget
// is spent by now (a wait for an earlier close-out's turn): a select on
// both dropped it half the time.
func snapshotRead(ctx context.Context, snap <-chan map[string]string) (map[string]string, bool) {
	select {
	case p := <-snap:
		return p, true
	default:
	}
	select {
	case p := <-snap:
		return p, true
	case <-ctx.Done():
		return nil, false
	}
}

// lockShutdownCordon takes the shutdown cordon's semaphore (shutdownCordon),
// waiting at most until ctx ends (a free one is taken even then). unlock
// gives it back and may be called more than once; ok is false, and unlock
// nil, when ctx ended first.
func (e *Engine) lockShutdownCordon(ctx context.Context) (unlock func(), ok bool) {
	select {
	case e.shutdownCordon <- struct{}{}:
	default:
		select {
		case e.shutdownCordon <- struct{}{}:
		case <-ctx.Done():
			return nil, false
		}
	}
	var once sync.Once
	return func() { once.Do(func() { <-e.shutdownCordon }) }, true
}

// shutdownOwnership is what ownShutdownCordon decided, for
// makeShutdownCordon: the semaphore's unlock (nil when not taken), and the
// shutdown that owned the cordon before ("" for none).
type shutdownOwnership struct {
	unlock  func()
	earlier string
}

func (o *shutdownOwnership) release() {
	if o.unlock != nil {
		o.unlock()
	}
}

// ownShutdownCordon journals PrepareShutdown's cordon as its own before it
// is made (a crash in between is undone too) — unless an earlier shutdown,
// not closed out yet (its next boot's wait for the node to be ready), owns
// it: that one gives the node back, against what the node had before it.
// The owner is read, and the cordon later made (makeShutdownCordon), with
// the close-out of an earlier shutdown kept out (shutdownCordon, released
// by the caller): that one either gave the node back before (its record
// gone: this one cordons afresh), or sees this one journaled and leaves
// the node alone (closeShutdown). Without it, a close-out between
// its check and its uncordon lifted the cordon this shutdown had just
// found and left to it: the node went down schedulable, and its next boot
// had nothing to wait for. Waiting for a close-out is bounded by the
// shutdown budget (ctx): past it, nothing is owned or cordoned within the
// budget, and lateShutdownCordon does both once the close-out is done.
func (e *Engine) ownShutdownCordon(ctx context.Context, uid, name string) (*shutdownOwnership, error) {
	o := &shutdownOwnership{}
	unlock, ok := e.lockShutdownCordon(ctx)
	if !ok {
		e.log.Warn("shutdown: an earlier shutdown's close-out holds the cordon past the shutdown budget; cordoning once it is done", "event", name)
		e.startLateShutdownCordon(uid, name)
		return o, nil
	}
	o.unlock = unlock
	return o, e.ownShutdownCordonLocked(o, uid)
}

// ownShutdownCordonLocked is ownShutdownCordon with the semaphore held
// (o.unlock): it reads the earlier owner and journals this shutdown's
// ownership when there is none.
func (e *Engine) ownShutdownCordonLocked(o *shutdownOwnership, uid string) error {
	o.earlier = e.ownedBy(e.shutdownCordonKey())
	if o.earlier == "" || o.earlier == uid {
		if _, err := e.cfg.Journal.AddOwned(journal.Change{Kind: journal.ChangeCordon, Node: e.cfg.Node, Name: shutdownOwner, EventUID: uid, Value: shutdownOwner}); err != nil {
			o.release()
			return fmt.Errorf("engine: journal shutdown cordon: %w", err)
		}
	}
	return nil
}

// startLateShutdownCordon marks this shutdown's conditions as going out now,
// not after the earlier close-out's (that one queues none: pastTurn), and
// starts lateShutdownCordon on the agent's run, replacing an earlier
// announcement's (this one does the same).
func (e *Engine) startLateShutdownCordon(uid, name string) {
	e.mu.Lock()
	base := e.runCtx
	e.mu.Unlock()
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithTimeout(base, shutdownStale)
	e.turnMu.Lock()
	e.pastTurn = true
	if e.lateCancel != nil {
		e.lateCancel()
	}
	e.lateCancel = cancel
	e.turnMu.Unlock()
	go e.lateShutdownCordon(ctx, cancel, uid, name)
}

// lateShutdownCordon is the cordon of a shutdown whose budget ran out while
// an earlier shutdown's close-out held the semaphore (an uncordon that
// took long: a slow or unreachable API server): the node goes down
// cordoned all the same when the machine is still up once the close-out
// is done (the kubelet's own inhibitor delays the shutdown for its pods'
// grace period). Until then nothing of this cordon is journaled: a machine
// down before the close-out's turn ends, or an agent restarted in it,
// goes down without it, as before. It takes the semaphore after the
// close-out, then owns and makes the cordon as PrepareShutdown would
// have, only while the shutdown is still journaled and underway and ctx
// (the agent's run; CancelShutdown cancels it first) not done: a cancel
// meanwhile, even one whose own close-out then failed, leaves nothing to
// do.
func (e *Engine) lateShutdownCordon(ctx context.Context, cancel context.CancelFunc, uid, name string) {
	defer cancel()
	unlock, ok := e.lockShutdownCordon(ctx)
	if !ok {
		return
	}
	o := &shutdownOwnership{unlock: unlock}
	defer o.release()
	if ctx.Err() != nil || uid != e.shutdownUID(e.cfg.Host.BootID()) || !e.shutdownUnderway() {
		return
	}
	if err := e.ownShutdownCordonLocked(o, uid); err != nil {
		e.log.Error("shutdown: journaling the cordon after the earlier close-out failed", "event", name, "err", err)
		return
	}
	cordoned := e.makeShutdownCordon(ctx, o, uid, name, e.cfg.Host.BootID())
	e.log.Info("shutdown: cordon after the earlier shutdown's close-out", "event", name, "cordoned", cordoned)
}

// makeShutdownCordon makes the cordon ownShutdownCordon decided on, within
// the budget (ctx). It reports whether the node is cordoned for this
// shutdown.
func (e *Engine) makeShutdownCordon(ctx context.Context, o *shutdownOwnership, uid, name, boot string) bool {
	if o.unlock == nil {
		return false
	}
	earlier := o.earlier
	ours, made, err := e.cfg.API.CordonMade(ctx, shutdownOwner)
	switch {
	case err != nil:
		e.log.Warn("shutdown: cordon failed; the journal keeps the intent (the next boot cordons before its wait)", "event", name, "err", err)
	case ours && !made && earlier == "":
		// Cordoned for "shutdown" already, and no shutdown owns it: a
		// cordon an earlier shutdown kept for an admin (the node not back
		// in time, readiness.onTimeout keepCordoned). It stays the
		// admin's: this shutdown, cancelled or closed out, leaves it.
		_ = e.cfg.Journal.RemoveOwned(journal.Change{Kind: journal.ChangeCordon, Node: e.cfg.Node, Name: shutdownOwner}.Key())
		e.log.Info("shutdown: the node is cordoned already, kept by an earlier shutdown for an admin; left as it is", "event", name)
		ours = false
	case ours && (earlier == "" || earlier == uid):
		// Made: the next boot does not make it again (ensureShutdownCordon),
		// so an admin's uncordon in between stands.
		if _, err := e.cfg.Journal.AppendStep(uid, journal.StepRecord{Step: shutdownCordonStep, Phase: journal.PhaseDone,
			State: journal.StepDone, Attempt: 1, BootID: boot}); err != nil {
			e.log.Warn("shutdown: journaling the cordon made failed", "event", name, "err", err)
		}
	case !ours && earlier != "" && earlier != uid:
		// The earlier shutdown's record stays: it is not this one's.
	case !ours:
		_ = e.cfg.Journal.RemoveOwned(journal.Change{Kind: journal.ChangeCordon, Node: e.cfg.Node, Name: shutdownOwner}.Key())
	}
	return err == nil && ours
}

// CancelShutdown reverts PrepareShutdown after PrepareForShutdown(false):
// uncordon ours, clear the conditions, and close the local event.
func (e *Engine) CancelShutdown(ctx context.Context) error {
	// A cordon still to be made past the budget is not made any more.
	e.turnMu.Lock()
	if e.lateCancel != nil {
		e.lateCancel()
		e.lateCancel = nil
	}
	e.turnMu.Unlock()
	uid := e.shutdownUID(e.cfg.Host.BootID())
	rec, ok, err := e.cfg.Journal.Event(uid)
	if err != nil || !ok {
		return err
	}
	if err := e.closeShutdown(ctx, rec, "ShutdownCancelled", journal.OutcomeCancelled, "the shutdown was cancelled"); err != nil {
		return err
	}
	e.turnMu.Lock()
	e.pastTurn = false // the earlier close-out, tried again, queues its own after this one's
	e.turnMu.Unlock()
	// An earlier shutdown whose close-out this one cut short (it still
	// owns the cordon) is closed out again by the engine's loop.
	e.closeOutAgain.Store(true)
	poke(e.wake)
	// The node is back in service: the state says so, unless an event's
	// step has announced its own since.
	e.mu.Lock()
	back := e.preShutdown
	e.mu.Unlock()
	if back == "" {
		back = "idle"
	}
	e.swapState(stateShuttingDown, back)
	return nil
}

// closeOutShutdowns runs at start: a shutdown journaled in an earlier boot
// is closed out (ShutdownComplete, uncordon ours). Until the API answers,
// the node stays cordoned and the condition says why (kubelet amnesia,
// kubernetes#122674: the kubelet keeps no such state across boots).
func (e *Engine) closeOutShutdowns(ctx context.Context) {
	recs, err := e.cfg.Journal.Events()
	if err != nil {
		return
	}
	boot := e.cfg.Host.BootID()
	// Oldest first: a shutdown announced while an earlier one's close-out
	// waited (PrepareShutdown) gives the node back after it.
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Updated.Before(recs[j].Updated) })
	for _, r := range recs {
		if r.Driver != ShutdownDriver {
			continue
		}
		if r.Attrs["bootID"] == boot {
			// Same boot: the shutdown did not happen (or the agent restarted
			// during it). Keep it until logind says otherwise.
			continue
		}
		if e.shutdownUnderway() {
			// The node is going down again (announced during the start):
			// the earlier record stays, closed out after this one is
			// cancelled (closeOutAgain) or at the next boot.
			return
		}
		// Through the outbox: it supersedes a ShuttingDown entry still
		// queued from before the shutdown.
		e.pushShutdownConditions(r, shutdownStart, corev1.ConditionTrue, returningMsg(r), false)
		if !e.ensureShutdownCordon(ctx, r) {
			return
		}
		reason, outcome, word := shutdownEnd, journal.OutcomeSucceeded, "shutdown complete; node back"
		for e.waitsToReturn(r) {
			rctx, stop := context.WithCancel(ctx)
			e.mu.Lock()
			e.returning = stop
			e.mu.Unlock()
			err := e.returnAfterShutdown(rctx, r)
			cut := rctx.Err() != nil
			e.mu.Lock()
			e.returning = nil
			e.mu.Unlock()
			stop()
			if cut {
				// Stopping, or another shutdown came: the record stays,
				// closed out at the next start.
				return
			}
			var nb notBack
			if errors.As(err, &nb) {
				reason, outcome, word = ReasonNotReadyAfterShutdown, journal.OutcomeFailed, "shutdown complete; the node is not back: "+nb.Error()
			} else if err != nil {
				e.log.Error("shutdown: the wait before the uncordon failed; retrying", "event", r.Name, "err", err)
				if !e.sleep(ctx, 2*time.Second) {
					return
				}
				continue
			}
			break
		}
		for ctx.Err() == nil {
			e.alive()
			err := e.closeShutdown(ctx, r, reason, outcome, word)
			if err == nil {
				break
			}
			if errors.Is(err, errShutdownUnderway) {
				e.log.Info("closing out the last shutdown waits: the node is shutting down again", "event", r.Name)
				return
			}
			e.log.Warn("closing out the last shutdown failed; retrying", "event", r.Name, "err", err)
			if !e.sleep(ctx, 2*time.Second) {
				return
			}
		}
	}
}

// shutdownCordonStep is the step record of a shutdown's cordon made.
const shutdownCordonStep = "cordon"

// ensureShutdownCordon makes, before the next boot's wait, the cordon a
// shutdown's record owns but PrepareShutdown did not make: the API server
// unreachable at the shutdown (a whole cluster powered down, the control
// plane first), or the agent killed between the record and the patch.
// Without it the node took pods through the whole wait while the Node's
// condition said "kept cordoned". A cordon made at the shutdown (its step
// record) is not made again, so an admin's uncordon since stands;
// someone else's cordon found now is left, and the record dropped. It
// retries until the API server answers; false when ctx ended.
func (e *Engine) ensureShutdownCordon(ctx context.Context, r journal.EventRecord) bool {
	if !e.owns(r.UID, e.shutdownCordonKey()) || len(e.cfg.ShutdownReturn.Steps) == 0 || r.Attrs["during"] != "" {
		// (A shutdown during an event — its own reboot — is covered by the
		// event's cordon and waits, resumed from its journal.)
		return true
	}
	recs, _ := e.cfg.Journal.Steps(r.UID)
	if cordonMadeForLastAnnouncement(recs) {
		return true
	}
	for i := 1; ; i++ {
		e.alive()
		ours, err := e.cfg.API.Cordon(ctx, shutdownOwner)
		switch {
		case err == nil && ours:
			if _, err := e.cfg.Journal.AppendStep(r.UID, journal.StepRecord{Step: shutdownCordonStep, Phase: journal.PhaseDone,
				State: journal.StepDone, Attempt: 1, BootID: e.cfg.Host.BootID(), Message: "made at the next boot"}); err != nil {
				e.log.Warn("shutdown: journaling the cordon made failed", "event", r.Name, "err", err)
			}
			e.log.Info("shutdown: cordoned at the next boot (not made at the shutdown), until the node is ready", "event", r.Name)
			return true
		case err == nil:
			_ = e.cfg.Journal.RemoveOwned(e.shutdownCordonKey()) // someone else's cordon: left alone
			return true
		}
		e.log.Warn("shutdown: the cordon not made at the shutdown failed again; retrying", "event", r.Name, "err", err)
		if !e.sleep(ctx, min(backoff(i), 5*time.Second)) {
			return false
		}
	}
}

// giveBackShutdownCordon is the close-out's cordon: left for an admin when
// the node was not back in time and readiness.onTimeout keeps it, else
// lifted when the shutdown owns it. The caller holds shutdownCordon.
func (e *Engine) giveBackShutdownCordon(ctx context.Context, r journal.EventRecord) error {
	if e.owns(r.UID, e.shutdownKeptKey()) {
		// The node was not back in time and readiness.onTimeout keeps
		// it cordoned: the cordon stays, its annotation naming the
		// shutdown, and is no longer the agent's to lift.
		if err := e.cfg.Journal.RemoveOwned(e.shutdownCordonKey()); err != nil {
			return err
		}
		if err := e.cfg.Journal.RemoveOwned(e.shutdownKeptKey()); err != nil {
			return err
		}
	}
	if e.owns(r.UID, e.shutdownCordonKey()) {
		if _, err := e.cfg.API.Uncordon(ctx, shutdownOwner, false); err != nil && !isCordonNotOurs(err) {
			return err
		}
		_ = e.cfg.Journal.RemoveOwned(e.shutdownCordonKey())
	}
	return nil
}

// closeOutPostTimeout bounds the close-out's wait, holding shutdownCordon,
// for its Node conditions to be delivered (below shutdown.budget's
// default); past it the close-out is tried again, the entry still queued.
const closeOutPostTimeout = 2 * time.Second

// delivered waits until the outbox holds nothing of uid (the flusher
// delivered it, in order), at most timeout (0: until ctx ends), and
// reports whether it does. A journal it cannot read counts as not yet.
func (e *Engine) delivered(ctx context.Context, uid string, timeout time.Duration) bool {
	var deadline <-chan time.Time
	if timeout > 0 {
		deadline = e.cfg.Clock.After(timeout)
	}
	for {
		e.alive()
		pending, err := e.cfg.Journal.OutboxPending()
		if err == nil && !hasUID(pending, uid) {
			return true
		}
		poke(e.flushWake)
		select {
		case <-ctx.Done():
			return false
		case <-deadline:
			return false
		case <-e.flushed:
		case <-e.cfg.Clock.After(500 * time.Millisecond):
		}
	}
}

// errShutdownUnderway: an earlier shutdown's close-out found a shutdown of
// this boot journaled and running; the node is going down again.
var errShutdownUnderway = errors.New("engine: a shutdown of this boot is underway")

// shutdownUnderway reports whether a shutdown of this boot is journaled
// and not closed out (announced, not cancelled), announced less than
// shutdownStale ago: a record older than that in the same boot is one
// whose cancel was never seen (logind unreadable at a restart, a revert
// refused for good), not a machine on its way down, and holds nothing up.
func (e *Engine) shutdownUnderway() bool {
	r, ok, err := e.cfg.Journal.Event(e.shutdownUID(e.cfg.Host.BootID()))
	return err == nil && ok && r.State == journal.EventRunning && e.cfg.Clock.Since(r.Updated) < shutdownStale
}

// shutdownStale bounds how long a shutdown of this boot holds new claims
// and an earlier shutdown's close-out: longer than any delay logind grants
// (InhibitDelayMaxSec) and the kubelet's graceful node shutdown.
const shutdownStale = 30 * time.Minute

// cordonMadeForLastAnnouncement reports whether a shutdown's steps record
// its cordon made after its last announcement (its last "shutdown"
// intent): one made for an earlier announcement (announced, cordoned,
// cancelled and uncordoned while the API server did not take the
// conditions, then announced again) does not count.
func cordonMadeForLastAnnouncement(recs []journal.StepRecord) bool {
	made := false
	for _, rec := range recs {
		switch {
		case rec.Step == "shutdown" && rec.Phase == journal.PhaseIntent:
			made = false
		case rec.Step == shutdownCordonStep && rec.Phase == journal.PhaseDone:
			made = true
		}
	}
	return made
}

// closeShutdown ends a shutdown's record: its cordon given back (or kept),
// its end conditions posted, the record moved to the history. For an
// earlier boot's shutdown this happens only while no shutdown of this boot
// is underway, checked and done with PrepareShutdown kept out
// (shutdownCordon) within its budget: errShutdownUnderway otherwise, and
// the record stays. A shutdown whose budget ran out meanwhile (pastTurn)
// supersedes its end conditions.
// The whole of it, not only the cordon: a shutdown announced between the
// uncordon and the conditions posted its ShuttingDown first, and this
// close-out's ShutdownComplete (GracefulNodeShutdownInProgress=False)
// then said the node was back while it went down.
func (e *Engine) closeShutdown(ctx context.Context, r journal.EventRecord, reason string, outcome journal.Outcome, word string) error {
	unlock, ok := e.lockShutdownCordon(ctx)
	if !ok {
		return ctx.Err()
	}
	defer unlock()
	if r.UID != e.shutdownUID(e.cfg.Host.BootID()) && e.shutdownUnderway() {
		return errShutdownUnderway
	}
	if err := e.giveBackShutdownCordon(ctx, r); err != nil {
		return err
	}
	// gofail: var engineCloseOutBeforeConditions struct{}
	msg := transitionMsg("shutdown", r.Name) + ": " + word
	conds := e.shutdownConditions(reason, corev1.ConditionFalse, corev1.ConditionFalse, msg, r.Attrs["during"] != "")
	// Through the outbox only, and waited for: it supersedes a ShuttingDown
	// entry still queued from before the shutdown, goes out after
	// everything queued before it, and before anything a shutdown
	// announced meanwhile queues (PrepareShutdown waits for this turn
	// within its budget; past it, none are queued, below).
	// Posted beside the outbox as well, its queued copy went out again
	// after such a shutdown's ShuttingDown; and with that copy dropped, an
	// older entry still queued or in flight could land after it for good.
	raw, _ := json.Marshal(nodePayload{Conditions: conds})
	e.turnMu.Lock()
	superseded := r.UID != e.shutdownUID(e.cfg.Host.BootID()) && e.pastTurn && e.shutdownUnderway()
	var err error
	if !superseded {
		_, err = e.cfg.Journal.OutboxPush(journal.OutboxEntry{UID: r.UID, Kind: journal.OutboxNodeCondition, Payload: raw})
	}
	e.turnMu.Unlock()
	if err != nil {
		return err
	}
	closed, end := "shutdown closed out", word
	switch {
	case superseded:
		// A shutdown announced during the uncordon whose budget ran out
		// waiting for this turn queued its ShuttingDown already: these
		// conditions, queued after it, would say the node is back while
		// it goes down. None are queued: that shutdown's, and its own
		// close-out's at the next boot, say what the node is; its cordon
		// comes once this turn ends (lateShutdownCordon). This record,
		// its cordon given back, goes to the history: kept, its next
		// close-out would say "shutting down" again after a cancel, and
		// wait for the node once more at the next boot.
		closed += "; its end conditions left to the shutdown underway"
		end += "; a new shutdown was announced before its end conditions were posted"
	case !e.delivered(ctx, r.UID, closeOutPostTimeout):
		// The record stays; the caller tries again.
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("engine: the Node conditions not delivered within %s", closeOutPostTimeout)
	}
	if _, err := e.cfg.Journal.AppendStep(r.UID, journal.StepRecord{Step: "shutdown", Phase: journal.PhaseDone, State: journal.StepDone,
		Attempt: 1, BootID: e.cfg.Host.BootID(), Message: word}); err != nil {
		return err
	}
	e.log.Info(closed, "event", r.Name, "reason", reason)
	return e.cfg.Journal.FinishEvent(r.UID, outcome, end)
}

func isCordonNotOurs(err error) bool {
	return err != nil && errorsIs(err, apiclient.ErrCordonNotOurs)
}

func short(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}
