package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// tryClaim claims the oldest claimable event, or returns nil. fresh, when
// not nil, is a direct list to claim from instead of the watch's cache.
func (e *Engine) tryClaim(ctx context.Context, fresh []*v1alpha1.LifecycleEvent) *active {
	all := fresh
	if all == nil {
		all = e.watch.List()
	}
	cands := e.candidates(all)
	blocker := e.claimedByOther(all)
	if blocker != nil {
		// A re-imaged node's own event, claimed by its old identity (the
		// machine-id changed): taken over once no live agent holds it.
		if taken := e.takeOver(ctx, blocker); taken != nil {
			return e.tryClaim(ctx, withEvent(all, taken)) // now ours: adopted
		}
	}
	if len(cands) == 0 {
		// The event the Node's MaintenancePlanned names may be gone (a
		// Pending event has no finalizer: deleted, it is gone at once).
		if e.planned != "" || !e.plannedRead {
			e.clearPlanned(ctx, nil)
		}
		return nil
	}
	if blocker != nil {
		// One Claimed event per node, whoever claimed it (a third-party
		// controller implementing the proposal, another agent given this
		// node name): our own claimed events are adopted, new ones wait.
		msg := fmt.Sprintf("waiting: event %s is Claimed on this node by %s", blocker.Name, blocker.Status.Holder.Identity)
		var mine, waiting []*v1alpha1.LifecycleEvent
		for _, c := range cands {
			if c.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed {
				mine = append(mine, c)
			} else {
				waiting = append(waiting, c)
			}
		}
		e.markQueue(ctx, waiting, msg)
		cands = mine
	}
	// Ours first, and alone: an event Claimed by us that no journal holds
	// (a lost journal) is adopted before anything new is claimed — one
	// claimed event per node.
	if mine := slices.DeleteFunc(slices.Clone(cands), func(c *v1alpha1.LifecycleEvent) bool {
		return c.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed
	}); len(mine) > 0 {
		cands = mine
	}
	if len(cands) > 0 && cands[0].Status.ClaimStatus != v1alpha1.LifecycleEventClaimed && e.shutdownUnderway() {
		// The node is shutting down (logind announced it in this boot and
		// it is not cancelled): nothing new starts on it — an event claimed
		// now would evict and take its Lease and slot during the kubelet's
		// graceful shutdown, and run on a node whose return no one has
		// checked yet. Claimed at the next boot, after the shutdown's
		// close-out, or once the shutdown is cancelled.
		e.markQueue(ctx, cands, "waiting: the node is shutting down")
		return nil
	}
	e.slotQueued = false
	e.clearPlanned(ctx, cands)
	for i, cached := range cands {
		a, err := e.claim(ctx, cached)
		if err != nil {
			if errors.Is(err, apiclient.ErrLeaseHeld) {
				e.log.Debug("not claimed: the node lease is held", "event", cached.Name)
				return nil
			}
			e.log.Info("not claimed", "event", cached.Name, "reason", err)
			e.leaseSweep = true // the Leases it took may be held for nothing
			var u unsettled
			if errors.As(err, &u) {
				// The event is, or may be, Claimed by us on the server:
				// nothing else is claimed before the next round sees it.
				return nil
			}
			continue
		}
		if a != nil {
			if a.name == e.planned {
				e.planned = "" // the claim's conditions end MaintenancePlanned
			}
			var waiting []*v1alpha1.LifecycleEvent
			for _, c := range cands[i+1:] {
				if c.Status.ClaimStatus == "" || c.Status.ClaimStatus == v1alpha1.LifecycleEventPending {
					waiting = append(waiting, c)
				}
			}
			e.markQueue(ctx, waiting, fmt.Sprintf("waiting: event %s runs on this node", a.name))
			return a
		}
	}
	return nil
}

// takeOver makes this agent the holder of ev, Claimed by another identity
// of this node's agent, when that agent is gone for good — the case of a
// node re-imaged during an external OS upgrade: a new image has a new
// machine-id, so a new identity, and no journal of the event. Three
// conditions, each against a twin (another machine wrongly given this
// node name, which must never act for it):
//   - the holder is an agent of this node's name (identity <node>/…), not a
//     third party's controller;
//   - the node's Lease is free or expired: no live agent holds the node;
//   - this host is the Node's: its boot ID is the one the kubelet reports
//     in status.nodeInfo.bootID (a twin's kubelet, if any, reports another
//     machine's Node; a twin's own boot ID is not this Node's).
//
// The holder is rewritten with a guarded status update (of two racing
// agents one wins); the claim's boot ID is kept, so that the steps rebuilt
// from the status (rebuiltSteps) still date from the old boot: a reboot
// since then is seen as one. It returns the updated event, or nil (why
// not is logged at debug level).
func (e *Engine) takeOver(ctx context.Context, ev *v1alpha1.LifecycleEvent) *v1alpha1.LifecycleEvent {
	got, why := e.takeOverWhy(ctx, ev)
	if got == nil && why != "" {
		e.log.Debug("not taking over", "event", ev.Name, "holder", ev.Status.Holder.Identity, "why", why)
	}
	return got
}

func (e *Engine) takeOverWhy(ctx context.Context, ev *v1alpha1.LifecycleEvent) (*v1alpha1.LifecycleEvent, string) {
	old := ev.Status.Holder.Identity
	if !strings.HasPrefix(old, e.cfg.Node+"/") {
		return nil, ""
	}
	now := e.cfg.Clock.Now()
	if last, ok := e.tookOverAt[string(ev.UID)]; ok && now.Sub(last) < takeOverEvery {
		return nil, ""
	}
	if e.tookOverAt == nil {
		e.tookOverAt = map[string]time.Time{}
	}
	for uid, at := range e.tookOverAt { // events long gone
		if now.Sub(at) >= takeOverEvery {
			delete(e.tookOverAt, uid)
		}
	}
	e.tookOverAt[string(ev.UID)] = now
	if h, err := e.cfg.API.NodeLeaseHolder(ctx, now); err != nil {
		return nil, "reading the node's Lease: " + err.Error()
	} else if h != "" {
		return nil, "the node's Lease is held by " + h + ": a live agent"
	}
	n, err := e.cfg.API.GetNode(ctx)
	if err != nil {
		return nil, "reading the Node: " + err.Error()
	}
	if boot := e.cfg.Host.BootID(); n.Status.NodeInfo.BootID != boot {
		return nil, fmt.Sprintf("this host's boot ID %s is not the Node's (%q): not the node's machine", boot, n.Status.NodeInfo.BootID)
	}
	fresh, err := e.cfg.API.GetEvent(ctx, ev.Name)
	if err != nil || fresh.Status.Holder == nil || fresh.Status.Holder.Identity != old || fresh.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed {
		return nil, "the event changed"
	}
	t := metav1.NewTime(now)
	fresh.Status.Holder.Identity, fresh.Status.Holder.RenewTime = e.cfg.Identity, &t
	msg := fmt.Sprintf("taken over from %s by %s: its Lease expired and this host runs the Node's kubelet (boot %s; a re-imaged node)", old, e.cfg.Identity, e.cfg.Host.BootID())
	fresh.Status.Message = msg
	got, err := e.cfg.API.ClaimEventStatus(ctx, fresh)
	if err != nil {
		return nil, "rewriting the holder: " + err.Error()
	}
	e.log.Warn("took over an event of this node from another identity", "event", ev.Name, "from", old, "boot_id", e.cfg.Host.BootID())
	go func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.cfg.API.RecordEvent(rctx, got, corev1.EventTypeNormal, "TakenOver", msg, now)
	}()
	e.remember(got)
	return got, ""
}

// withEvent is list with ev in place of the event of its UID.
func withEvent(list []*v1alpha1.LifecycleEvent, ev *v1alpha1.LifecycleEvent) []*v1alpha1.LifecycleEvent {
	out := slices.Clone(list)
	for i, x := range out {
		if x.UID == ev.UID {
			out[i] = ev
		}
	}
	return out
}

// takeOverEvery paces takeOver's reads per event.
const takeOverEvery = 10 * time.Second

// claimedByOther returns an event bound to this node that a holder other
// than this agent has Claimed and not ended, or nil.
func (e *Engine) claimedByOther(list []*v1alpha1.LifecycleEvent) *v1alpha1.LifecycleEvent {
	for _, ev := range list {
		if ev.Spec.BindingNode != e.cfg.Node || ev.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed || ev.Status.Holder == nil {
			continue
		}
		if h := ev.Status.Holder.Identity; h != e.cfg.Identity && !slices.Contains(e.cfg.FormerIdentities, h) {
			return ev
		}
	}
	return nil
}

// markPending writes claimStatus Pending with msg on an event this agent
// cannot start yet, when its status does not say so already; slotWait
// also sets its WaitingForDisruptionBudget condition.
func (e *Engine) markPending(ctx context.Context, cached *v1alpha1.LifecycleEvent, msg string, slotWait bool) {
	want := metav1.ConditionFalse
	if slotWait {
		want = metav1.ConditionTrue
	}
	c := meta.FindStatusCondition(cached.Status.Conditions, v1alpha1.ConditionWaitingForDisruptionBudget)
	if cached.Status.ClaimStatus == v1alpha1.LifecycleEventPending && cached.Status.Message == msg && (c == nil && !slotWait || c != nil && c.Status == want) {
		return
	}
	ev := cached.DeepCopy()
	ev.Status.ClaimStatus = v1alpha1.LifecycleEventPending
	ev.Status.Message = msg
	now := e.cfg.Clock.Now()
	if slotWait {
		setCond(&ev.Status, v1alpha1.ConditionWaitingForDisruptionBudget, metav1.ConditionTrue, "AllSlotsTaken", msg, now)
	} else if c != nil {
		setCond(&ev.Status, v1alpha1.ConditionWaitingForDisruptionBudget, metav1.ConditionFalse, "NotWaiting", "", now)
	}
	if _, err := e.cfg.API.UpdateEventStatus(ctx, ev); err != nil && !apierrors.IsConflict(err) {
		e.log.Warn("marking a waiting event Pending failed", "event", ev.Name, "err", err)
		return
	}
	e.log.Info("event waits", "event", ev.Name, "why", msg)
}

// queuedBehind is the message of events queued behind the next in line:
// it names no event, so that a long queue costs one status write per event,
// not one per event and per claim.
const queuedBehind = "waiting: queued behind earlier events of this node (one at a time, oldest first)"

// markQueue marks the events waiting behind another (oldest first) Pending:
// the next in line says what it waits for (msg), the others queuedBehind.
func (e *Engine) markQueue(ctx context.Context, waiting []*v1alpha1.LifecycleEvent, msg string) {
	for i, c := range waiting {
		m := queuedBehind
		if i == 0 {
			m = msg
		}
		e.markPending(ctx, c, m, false)
	}
}

// queueForSlot marks ev Pending on its disruption budget, naming the
// holders.
func (e *Engine) queueForSlot(ctx context.Context, ev *v1alpha1.LifecycleEvent) {
	d := ev.Spec.Disruption
	holders, err := e.cfg.API.SlotHolders(ctx, d.Group, int(d.MaxConcurrent))
	held := strings.Join(holders, ", ")
	if err != nil || held == "" {
		held = "unknown"
	}
	msg := fmt.Sprintf("waiting for one of %d disruption slots of group %s (held by %s)", d.MaxConcurrent, d.Group, held)
	e.slotQueued = true
	e.queuePlanned(ctx, ev, msg, causeOf(ev), true)
}

// queuePlanned marks ev Pending with msg (slotWait: on its disruption
// budget) and the Node MaintenancePlanned=True with reason and msg.
func (e *Engine) queuePlanned(ctx context.Context, ev *v1alpha1.LifecycleEvent, msg, reason string, slotWait bool) {
	e.markPending(ctx, ev, msg, slotWait)
	cond := apiclient.NodeCondition{Type: v1alpha1.NodeConditionMaintenancePlanned, Status: corev1.ConditionTrue, Reason: reason,
		Message: eventMsg(ev.Name, ev.Spec.TransitionName, msg)}
	if err := e.cfg.API.SetNodeConditions(ctx, e.cfg.Clock.Now(), cond); err != nil {
		e.log.Warn("posting MaintenancePlanned failed; will retry", "event", ev.Name, "err", err)
		return
	}
	e.planned = ev.Name
}

// clearPlanned ends MaintenancePlanned=True for an event that no longer
// waits: it was claimed (the claim's own conditions end it) or is gone.
// At the first pass it reads the Node: a restart forgets what it posted.
func (e *Engine) clearPlanned(ctx context.Context, cands []*v1alpha1.LifecycleEvent) {
	if !e.plannedRead {
		n, err := e.cfg.API.GetNode(ctx)
		if err != nil {
			return
		}
		e.plannedRead = true
		for _, c := range n.Status.Conditions {
			if string(c.Type) == v1alpha1.NodeConditionMaintenancePlanned && c.Status == corev1.ConditionTrue {
				if _, rest, ok := strings.Cut(c.Message, "event "); ok {
					e.planned, _, _ = strings.Cut(rest, " ")
				}
			}
		}
	}
	if e.planned == "" {
		return
	}
	for _, c := range cands {
		if c.Name == e.planned {
			return // still waiting (or about to be claimed)
		}
	}
	cond := apiclient.NodeCondition{Type: v1alpha1.NodeConditionMaintenancePlanned, Status: corev1.ConditionFalse, Reason: ReasonEventCancelled,
		Message: fmt.Sprintf("event %s: no longer waits", e.planned)}
	if err := e.cfg.API.SetNodeConditions(ctx, e.cfg.Clock.Now(), cond); err == nil {
		e.planned = ""
	}
}

// unsettled marks a claim error after which the event is, or may be,
// Claimed on the server — by us (a claim write that timed out may have
// landed; the finalizer or the journal failed after it; an adoption
// failed) or by another holder (the claim lost its race): tryClaim claims
// nothing else before the next round has seen it, or one node would hold
// two claimed events.
type unsettled struct{ error }

func (u unsettled) Unwrap() error { return u.error }

// claim runs the claim protocol of doc.go for one event. It returns
// (nil, nil) when the event is not ours to run (not applicable, another
// driver host's, or failed at validation).
//
// The event is the watch's copy: every write below carries its
// resourceVersion, so a stale copy only loses the race (409) and the next
// round sees the fresh one. So a claim costs one read (the transition; the
// Node too for a nodeSelector) before its two writes (Lease, status).
func (e *Engine) claim(ctx context.Context, cached *v1alpha1.LifecycleEvent) (*active, error) {
	ev := cached.DeepCopy()
	ours := func(ev *v1alpha1.LifecycleEvent) bool {
		return ev.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed && ev.Status.Holder != nil && ev.Status.Holder.Identity == e.cfg.Identity
	}
	if ours(ev) {
		// Adoption writes nothing guarded before it acts, so it must not
		// trust the watch's copy: that copy can predate our own end state
		// (a watch catching up after an outage) and would run a finished
		// event again.
		fresh, err := e.cfg.API.GetEvent(ctx, ev.Name)
		if err != nil {
			return nil, unsettled{err}
		}
		ev = fresh
	}
	now := e.cfg.Clock.Now()
	adopt := ours(ev)
	if !adopt && ev.Status.ClaimStatus != "" && ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
		return nil, nil
	}
	lt, err := e.cfg.API.GetTransition(ctx, ev.Spec.TransitionName)
	if apierrors.IsNotFound(err) && adopt {
		// Ours already: a transition deleted since the claim does not stop
		// it (the claim fixed the driver, and the status names it).
		lt, err = &v1alpha1.LifecycleTransition{ObjectMeta: metav1.ObjectMeta{Name: ev.Spec.TransitionName},
			Spec: v1alpha1.LifecycleTransitionSpec{Driver: ev.Status.Driver.Name}}, nil
	}
	if apierrors.IsNotFound(err) {
		// The proposal's "skip and retry": `kubectl apply` of an event
		// before its transition works; it waits, Pending, saying why.
		// The Node says it is expected to undergo maintenance (the merged
		// KEP's MaintenancePlanned): a bound event is planned maintenance.
		e.queuePlanned(ctx, ev, fmt.Sprintf("waiting: LifecycleTransition %q not found", ev.Spec.TransitionName), ReasonTransitionNotFound, false)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d, ok := e.driverFor(lt.Spec.Driver)
	if !ok && adopt {
		// Ours, but its driver is not enabled here any more (the config, or
		// its hardware gone): adopted to fail and be aborted, as resume
		// does (goneDriver's plan refuses), not left Claimed for good with
		// every other event of the node waiting behind it.
		d, ok = goneDriver{name: lt.Spec.Driver, start: ev.Status.Driver.Start, end: ev.Status.Driver.End}, true
	}
	if !ok {
		return nil, nil // another driver host's (or a disabled driver): leave it
	}
	if !adopt { // ours already: where it applies was decided at its claim
		// Only a nodeSelector needs the Node's labels.
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: e.cfg.Node}}
		if lt.Spec.NodeSelector != nil {
			if node, err = e.cfg.API.GetNode(ctx); err != nil {
				return nil, err
			}
		}
		applies, err := apiclient.TransitionApplies(lt, node)
		if err != nil {
			return nil, e.reject(ctx, ev, err.Error())
		}
		if !applies {
			e.queuePlanned(ctx, ev, fmt.Sprintf("waiting: LifecycleTransition %q does not apply to node %s", lt.Name, e.cfg.Node), ReasonTransitionNotApplicable, false)
			return nil, nil
		}
	}
	params, opts, planErr := splitParams(ev.Spec.Parameters)
	if planErr == nil {
		if fixed, ok := e.fixedPlan(ev, adopt, params); ok {
			params = fixed
		} else {
			params, planErr = e.resolve(ctx, d, params)
		}
	}
	var steps []drivers.Step
	if planErr == nil {
		steps, planErr = d.Plan(params)
	}

	// A maintenance window and the gates, before the slot: an event that
	// waits for them stays Pending, holds no slot, and its sla does not run.
	if !adopt && planErr == nil {
		if msg, reason := e.startWait(ctx, ev, steps, opts, now); msg != "" {
			e.queuePlanned(ctx, ev, msg, reason, false)
			return nil, nil
		}
	}

	// The disruption slot before the claim (DESIGN §6): until one is free
	// the event stays Pending, and its sla clock (from the claim) does not
	// run while it queues. A slot taken for an event that then fails to be
	// claimed stays held for it (renewed at the next try) and frees itself
	// when the event ends or is gone.
	var slot string
	if !adopt && planErr == nil && ev.Spec.Disruption != nil {
		d := ev.Spec.Disruption
		h := apiclient.LeaseHolder{Identity: e.cfg.Identity, Event: ev.Name, EventUID: string(ev.UID), Duration: e.cfg.LeaseDuration}
		slot, err = e.cfg.API.AcquireSlot(ctx, d.Group, int(d.MaxConcurrent), h, now)
		if errors.Is(err, apiclient.ErrNoSlot) {
			e.queueForSlot(ctx, ev)
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
	}

	// The per-node Lease: at most one claimed event per node, across processes.
	holder := apiclient.LeaseHolder{Identity: e.cfg.Identity, Event: ev.Name, EventUID: string(ev.UID), Duration: e.cfg.LeaseDuration}
	if err := e.cfg.API.AcquireNodeLease(ctx, holder, now); err != nil {
		return nil, err
	}
	a := &active{name: ev.Name, uid: string(ev.UID), driver: d, steps: steps, tn: lt.Name, params: params, slot: slot,
		planned: e.planned == ev.Name}
	fin := ev // the object the finalizer is added to: the claim's result when we claim
	if adopt {
		a.status = ev.Status
	} else {
		sla := d.SLA()
		if lt.Spec.Sla != nil {
			sla = lt.Spec.Sla.Duration
		}
		t := metav1.NewTime(now)
		var deadline *metav1.Time
		if sla > 0 {
			deadline = ptrTime(now.Add(sla))
		}
		a.status = v1alpha1.LifecycleEventStatus{
			ClaimStatus: v1alpha1.LifecycleEventClaimed,
			Sla:         deadline,
			// The admin's state names, from the transition (DESIGN §2).
			Driver:  v1alpha1.LifecycleDriverStatus{Name: d.Name(), Start: string(lt.Spec.Start), End: string(lt.Spec.End)},
			Holder:  &v1alpha1.Holder{Identity: e.cfg.Identity, BootID: e.cfg.Host.BootID(), ClaimTime: &t, RenewTime: &t},
			Message: "claimed by " + e.cfg.Identity,
		}
		for _, s := range steps {
			a.status.Steps = append(a.status.Steps, v1alpha1.StepStatus{Name: s.Name, State: v1alpha1.StepPending})
		}
		setCond(&a.status, v1alpha1.ConditionProgressing, metav1.ConditionTrue, "Claimed", "claimed by "+e.cfg.Identity, now)
		setCond(&a.status, v1alpha1.ConditionWaitingForDisruptionBudget, metav1.ConditionFalse, "NotWaiting", "", now)
		ev.Status = a.status
		// The claim: a status update guarded by the resourceVersion we read.
		// gofail: var engineBeforeClaim struct{}
		got, err := e.cfg.API.ClaimEventStatus(ctx, ev)
		if err != nil {
			_ = e.cfg.API.ReleaseNodeLease(ctx, e.cfg.Identity)
			if apierrors.IsConflict(err) {
				// Claimed by someone else, maybe: the next round reads it.
				return nil, unsettled{fmt.Errorf("lost the claim race: %w", err)}
			}
			return nil, unsettled{err} // a write that timed out may have landed
		}
		// gofail: var engineAfterClaim struct{}
		e.cfg.Metrics.ClaimLatency.Observe(now.Sub(ev.CreationTimestamp.Time).Seconds())
		e.log.Info("claimed", "event", ev.Name, "driver", d.Name(), "transition", lt.Name)
		fin = got
	}
	// Finalizer before any side effect; the plan fixed at claim goes with
	// it (fixedPlan reads it back after a lost journal).
	var ann map[string]string
	if !adopt {
		ann = planAnnotation(params)
	}
	got, err := e.cfg.API.SetFinalizerWith(ctx, fin, true, ann)
	if err != nil {
		if apierrors.IsNotFound(err) {
			// Deleted right after our claim: nothing was done or reported
			// (the Node conditions go out with the snapshot below); take
			// back the node Lease the claim set.
			if rerr := e.cfg.API.ReleaseNodeLease(ctx, e.cfg.Identity); rerr != nil {
				e.log.Warn("releasing the node lease of a deleted event failed", "event", ev.Name, "err", rerr)
			}
			return nil, fmt.Errorf("the event was deleted during its claim: %w", err)
		}
		// Anything else: the event is Claimed by us on the server; the next
		// round adopts it (and keeps the Lease, which is ours).
		return nil, unsettled{fmt.Errorf("adding the finalizer: %w", err)}
	}
	e.remember(got)
	// gofail: var engineAfterFinalizer struct{}
	a.ev = ev
	if a.status.Sla != nil {
		a.deadline = a.status.Sla.Time
	}
	// The start's Node conditions are queued with the snapshot, in one
	// transaction: queued before it, a crash in between left them to be
	// delivered at the next start for an event the journal did not know,
	// and, deleted meanwhile, nobody took them back (the Node said
	// "mid-transition" for good; found by the fault schedules). A crash
	// before this commit leaves nothing: the event, Claimed by us, is
	// adopted at the next start, or gone.
	e.note(a, journal.NoticeClaimed, e.claimedText(a))
	var push []journal.OutboxEntry
	start, _ := a.nodeEntry(running)
	startConds := !adopt && planErr == nil
	if startConds {
		push = append(push, start)
	}
	if adopt {
		// The history rebuilt from the API goes in the snapshot's own
		// transaction: committed apart, a crash between them left the event
		// journaled with no steps, and the replay ran Done steps again (a
		// second reboot) or forgot the cordon was ours.
		a.seedSteps = e.rebuiltSteps(a)
		owned, err := e.rebuiltCordon(ctx, a)
		if err != nil {
			return nil, unsettled{err}
		}
		a.seedOwned = owned
	}
	if err := e.snapshot(a, journal.EventClaimed, push...); err != nil {
		return nil, unsettled{err}
	}
	// gofail: var engineAfterClaimSnapshot struct{}
	if adopt {
		e.log.Info("adopted an event this agent had claimed; steps rebuilt from its status", "event", a.name)
	}
	if startConds {
		a.nodePushed(start)
		poke(e.flushWake)
	}
	if planErr != nil {
		// Bad parameters: claimed, then failed with the reason; nothing was done.
		a.failNow = planErr
	}
	return a, nil
}

// planAnnotation is v1alpha1.AnnotationResolvedPlan for a plan: its
// resolved keys as a JSON object, or nil when it has none.
func planAnnotation(params map[string]string) map[string]string {
	fixed := map[string]string{}
	for k, v := range params {
		if strings.HasPrefix(k, drivers.ResolvedPrefix) {
			fixed[k] = v
		}
	}
	if len(fixed) == 0 {
		return nil
	}
	b, err := json.Marshal(fixed)
	if err != nil {
		return nil
	}
	return map[string]string{v1alpha1.AnnotationResolvedPlan: string(b)}
}

// fixedPlan is the plan of an event adopted without a journal record (the
// journal lost or re-imaged mid-event): the event's parameters with the
// resolved keys its claim wrote beside the finalizer
// (v1alpha1.AnnotationResolvedPlan), instead of resolving them again from
// a node the event already disrupted (a readiness snapshot taken after
// the reboot would not require the GPUs that are not back). ok is false
// when the event is not adopted or carries no such annotation (claimed by
// an older agent): the plan is then resolved as at claim. An annotation
// that does not parse is logged and ignored the same way; one that names
// a key outside the reserved prefix is ignored too.
func (e *Engine) fixedPlan(ev *v1alpha1.LifecycleEvent, adopt bool, params map[string]string) (map[string]string, bool) {
	raw, has := ev.Annotations[v1alpha1.AnnotationResolvedPlan]
	if !adopt || !has {
		return nil, false
	}
	var fixed map[string]string
	if err := json.Unmarshal([]byte(raw), &fixed); err != nil {
		e.log.Warn("adopted event: its resolved plan does not parse; resolving the plan again", "event", ev.Name, "annotation", v1alpha1.AnnotationResolvedPlan, "err", err)
		return nil, false
	}
	out := maps.Clone(params)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range fixed {
		if !strings.HasPrefix(k, drivers.ResolvedPrefix) {
			e.log.Warn("adopted event: resolved plan key outside the reserved prefix ignored", "event", ev.Name, "key", k)
			continue
		}
		out[k] = v
	}
	e.log.Info("adopted event: the plan fixed at claim read back from the event", "event", ev.Name, "keys", len(fixed))
	return out, true
}

// resolve fixes a Resolver driver's plan (see drivers.Resolver); other
// drivers run with the event's parameters as they are.
func (e *Engine) resolve(ctx context.Context, d drivers.Driver, params map[string]string) (map[string]string, error) {
	r, ok := d.(drivers.Resolver)
	if !ok {
		return params, nil
	}
	return r.Resolve(ctx, params)
}

// reject writes Failed on an event the agent cannot run, with the reason.
func (e *Engine) reject(ctx context.Context, ev *v1alpha1.LifecycleEvent, why string) error {
	now := metav1.NewTime(e.cfg.Clock.Now())
	ev.Status.ClaimStatus = v1alpha1.LifecycleEventFailed
	ev.Status.Message = why
	ev.Status.CompletionTime = &now
	ev.Status.Holder = &v1alpha1.Holder{Identity: e.cfg.Identity, BootID: e.cfg.Host.BootID(), ClaimTime: &now}
	setCond(&ev.Status, v1alpha1.ConditionProgressing, metav1.ConditionFalse, "Failed", why, now.Time)
	if _, err := e.cfg.API.ClaimEventStatus(ctx, ev); err != nil {
		return err
	}
	e.cfg.Metrics.Events.WithLabelValues("unknown", string(v1alpha1.LifecycleEventFailed)).Inc()
	e.log.Warn("event refused", "event", ev.Name, "reason", why)
	return errors.New(why)
}

// snapshot commits the event, its status and the engine's own attributes.
func (e *Engine) snapshot(a *active, st journal.EventState, push ...journal.OutboxEntry) error {
	obj := a.ev.DeepCopy()
	obj.Status = a.status
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	attrs := map[string]string{"transition": a.tn}
	if a.params != nil {
		raw, err := json.Marshal(a.params)
		if err != nil {
			return err
		}
		attrs["params"] = string(raw)
	}
	if slot := a.heldSlot(); slot != "" {
		attrs["slot"] = slot
	}
	if a.planned {
		attrs["planned"] = "true"
	}
	if a.outcome != 0 {
		attrs["outcome"] = strconv.Itoa(int(a.outcome))
		attrs["outcomeMessage"] = a.outcomeMsg
	}
	if err := e.cfg.Journal.PutEvent(journal.EventRecord{UID: a.uid, Name: a.name, Driver: a.driver.Name(),
		ResourceVersion: obj.ResourceVersion, State: st, Object: raw, Attrs: attrs, Notices: a.notices,
		Steps: a.seedSteps, Owned: a.seedOwned}, push...); err != nil {
		return fmt.Errorf("engine: journal event %s: %w", a.name, err)
	}
	a.jstate = st
	a.seedSteps, a.seedOwned = nil, nil
	e.noticesCommitted(a)
	return nil
}

// resume rebuilds an active event from its journal record.
func (e *Engine) resume(r journal.EventRecord) (*active, error) {
	var ev v1alpha1.LifecycleEvent
	if err := json.Unmarshal(r.Object, &ev); err != nil {
		return nil, fmt.Errorf("decode snapshot: %w", err)
	}
	d, ok := e.driverFor(r.Driver)
	if !ok {
		// Disabled (or its hardware gone) since the claim: the event cannot
		// go on, but it must not stay Claimed with its finalizer either.
		// It is aborted with the default undo (uncordon what it owns) and
		// ends Failed, saying why.
		d = goneDriver{name: r.Driver, start: ev.Status.Driver.Start, end: ev.Status.Driver.End}
		a := &active{name: r.Name, uid: r.UID, driver: d, ev: &ev, status: ev.Status, tn: r.Attrs["transition"], slot: r.Attrs["slot"],
			jstate: r.State, resumed: true,
			failNow: fmt.Errorf("driver %s is not enabled on this node any more (config drivers.*, or its hardware is gone); the event was aborted", r.Driver)}
		e.log.Warn("resuming an event whose driver is gone: aborting it", "event", a.name, "driver", r.Driver)
		return a, nil
	}
	// The plan fixed at claim, never a fresh resolution against the host.
	params, _, _ := splitParams(ev.Spec.Parameters) // older journals: no "params"
	if raw, ok := r.Attrs["params"]; ok {
		params = nil
		if err := json.Unmarshal([]byte(raw), &params); err != nil {
			return nil, fmt.Errorf("decode the journaled plan: %w", err)
		}
	}
	steps, planErr := d.Plan(params)
	a := &active{name: r.Name, uid: r.UID, driver: d, steps: steps, ev: &ev, status: ev.Status, params: params,
		tn: r.Attrs["transition"], slot: r.Attrs["slot"], jstate: r.State, failNow: planErr, resumed: true, planned: r.Attrs["planned"] == "true"}
	if a.status.Sla != nil {
		a.deadline = a.status.Sla.Time
	}
	if v, err := strconv.Atoi(r.Attrs["outcome"]); err == nil && v > 0 {
		a.outcome, a.outcomeMsg = journal.Outcome(v), r.Attrs["outcomeMessage"]
	}
	e.log.Info("resuming event from the journal", "event", a.name, "state", r.State.String())
	return a, nil
}

// goneDriver stands in for a driver that is not there any more on replay:
// it has no steps and no abort of its own (the engine's default undo runs).
type goneDriver struct{ name, start, end string }

func (g goneDriver) Name() string { return g.name }
func (g goneDriver) Short() string {
	if i := strings.LastIndex(g.name, "/"); i >= 0 {
		return g.name[i+1:]
	}
	return g.name
}
func (g goneDriver) Start() string      { return g.start }
func (g goneDriver) End() string        { return g.end }
func (g goneDriver) SLA() time.Duration { return 0 }
func (g goneDriver) Plan(map[string]string) ([]drivers.Step, error) {
	return nil, fmt.Errorf("driver %s is not enabled", g.name)
}

func setCond(st *v1alpha1.LifecycleEventStatus, typ string, status metav1.ConditionStatus, reason, msg string, now time.Time) {
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now)})
}

func isTransient(err error) bool {
	if err == nil {
		return false
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		code := st.Status().Code
		return code == 429 || code >= 500
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	return unreached(err) || timedOut(err)
}

// unreached reports whether err, not an API status (the callers look for
// one first), failed before any server answered: the connection refused or
// reset, no route, the name not resolvable. The node's own network not up
// (yet) reads so too: at boot the agent may run before the route or the
// address is there, and the server's name may not resolve until it is.
func unreached(err error) bool {
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ENETUNREACH, syscall.EHOSTUNREACH,
		syscall.ENETDOWN, syscall.EHOSTDOWN, syscall.EADDRNOTAVAIL} {
		if errors.Is(err, errno) {
			return true
		}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	s := err.Error()
	for _, sub := range []string{"connection refused", "connection reset", "no route to host", "network is unreachable"} {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// timedOut reports whether err, not an API status, is a try that timed out
// or lost its connection without an answer.
func timedOut(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	s := err.Error()
	for _, sub := range []string{"i/o timeout", "Client.Timeout", "TLS handshake timeout", "EOF", "client connection lost",
		"http2: client connection", "broken pipe"} {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

var _ = drivers.Prefix

// rebuiltCordon gives an adopted event back the ownership of the Node's
// cordon when the Node's annotation says this event made it: the journal
// that recorded the ownership is gone (a re-imaged node, a lost disk), and
// the annotation, written with the cordon, is the evidence it kept.
// Without it the event's uncordon would leave the node cordoned for good.
// It returns the change to record with the adoption's snapshot (none when
// the cordon is not the event's or already recorded).
func (e *Engine) rebuiltCordon(ctx context.Context, a *active) ([]journal.Change, error) {
	ch := journal.Change{Kind: journal.ChangeCordon, Node: e.cfg.Node, EventUID: a.uid, Value: a.name}
	owned, err := e.cfg.Journal.Owned()
	if err != nil {
		return nil, err
	}
	for _, o := range owned {
		if o.Key() == ch.Key() && o.EventUID == a.uid {
			return nil, nil
		}
	}
	n, err := e.cfg.API.GetNode(ctx)
	if err != nil {
		return nil, err
	}
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != a.name {
		return nil, nil
	}
	e.log.Info("adopted event: the Node's cordon is its own (the Node's annotation names it)", "event", a.name)
	return []journal.Change{ch}, nil
}

// rebuiltSteps is the step log of an adopted event (claimed by this
// agent's identity, but not in its journal: the journal was lost or moved
// aside as corrupt) rebuilt from the status the API holds, to be recorded
// with the adoption's snapshot, so that no step is repeated without proof:
// a step the status says is Done is recorded done; a step it says is
// Running gets an intent with the boot ID of the claim, so the step's Done
// check decides on replay (a reboot is done when the boot ID changed); a
// step it says Failed is recorded failed, so the failure stands and goes
// to the abort (run again, an upgrade whose outcome could not be told
// would run twice); a Skipped one is recorded skipped.
func (e *Engine) rebuiltSteps(a *active) []journal.StepRecord {
	boot := ""
	if a.status.Holder != nil {
		boot = a.status.Holder.BootID
	}
	var out []journal.StepRecord
	for _, st := range a.status.Steps {
		var end journal.StepState // the PhaseDone record's state; 0: none
		switch st.State {
		case v1alpha1.StepRunning:
		case v1alpha1.StepDone:
			end = journal.StepDone
		case v1alpha1.StepFailed:
			end = journal.StepFailed
			if st.Name == drivers.StepWaitWorkloads {
				// A wait, not an act: it looks once more (its deadline
				// counts from the status's start) and, not ready, fails
				// again and journals what readiness.onTimeout keeps —
				// which a failure recorded here would lose.
				end = 0
			}
		case v1alpha1.StepSkipped:
			end = journal.StepSkipped
		default:
			continue
		}
		attempt := int(st.Attempt)
		if attempt < 1 {
			attempt = 1
		}
		// The intent keeps the step's start as the status says it, so what
		// counts from it (the readiness wait's deadline:
		// Runtime.StepStarted) does not start again at the adoption.
		var at time.Time
		if st.StartTime != nil {
			at = st.StartTime.Time
		}
		out = append(out, journal.StepRecord{Step: st.Name, Phase: journal.PhaseIntent, At: at,
			State: journal.StepRunning, Attempt: attempt, BootID: boot, Message: "rebuilt from the event's status"})
		switch end {
		case journal.StepDone, journal.StepSkipped:
			// Its message as the status has it: what the conditions read
			// from it (drivers.CordonNotOurs) must survive the rebuild.
			msg := st.Message
			if msg == "" {
				msg = "rebuilt from the event's status"
			}
			out = append(out, journal.StepRecord{Step: st.Name, Phase: journal.PhaseDone,
				State: end, Attempt: attempt, BootID: boot, Message: msg})
		case journal.StepFailed:
			// Its message is the failure's: the abort and the end say it.
			msg := st.Message
			if msg == "" {
				msg = "step " + st.Name + " failed (rebuilt from the event's status)"
			}
			out = append(out, journal.StepRecord{Step: st.Name, Phase: journal.PhaseDone,
				State: end, Attempt: attempt, BootID: boot, Message: msg})
		}
	}
	return out
}
