// Command kubectl-lifecycle is a kubectl plugin (`kubectl lifecycle …`) that
// runs node lifecycle transitions through the lifecycle-agent on each node:
// it creates LifecycleEvents, follows them, and rolls a transition across
// many nodes under a disruption budget. The agents do the work; the plugin
// only asks and reports, so an event it created goes on when it exits.
// User documentation: docs/plugin.md.
//
// Commands (global flags are kubectl's: --kubeconfig, --context, --user,
// --server, --as, …, through cli-runtime's ConfigFlags; no -n, both kinds
// are cluster-scoped):
//
//	transitions [NODE]                     what each node's agent can do
//	run DRIVER NODE [--param k=v]… [--wait] [--timeout D] [-o json|name]
//	drain|uncordon|reboot NODE             run DRIVER NODE --wait
//	status [NODE|EVENT] [-l SEL]           events table, or one event in detail
//	cancel (EVENT…|-l SEL) [--wait]        delete: the agent cancels at a safe point
//	history [NODE]                         finished events, oldest first
//	rollout DRIVER (-l SEL|NODE…) --max-concurrent N [--max-failures M]
//	        [--wait] [--timeout D] [--group G] [--param k=v]… [--retry-failed]
//	version [-o json]
//
// Listing commands take -o wide|json|yaml|name|jsonpath=…|go-template=….
// The commands that act (run and its shorthands, rollout, cancel) take
// -o json|name (result.go): progress goes to stderr, stdout holds only the
// bare event names or one JSON object with the command's result and exit
// code; version takes -o json. Any other -o is a usage error, before any
// API call.
//
// Exit codes: the one table of both binaries (internal/exitcode, appended
// to every command's --help): 0 success; 1 the event (or a rollout node)
// Failed, or an API error; 2 usage (bad flags or arguments, or a driver the
// node does not offer: the message lists what it offers); 3 the event's
// SLA expired; 4 --timeout passed first (the work goes on); 5 the event was
// deleted before it ended (cancelled: no end state); 6 the API server did
// not answer (refused, reset, unreachable, timed out or unavailable: retry
// later); 130 interrupted (SIGINT, SIGTERM; the work goes on).
//
// run names its event <NODE>-<DRIVER>-<random> (generateName on the
// transition's name) and labels it app.kubernetes.io/managed-by=
// kubectl-lifecycle. A followed event counts as ended once it is in an end
// state and the agent removed its finalizer (the agent does so only after
// the end state and the Node conditions were written), or 15 s after the
// end state, whichever is first.
//
// Rollout. Each node gets the event rollout-<group>-<node>-<driver> (cut
// to 253 characters with a hash when longer), labelled
// lifecycle.x-k8s.io/rollout=<group>, with spec.disruption {group,
// maxConcurrent}. The agents hold one of the slot leases <group>-0 …
// <group>-(N-1) in lifecycle-system from their first disruptive step to the
// end of the event: that is the budget, and it holds without the plugin.
// With --wait the plugin also orders the rollout, in node-name order:
//
//  1. adopt the group's existing events (finished ones count as done or
//     failed; a node whose event the agent already deleted counts as done
//     when its LifecycleTransition condition names that event and the
//     transition's end state);
//  2. while fewer than N of the rollout's events are unfinished and fewer
//     than M nodes have failed (M = 0: no limit), create the next node's
//     event;
//  3. on every change print "done d/T, running r, waiting w, failed f"
//     (running: created, not ended; waiting: not created yet);
//  4. once M nodes failed create nothing more, wait for the running ones,
//     and exit 1 naming the failed nodes and those never started.
//
// Keeping at most N events unfinished (rather than creating all and
// leaving the queue to the slots) makes --max-failures exact — at most N-1
// more nodes are in flight when the limit is hit — keeps the other nodes
// unclaimed and free for other work, and means a dead plugin starts
// nothing new. Without --wait the plugin creates every event at once and
// returns: the slots still bound the disruption, but no failure limit
// applies (--max-failures without --wait is a usage error).
//
// The default group is <driver>-<first 8 hex digits of sha256 over the
// driver and the sorted node names, or the canonical selector>, so that
// running the same command again resumes instead of duplicating;
// --retry-failed deletes the group's failed events first so those nodes
// run again.
package main
