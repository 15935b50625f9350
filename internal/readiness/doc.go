// Package readiness decides whether a node given back after a disruptive
// event (a reboot, an OS upgrade, a GPU reset with a drain) or after a
// shutdown (its next boot, internal/engine shutdown_return.go: the
// snapshot is taken when logind announces the shutdown) can take its work
// back: the checks that run before the uncordon ("Ready means ready",
// DESIGN.md).
//
// At claim the agent takes a Snapshot of what the node had: the count of
// every extended resource in status.allocatable (nvidia.com/gpu, …) and
// the DaemonSets with a Ready pod bound to the node. The snapshot is part
// of the plan the engine journals at claim (drivers.Resolver), so a crash
// or a reboot during the wait resumes it against the same baseline.
//
// Taken once: why a retried claim cannot snapshot a degraded node. The
// engine resolves the plan in claim, before the claim's status write, and
// journals it (attrs "params") in the snapshot commit that follows the
// finalizer; no step runs before that commit, and every replay after it
// plans from the journaled map, never resolving again (engine.resume). A
// claim whose write failed (a 409, an outage) is tried again from the
// start, resolving again; so is an event adopted after a crash between the
// accepted claim and the journal commit. Both are safe: nothing of the
// event has run, so the node has not lost what the event would take away
// (the drain, the reboot or the reset come later). Tests: test/crash
// TestReadinessSnapshotAfterClaimCrash (killed at engineAfterClaim,
// adopted: the wait still requires the 8 GPUs) and
// TestReadinessWaitAcrossCrash (killed during the wait: a re-read snapshot
// would see 0 GPUs and pass).
//
// A second copy on the event, for a lost journal. The claim writes the
// plan's resolved keys (this snapshot, gpu-reset's GPUs) as the event's
// lifecycle.x-k8s.io/resolved-plan annotation, in the update that adds the
// finalizer (no extra write). An agent that adopts an event it claimed
// and finds no journal record of it (the journal moved aside as corrupt,
// a re-imaged disk) reads the plan back from there instead of resolving it
// again from a node the event already disrupted, where the DaemonSets and
// the GPUs it waits for are gone and would not be required back. The
// steps rebuilt from the event's status keep their status startTime as
// the journaled start, so the wait's readiness.timeout goes on counting
// from the step's start (of its latest attempt, as the status has it)
// rather than from the adoption. An event claimed by an agent without
// this (no annotation) is resolved again, as before. Test: test/crash
// TestReadinessWaitJournalLost (killed in the wait, journal removed: the
// adopted wait still requires the 8 GPUs and says it was resumed).
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
// config keys that feed it are readiness.daemonSets.namespaces and
// .selector (checked at load with file:line, internal/config; passed on by
// internal/agent; test/e2e TestReadinessDaemonSetNamespaces).
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
// When it looks. The agent's API client watches the Node and the pods
// bound to it while the wait runs (apiclient.Client.NodeChanges: two
// informers over this node's objects only) and the wait looks again when
// one of them changes — the device plugin's registration changes the
// Node's allocatable, a DaemonSet pod's readiness changes the pod — at
// most once per 2 s, and otherwise once every 30 s
// (drivers.ReadinessRecheck) for a change the watch missed while it was
// down, with a last look an interval before the deadline. Each look is a
// GET of the Node and a list of its pods, as before: the watch only says
// when, so the verdict and the outage handling below read the server, not
// a cache that may be stale. A 10-minute wait of a node whose objects do
// not change costs about 40 requests instead of 600. The command check
// has nothing to watch: with it the wait looks every 2 s. Tests:
// internal/drivers TestReadinessWatchRechecks and TestReadinessWatchWakes,
// test/e2e TestReadinessWaitWatches (the agent's Node GETs counted while
// nothing changes).
//
// The deadline is readiness.timeout from the wait's first start, which
// the engine journals (the step's first intent; drivers.Runtime
// StepStarted), not from the agent's latest start: a kill or a reboot
// during the wait resumes it with what is left, and the progress says so
// ("resumed after a restart: 8s left, the wait began 12s ago"), so
// repeated crashes cannot stretch it. A wait resumed past its deadline
// looks once more, bounded by 10 s: a node ready by then is given back,
// otherwise it fails at once. The deadline is a wall-clock time reckoned
// again at each start: a clock stepped forward between the start and a
// restart shortens what is left, one stepped back lengthens it, never past
// a full timeout from the restart; within one run the wait is timed on the
// monotonic clock.
//
// The status written during an outage is queued in the journal's outbox
// and delivered when the API server answers again, so a user mostly sees
// it in the agent's log ("progress" lines) and in the final message.
//
// # A DaemonSet pod's Ready left from the previous boot
//
// After a reboot the API still shows each DaemonSet pod as the old boot
// left it (Ready, the old container) until the new boot's kubelet posts
// its status, a second or two after it reports the Node Ready. A look in
// that window once counted the pod as Ready and the node was uncordoned
// before the DaemonSet was back (the VM scenario TestRealNode/RebootWithPods
// on 2026-12-06: the agent uncordoned 1.1 s after the new boot's Node
// Ready; the kubelet posted the pod not Ready 0.3 s later).
//
// So NotReady counts a DaemonSet pod as Ready only when its Ready
// condition's lastTransitionTime is at or after the current boot's start
// (drivers.HostOps.BootTime: /proc/stat btime, read again at each look),
// and says why it waits: "DaemonSet ns/name has no Ready pod on the node
// (its pod's Ready is from before this boot: since …, the boot began …)".
// The wait (drivers.Readiness) applies this for drivers.StaleReadyGrace
// (30 s) from its start and then takes the pod's status as it reads: the
// new kubelet posts every pod within seconds of the Node's Ready, which the
// wait follows, and a clock stepped forward after the kubelet wrote the
// condition (an RTC that lagged, set right by NTP later) moves btime but
// not the condition's time, so without the bound such a node would wait
// out readiness.timeout and stay cordoned. Decisions:
//
//   - both times are this host's clock: the kubelet that writes the
//     condition runs here. The API keeps whole seconds, so the boot time is
//     compared truncated to the second: a pod the new kubelet makes Ready
//     in the boot's first second still counts;
//   - a new boot's kubelet always moves the condition: the old containers
//     are gone, so it posts the pod not Ready before Ready again, each with
//     its time; a Ready the status manager kept unchanged across the boot
//     (same status, old time) does not happen after a reboot;
//   - a Ready condition with no time (a status a kubelet did not write)
//     counts as it reads: nothing to judge it by;
//   - events without a reboot (a gpu-reset, a drain) are unaffected: their
//     pods became Ready in this boot;
//   - the snapshot at claim (Take) is not judged against the boot: a pod
//     Ready then is what the node has, whatever boot its status is from;
//   - simulate mode: BootTime is the real host's, since a simulated reboot
//     restarts nothing and every pod status is this real boot's.
//
// Known gap: `systemctl soft-reboot` (systemd 254 and later) restarts
// userspace on the same kernel, so btime and the boot ID stay: the rule
// cannot tell that boot's pod statuses from the old ones, and the window
// above is open again. The agent's own reboots are full reboots (logind's
// Reboot); a soft-reboot made by someone else (an external OS upgrade's
// pipeline, say) is not seen as a reboot at all, by this rule or by the
// drivers' boot-ID checks (reboot, os-upgrade). Not handled: systemd's
// SoftRebootsCount would tell one apart, and nothing here reads it yet.
//
// Tests: TestDaemonSetReadyFromAnEarlierBoot here; internal/drivers
// TestReadinessStaleReadyGrace (the grace, then the status as it reads);
// test/e2e
// TestReadinessReadyFromAnEarlierBoot through the agent as wired (the pod's
// Ready dated before the machine's boot holds the node cordoned, its
// status saying so, until the pod is Ready again); the VM scenario
// TestRealNode/RebootWithPods with a real kubelet, where the window is a
// race, so it proves the wiring rather than failing every time without it.
package readiness
