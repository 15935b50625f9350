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
package readiness
