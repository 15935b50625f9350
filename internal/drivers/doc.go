// Package drivers holds the built-in lifecycle drivers. A driver is a plan:
// given an event's parameters it validates them and returns the ordered
// steps of its transition. It never touches bbolt or client-go: the engine
// owns ordering and durability and hands each step the verbs it may use
// (Runtime), so a driver is testable with recording fakes.
//
// Step contract:
//   - Run must be safe to repeat on replay, or the step has a Done check
//     that tells, from the journal's intent record (attempt, boot ID), whether
//     the action already happened. The engine calls Done before re-running a
//     step whose intent was committed but whose completion was not.
//   - NeedsAPI steps are retried while the API server is unreachable
//     (every second while it cannot be reached, on a back-off otherwise:
//     engine retryWait); the others run offline.
//   - Disruptive steps wait for a disruption-budget slot when the event has
//     spec.disruption.
//   - What a step changes and must undo on abort (our cordon) is recorded
//     through Runtime.Own before the change, and released with Disown.
//
// Driver names are lifecycle-agent.x-k8s.io/<name>.
package drivers
