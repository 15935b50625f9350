// Package readiness decides whether a node given back after a disruptive
// event (a reboot, an OS upgrade, a GPU reset with a drain) can take its
// work back: the checks that run before the uncordon ("Ready means ready",
// DESIGN.md).
//
// At claim the agent takes a Snapshot of what the node had: the count of
// every extended resource in status.allocatable (nvidia.com/gpu, …) and
// the DaemonSets with a Ready pod bound to the node. The snapshot is part
// of the plan the engine journals at claim (drivers.Resolver), so a crash
// or a reboot during the wait resumes it against the same baseline.
//
// Before the uncordon, Config.NotReady lists what is not back yet, each
// item one short phrase a user can act on:
//
//   - daemonsets: each DaemonSet that had a Ready pod on the node at claim
//     has one again (a pod of this node, Ready, not terminating);
//   - resources: each extended resource is allocatable at least at its
//     claim-time count (the NVIDIA device plugin re-registers the GPUs
//     tens of seconds after the kubelet is Ready);
//   - conditions: each configured Node condition type has its healthy
//     status (node-problem-detector's, or GPUHealthy True where the agent
//     runs the GPU stack);
//   - command: an optional command exits 0.
//
// What an operator of a real fleet expects, and so the defaults:
// daemonsets, resources and conditions are on (a node given back must be
// back); the command is off until configured; the wait is bounded by
// readiness.timeout (10m). A timeout fails the event naming what never
// became ready and, by default, leaves the node cordoned with the event's
// cordon annotation in place (readiness.onTimeout: keepCordoned) — the
// disruption slot was held until then, so the next node of a group never
// started. readiness.onTimeout: uncordon gives the node back anyway (the
// abort lifts the cordon as for any failure): pods may then be scheduled
// onto a node whose DaemonSets or devices are not back.
//
// The per-event parameter readinessChecks narrows or skips them: "none",
// or a comma list of daemonsets, resources, conditions, command.
//
// Config.DaemonSets (a DaemonSetFilter: namespaces and a label selector)
// narrows which DaemonSets are required; the zero value requires every one
// with a Ready pod at claim. Decisions: the selector matches the labels of
// the DaemonSet's pod on the node, not of the DaemonSet object, because the
// node's identity may read its own pods and not DaemonSets (the Node
// authorizer); and only Take applies it, so an event requires what its
// journaled snapshot lists, whatever the configuration says after a
// restart. NewDaemonSetFilter names a bad namespace or selector; the
// config keys that feed it (readiness.daemonSets.namespaces, .selector)
// are not wired yet (internal/config, internal/agent).
//
// # The wait (drivers.Readiness, step wait-workloads-ready)
//
// What is not ready is said where a user looks: the event's status message
// and, while the step runs, the Node's MaintenanceInProgress message (the
// engine appends the step's progress when it begins with
// drivers.ReadinessWaiting). Both are written when the list of what is
// missing changes, and when the API server stops answering (once, with
// its first error) or answers again — never once per poll: a 10-minute wait
// on a 2 s poll must not cost 300 status and Node writes.
//
// An API error is transient. NotReady returns it (it cannot judge a Node it
// could not read); the wait keeps what it read last and polls again until
// readiness.timeout. Decisions:
//
//   - the step is not a NeedsAPI step: the engine retries those when their
//     error reads as an outage, and the timeout's error names the last API
//     error (wrapped with %w), which reads so — a retry would start a fresh
//     readiness.timeout, forever under a long outage (with keepCordoned it
//     would instead fail with "decided before the agent restarted",
//     dropping what was missing);
//   - each poll is bounded by the wait's deadline, so an API server that
//     accepts connections and never answers cannot stretch the wait by the
//     client's request timeout;
//   - the timeout's message names what was missing as last read and, only
//     when the last poll failed, that poll's error: an outage that healed
//     minutes before is not why the node is not ready. No successful read
//     at all says "could not be checked", with the error.
//
// The status written during an outage is queued in the journal's outbox
// and delivered when the API server answers again, so a user mostly sees
// it in the agent's log ("progress" lines) and in the final message.
package readiness
