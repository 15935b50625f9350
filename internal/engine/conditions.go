package engine

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Node conditions (docs/conditions.md). Two kinds are written:
//
//   - LifecycleTransition, from the LifecycleEvent proposal: True while an
//     event runs, reason the transition's start state; at the end False with
//     the end state, Failed, SlaExpired or Cancelled.
//   - The Node Lifecycle Conditions of KEP-5683 as merged (k8s.io/api
//     core/v1 constants): DrainInProgress, Drained, MaintenancePlanned,
//     MaintenanceInProgress, GracefulNodeShutdownInProgress. There the type
//     is the state, the status says whether it is active, and the reason is
//     a cause category from the vocabulary below — never a state name.
//
// Every condition an event writes is computed from the event's status (its
// steps) and written whole, through the outbox, whenever it changes: a
// replay computes the same set again.

// Reasons: what caused a condition's status.
const (
	// An event created through the API (an admin, a rollout, a controller).
	ReasonAdminRequested = "AdminRequested"
	// An event created by `lifecycle-agent request` on the node (a local
	// provisioning pipeline).
	ReasonLocalRequest = "LocalRequest"
	// An event created by the agent's GPU health monitor (gpu.autoRemediate).
	ReasonGPURemediation = "GPURemediation"
	// A reboot the agent requested for its node's RebootRequired
	// (needs.reboot.policy request).
	ReasonRebootRequired = "RebootRequired"
	// logind announced a shutdown (the shutdown driver).
	ReasonNodeShutdown = "NodeShutdown"
	// A drain's criteria were met: the node holds no evictable pod.
	ReasonDrainCompleted = "DrainCompleted"
	// A drain ended (failed, cancelled, deadline) before its criteria were met.
	ReasonDrainIncomplete = "DrainIncomplete"
	// Our uncordon (the uncordon driver, the end of a reboot or upgrade)
	// put the node back in service.
	ReasonReturnedToService = "ReturnedToService"
	// The maintenance a queued event planned has started (MaintenancePlanned False).
	ReasonMaintenanceStarted = "MaintenanceStarted"
	// The event's disruptive work ended successfully.
	ReasonMaintenanceCompleted = "MaintenanceCompleted"
	// The event ended Failed, was cancelled (deleted), or ran out of its sla.
	ReasonEventFailed    = "EventFailed"
	ReasonEventCancelled = "EventCancelled"
	// MaintenancePlanned True while a bound event waits for its
	// LifecycleTransition: not created yet, or not for this node.
	ReasonTransitionNotFound      = "TransitionNotFound"
	ReasonTransitionNotApplicable = "TransitionNotApplicable"
	// ReasonCancelled is the Kubernetes Event's reason, on the
	// LifecycleEvent and the Node, for an event deleted before it ended,
	// and its Progressing condition's.
	ReasonCancelled        = "Cancelled"
	ReasonDeadlineExceeded = "DeadlineExceeded"
	// The node started again after a shutdown; a shutdown logind cancelled.
	ReasonNodeStarted       = "NodeStarted"
	ReasonShutdownCancelled = "ShutdownCancelled"
)

// Values of the label lifecycle.x-k8s.io/requested-by on events the agent
// itself creates.
const (
	labelRequestedBy = "lifecycle.x-k8s.io/requested-by"
	requestedLocal   = "local"           // engine.Request
	requestedGPUHeal = "gpu-health"      // gpuhealth.RequestedBy
	requestedNeeds   = "reboot-required" // needs.RequestedByNeeds
)

// running is the "end" of an event that has not ended: its conditions
// while it runs (eventConditions, pushNode).
const running journal.Outcome = 0

// The two forms of a condition message (docs/conditions.md): the
// LifecycleTransition condition's, and every other condition's.
func transitionMsg(transition, event string) string {
	return fmt.Sprintf("Lifecycle Transition '%s' (event %s)", transition, event)
}

func eventMsg(event, transition, what string) string {
	return fmt.Sprintf("event %s (transition %s): %s", event, transition, what)
}

// conditionOf reports whether a condition message, in one of the two forms
// above, names event.
func conditionOf(msg, event string) bool {
	return strings.Contains(msg, "(event "+event+")") || strings.HasPrefix(msg, "event "+event+" (")
}

// causeOf is the reason of an event's True conditions: who asked for it.
func causeOf(ev *v1alpha1.LifecycleEvent) string {
	if ev != nil {
		switch ev.Labels[labelRequestedBy] {
		case requestedLocal:
			return ReasonLocalRequest
		case requestedGPUHeal:
			return ReasonGPURemediation
		case requestedNeeds:
			return ReasonRebootRequired
		}
	}
	return ReasonAdminRequested
}

func endCause(end journal.Outcome) string {
	switch end {
	case journal.OutcomeSlaExpired:
		return ReasonDeadlineExceeded
	case journal.OutcomeCancelled:
		return ReasonEventCancelled
	}
	return ReasonEventFailed
}

// drainSteps are the drain's own steps in every driver that drains; they
// are DrainInProgress, not MaintenanceInProgress.
func drainStep(name string) bool { return name == "cordon" || name == "evict" || name == "wait-empty" }

// eventConditions are the Node conditions of event a: running (end "") or
// ended (end: Succeeded, Failed, SlaExpired, Cancelled).
func (a *active) eventConditions(end journal.Outcome) []apiclient.NodeCondition {
	a.statusMu.Lock()
	steps := append([]v1alpha1.StepStatus(nil), a.status.Steps...)
	start, stop := a.status.Driver.Start, a.status.Driver.End
	current, message := a.status.CurrentStep, a.status.Message
	a.statusMu.Unlock()
	if start == "" {
		start, stop = a.driver.Start(), a.driver.End()
	}
	state := map[string]v1alpha1.StepState{}
	leftCordon := false // the node was cordoned already: its uncordon leaves it
	for _, s := range steps {
		state[s.Name] = s.State
		if s.Name == "cordon" && s.Message == drivers.CordonNotOurs {
			leftCordon = true
		}
	}
	_, drains := state["evict"]
	_, uncordons := state["uncordon"]
	done := func(n string) bool { return state[n] == v1alpha1.StepDone || state[n] == v1alpha1.StepSkipped }
	maint, maintStarted := false, false
	ownUncordon := false // its uncordon lifts only a cordon it made
	for _, s := range a.steps {
		ownUncordon = ownUncordon || s.UncordonsOwn
		if s.Disruptive && !drainStep(s.Name) {
			maint = true
			if st, ok := state[s.Name]; ok && st != v1alpha1.StepPending {
				maintStarted = true
			}
		}
	}
	cause := causeOf(a.ev)
	ltMsg := transitionMsg(a.tn, a.name)
	msg := func(what string) string { return eventMsg(a.name, a.tn, what) }
	cond := func(typ string, on bool, reason, m string) apiclient.NodeCondition {
		st := corev1.ConditionFalse
		if on {
			st = corev1.ConditionTrue
		}
		return apiclient.NodeCondition{Type: typ, Status: st, Reason: reason, Message: m}
	}

	var out []apiclient.NodeCondition
	switch end {
	case running:
		out = append(out, cond(v1alpha1.NodeConditionLifecycleTransition, true, start, ltMsg))
	case journal.OutcomeSucceeded:
		out = append(out, cond(v1alpha1.NodeConditionLifecycleTransition, false, stop, ltMsg))
	default:
		out = append(out, cond(v1alpha1.NodeConditionLifecycleTransition, false, end.String(), ltMsg))
	}
	if a.ev != nil && a.ev.Spec.Disruption != nil {
		g := a.ev.Spec.Disruption.Group
		held := a.heldSlot() != ""
		switch {
		case end == running && a.waitingSlot():
			out = append(out, cond(v1alpha1.NodeConditionMaintenancePlanned, true, cause, msg("waiting for a disruption slot of group "+g)))
		case held:
			out = append(out, cond(v1alpha1.NodeConditionMaintenancePlanned, false, ReasonMaintenanceStarted, msg("holding a disruption slot of group "+g)))
		case end != running:
			// Ended without a slot (it may have waited before a restart).
			out = append(out, cond(v1alpha1.NodeConditionMaintenancePlanned, false, endCause(end), msg("ended "+strings.ToLower(end.String())+" before its disruption slot")))
		}
	}
	if a.planned && (a.ev == nil || a.ev.Spec.Disruption == nil) {
		// It waited for a maintenance window or the gates; it runs now.
		out = append(out, cond(v1alpha1.NodeConditionMaintenancePlanned, false, ReasonMaintenanceStarted, msg("started")))
	}
	started := func(n string) bool { st, ok := state[n]; return ok && st != v1alpha1.StepPending }
	if drains && (started("cordon") || started("evict")) {
		criteria := done("wait-empty")
		switch {
		case criteria:
			out = append(out, cond(v1alpha1.NodeConditionDrainInProgress, false, ReasonDrainCompleted, msg("drain criteria met")))
		case end == running:
			out = append(out, cond(v1alpha1.NodeConditionDrainInProgress, true, cause, msg("draining")))
		default:
			out = append(out, cond(v1alpha1.NodeConditionDrainInProgress, false, endCause(end), msg("drain ended "+strings.ToLower(end.String()))))
		}
		switch {
		case criteria && !done("uncordon") && (end == running || end == journal.OutcomeSucceeded && !uncordons):
			out = append(out, cond(v1alpha1.NodeConditionDrained, true, ReasonDrainCompleted, msg("no evictable pod left on the node")))
		case criteria && leftCordon:
			// Drained, and its uncordon, or its abort, leaves the cordon
			// it found (an earlier drain event's, an admin's): not back in
			// service, however it ends.
			out = append(out, cond(v1alpha1.NodeConditionDrained, true, ReasonDrainCompleted, msg("no evictable pod left on the node; the cordon it found stays")))
		case done("uncordon") && !leftCordon:
			out = append(out, cond(v1alpha1.NodeConditionDrained, false, ReasonReturnedToService, msg("uncordoned: back in service")))
		case criteria && a.returned:
			// A later step failed (or the event was cancelled) after the
			// drain completed, and the abort uncordoned the node.
			out = append(out, cond(v1alpha1.NodeConditionDrained, false, ReasonReturnedToService, msg("ended "+strings.ToLower(end.String())+"; uncordoned by its abort: back in service")))
		default:
			out = append(out, cond(v1alpha1.NodeConditionDrained, false, ReasonDrainIncomplete, msg("drain criteria not met")))
		}
	} else if !drains && uncordons && !ownUncordon && end == journal.OutcomeSucceeded {
		// The uncordon driver: the node is back in service. (Failed, it
		// leaves Drained as an earlier drain set it. A reboot without
		// its drain made no cordon and lifts none: Drained stays too.)
		out = append(out, cond(v1alpha1.NodeConditionDrained, false, ReasonReturnedToService, msg("uncordoned: back in service")))
	}
	if maint && maintStarted {
		switch end {
		case running:
			what := "in progress"
			if current == drivers.StepWaitWorkloads && state[current] == v1alpha1.StepRunning && strings.HasPrefix(message, drivers.ReadinessWaiting) {
				// What the node waits for before its uncordon (the step's
				// progress, written when it changes: see Progress).
				what += ": " + message
			}
			out = append(out, cond(v1alpha1.NodeConditionMaintenanceInProgress, true, cause, msg(what)))
		case journal.OutcomeSucceeded:
			out = append(out, cond(v1alpha1.NodeConditionMaintenanceInProgress, false, ReasonMaintenanceCompleted, msg("complete")))
		default:
			out = append(out, cond(v1alpha1.NodeConditionMaintenanceInProgress, false, endCause(end), msg("ended "+strings.ToLower(end.String()))))
		}
	}
	return out
}

// pushNode queues event a's Node conditions (running: end "") when they
// differ from the last ones queued.
func (e *Engine) pushNode(a *active, end journal.Outcome) error {
	entry, changed := a.nodeEntry(end)
	if !changed {
		return nil
	}
	if _, err := e.cfg.Journal.OutboxPush(entry); err != nil {
		e.log.Error("outbox push", "event", a.name, "err", err)
		return err
	}
	a.nodePushed(entry)
	poke(e.flushWake)
	return nil
}

// nodeEntry is the outbox entry of the event's Node conditions for end, and
// whether it differs from the last one pushed.
func (a *active) nodeEntry(end journal.Outcome) (journal.OutboxEntry, bool) {
	raw, _ := json.Marshal(nodePayload{Conditions: a.eventConditions(end)})
	return journal.OutboxEntry{UID: a.uid, Kind: journal.OutboxNodeCondition, Payload: raw}, a.lastNode != string(raw)
}

// nodePushed records that entry (from nodeEntry) is in the outbox.
func (a *active) nodePushed(entry journal.OutboxEntry) {
	a.lastNode = string(entry.Payload)
	a.nodeStarted = true
}
