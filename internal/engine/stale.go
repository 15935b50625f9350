package engine

import (
	"context"
	"slices"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// sweepLeases runs releaseStaleLeases when one is due (e.leaseSweep), and
// after a failed one not before a minute has passed: an API server that
// refuses gets one try a minute, not one every round.
func (e *Engine) sweepLeases(ctx context.Context) {
	if !e.leaseSweep || e.cfg.Clock.Now().Before(e.sweepAfter) {
		return
	}
	if err := e.releaseStaleLeases(ctx); err != nil {
		e.sweepAfter = e.cfg.Clock.Now().Add(time.Minute)
		e.log.Info("releasing Leases held for events gone or ended failed; will retry in a minute", "err", err)
		return
	}
	e.leaseSweep = false
}

// releaseStaleLeases gives back the Leases this agent holds — the node's
// and disruption slots — for an event that is neither running here nor in
// the journal, and is gone or has ended: nobody else would release them.
// A claim cut short between taking them and the journal's record of the
// event leaves them so when the event is deleted meanwhile: the agent
// killed before its finalizer or its snapshot, then the event deleted
// while it was down; a finalizer write lost on a dead connection while
// the event was deleted; an orphan released (releaseOrphans). Left, the
// node Lease keeps another identity of this node from claiming until it
// expires, and a slot stays in our name (found by the fault schedules:
// test/crash TestChaos, invariant 7).
//
// It runs when no event runs, after the start and after such a claim or
// release (e.leaseSweep), never on a timer (a failed sweep is tried again
// at most once a minute): one LIST of the Leases this node took
// (apiclient.LabelLeaseNode), a read of its node Lease when that LIST
// lacks it, and a read per held one. A Lease for an event that still exists
// and has not ended is left: a Pending event keeps the slot it queued for,
// and an event Claimed by us that the journal lost is adopted.
func (e *Engine) releaseStaleLeases(ctx context.Context) error {
	held, err := e.cfg.API.HeldLeases(ctx, e.cfg.Identity)
	if err != nil || len(held) == 0 {
		return err
	}
	recs, err := e.cfg.Journal.Events()
	if err != nil {
		return err
	}
	journaled := map[string]bool{}
	for _, r := range recs {
		journaled[r.UID] = true
	}
	for _, l := range held {
		if l.Event == "" || l.EventUID == "" || journaled[l.EventUID] {
			continue
		}
		ev, err := e.cfg.API.LeaseEvent(ctx, l.Event, l.EventUID)
		if err != nil {
			return err
		}
		if ev != nil && !(ev.Status.ClaimStatus.Finished() && !slices.Contains(ev.Finalizers, v1alpha1.Finalizer)) {
			continue // it exists and has not ended
		}
		if l.Node {
			err = e.cfg.API.ReleaseNodeLease(ctx, e.cfg.Identity)
		} else {
			err = e.cfg.API.ReleaseSlot(ctx, l.Name, e.cfg.Identity)
		}
		if err != nil {
			return err
		}
		e.log.Info("released a Lease held for an event that is gone or ended", "lease", l.Name, "event", l.Event)
	}
	return nil
}
