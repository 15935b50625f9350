// Package engine claims this node's LifecycleEvents and runs them, one at a
// time, through the journal.
//
// Claim protocol (at most one claimed event per node):
//  1. The event is bound to this node (the watch is filtered server-side),
//     Pending, not being deleted; its LifecycleTransition exists, applies to
//     this node (nodeName, nodeSelector against the Node's labels, or
//     allNodes) and names an enabled driver of ours.
//  2. The per-node Lease node-<node> in lifecycle-system is taken (or
//     renewed) for this agent's identity. Another live holder means another
//     agent process for this node is busy: wait.
//  3. status is updated to Claimed (holder, driver, sla, steps) with the
//     event's resourceVersion: of two claimers exactly one wins, the other
//     gets 409 and gives the lease back.
//  4. The finalizer lifecycle.x-k8s.io/agent is added, then the event's
//     snapshot is committed to the journal — both before any side effect.
//
// A claim that fails after its status write may have landed (a timeout, a
// lost race, the finalizer or the journal failing after it) ends the round:
// the event may be Claimed, so nothing else is claimed before the next
// round has seen it, and that round adopts this agent's own Claimed events
// before it looks at Pending ones. Leases left held by a claim cut short
// for an event since gone are released by releaseStaleLeases.
//
// Each step then goes: journal intent (Running, attempt, boot ID) committed
// → status (through the journal's outbox) → act → journal done. The step's
// Done reaches the API with the next status write (the next step's Running,
// a wait for a disruption slot, or the end state), not in a write of its own.
// Status and Node conditions are never written directly: they are pushed to
// the outbox, which supersedes older entries of the same kind, and a
// flusher delivers them in order while the API server is reachable. So an
// older state never overwrites a newer one, and nothing is lost offline.
// A status that only shows live progress — a progress message, the Running
// of a step without a Done check — lingers up to a second at the head of
// the outbox, so that the next state supersedes it: a fast step costs no
// status write of its own (pushStatusLazy). The Running of a step with a
// Done check goes out at once, and the step waits for its delivery before
// it acts (awaitStatus; at most 10 s, and not while the API server is
// unreachable): after a lost journal it is what makes the replay ask the
// driver before acting again, and a reboot that went ahead of the
// asynchronous delivery took it down with the old boot
// (test/crash TestRunningDeliveredBeforeReboot).
//
// API cost: the claim takes this node's transition from an informer
// (apiclient.WatchTransitions; a transition for several nodes is read, and
// the Node too for a nodeSelector) and takes the Lease and the status with
// the copies the watch and its own last writes hold, falling back to a read only on a conflict
// (both on the client's claim lane: a token bucket of their own, so a claim
// never waits for the previous event's writes, apiclient.New);
// likewise status writes, the finalizer and Node conditions reuse what the
// previous write returned. An event then costs, in writes: claim, Lease
// taken and released, finalizer added and removed, the LifecycleTransition
// Node condition set and cleared, at most one status write per step (none
// for a step without a Done check that ends within a second) plus the end
// state, one Kubernetes Event with the outcome (and a Warning per failed
// step), and the driver's own writes (cordon, evictions). docs/benchmarks.md
// section 7 has the counts per driver and, for each of these writes, the
// test that fails without it. An event this process has finished is never
// claimed again from the watch's copy: a watch that runs behind our own
// writes still shows it Pending, and the guarded claim would be refused
// only after the slot and the node Lease had been taken for it (writes for
// nothing, and a slot left held; TestNoClaimFromAStaleWatch).
//
// Replay: at start every unfinished journal event resumes. Steps whose done
// record is committed are skipped; a step whose intent is committed but not
// its done record is checked with the driver's Done (a reboot step is done
// when the boot ID changed) or, if it has none, repeated (it is idempotent).
//
// Ending: at the deadline (status.sla) or when the event is deleted, the
// running step's context is cancelled (the next safe point), the driver's
// abort runs — by default: undo the cordon we own — and SlaExpired or Failed
// is written. On every end state the finalizer is removed only after the
// final status was accepted, then the slot and the node Lease are released
// and the journal moves the event to its history. Finished events are
// deleted eventRetention after completion (0: at once, by finish itself,
// not when the watch shows the end; collect deletes what finish could not).
//
// Disruption budget (spec.disruption): before the first disruptive step the
// agent holds one of the Leases <group>-0…<group>-(maxConcurrent-1); while
// it waits, condition WaitingForDisruptionBudget is True. The slot is kept,
// renewed and recorded in the journal until the event ends.
//
// Windows and gates (Config.Windows, Config.Gates; internal/maintenance):
// an event with a disruptive step is claimed only inside a maintenance
// window and when every gate passes. They are checked before the slot and
// the claim; until then the event is Pending saying why, and the Node's
// MaintenancePlanned=True names it. Parameters maintenanceWindow=ignore and
// gates=ignore are the engine's own (splitParams): the driver never sees
// them.
//
// All time comes from the injected clock; the engine never sleeps.
package engine
