// Package notify tells people what the agent does: at a claim, a failed
// step and an end state the engine queues a notice in the journal (in the
// transaction that commits the state, see internal/engine/notices.go), and
// a Notifier sends each to every URL of notifications.urls through
// shoutrrr (github.com/nicholas-fedor/shoutrrr, the maintained fork of the
// library kured uses): Slack, Microsoft Teams, Mattermost, Discord,
// generic webhooks and the rest of shoutrrr's services, one URL syntax.
//
// Decisions, for an operator replacing kured's --notify-url:
//
//   - Asynchronous and best-effort. Queueing joins a journal commit the
//     engine makes anyway; sending runs in its own goroutine and nothing
//     waits for it: not a step, not the end of an event, not a shutdown
//     (the agent stops without flushing). A send that takes longer than
//     notifications.timeout counts as failed.
//   - Durable. A notice stays in the journal until every target took it, so
//     one queued before a reboot (the network already down) is sent after
//     the boot, and the "complete" message of an event that ends after a
//     reboot is queued with the end state itself.
//   - At least once per target, in order. Each target has its own worker,
//     which sends the notices oldest first; which targets took a notice is
//     journaled after each send, and the notice is deleted in the write
//     that records the last target. A crash between a target's answer and
//     that write sends it to that target again. A failed send holds that
//     target's later notices (a "Succeeded" never arrives before its
//     "claimed") and is retried on a back-off (5 s doubling to 5 min) until
//     the notice is 24 h old; then it is given up with an error log and
//     lifecycle_agent_notifications_dropped_total.
//   - Bounded. A target that is down or hangs delays no other target. A
//     send that outlives notifications.timeout counts as failed; as
//     shoutrrr's services use HTTP clients without a deadline, the
//     request itself may go on: it holds one goroutine, and the target is
//     skipped until it returns.
//   - Secret-safe. URLs carry tokens: a target is named in logs and errors
//     by its service and TargetID (12 hex digits of its SHA-256), a bad URL
//     by its place in the list, and error texts have the URL's parts cut
//     out.
//   - Which messages. A LifecycleEvent's claim, its failed step (the
//     failure that ends it, not a retried transient one) and its end state.
//     The local shutdown path (logind) sends nothing: a node going down
//     must not wait for, or depend on, the network.
//
// Bad URLs are refused at load (internal/config, with file:line); whether a
// target is reachable is what `lifecycle-agent doctor --notify-test` checks
// (it sends a test message).
package notify
