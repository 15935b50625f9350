// Package needs notices work this node needs before anyone asks for it,
// and says so on the Node: today a reboot, detected as kured detects it.
//
// # Reboot required
//
// Reboot evaluates one sentinel at start and every Config.Interval
// (needs.reboot.interval, default 1m):
//
//   - a file (needs.reboot.sentinelFile, default /var/run/reboot-required,
//     which Debian's and Ubuntu's package scripts create when an upgrade
//     wants a reboot): the need is there while the file exists. The
//     message lists the packages of <file>.pkgs when that file exists, as
//     Debian writes it.
//   - or a command (needs.reboot.sentinelCommand, run by /bin/sh -c as
//     kured's --reboot-sentinel-command is, with needs.reboot.commandTimeout,
//     default 30s): exit status 0 means a reboot is needed, any other means
//     it is not. The command is a read-only probe: it runs in host.mode
//     simulate too (the only host command that does), so it must not change
//     the host. A command that cannot start or outlives its timeout is
//     killed and the need is Unknown.
//
// A command, when set, replaces the file. Both empty: no sentinel; on a
// node without GPUs the detector is then off and the agent writes no
// RebootRequired condition.
//
// # GPUs
//
// The GPU health monitor hands over its reboot cause (a recovery action
// NODE_REBOOT or SYSTEM_REBOOT, a lost GPU, XID 79 or 62: gpuhealth's
// RebootCause) with SetGPUCause. The condition is True while either the
// sentinel or a GPU asks, and its reason names each cause that holds:
//
//	True    SentinelFile,GPUHealth   "/var/run/reboot-required exists; 1 of 8 GPUs needs a reboot: GPU-… (index 6): RecoveryAction_NODE_REBOOT"
//	True    GPUHealth                "1 of 8 GPUs needs a reboot: …; /var/run/reboot-required absent"
//	False   GPUHealth                "no GPU asks for a reboot" (no sentinel configured)
//
// # What the cluster sees
//
// The Node condition RebootRequired (ours, beside KEP-5683's), written with
// the same strategic-merge patch as the other conditions, only when status,
// reason or message change; a failed write is retried at the next
// evaluation. As KEP-5683 asks of its conditions, the type is the state,
// the status says whether it holds and the reason is the cause category:
//
//	True    SentinelFile | SentinelCommand   "/var/run/reboot-required exists; packages: linux-image-6.1.0-28-amd64"
//	False   SentinelFile | SentinelCommand   "/var/run/reboot-required absent"
//	Unknown SentinelFile | SentinelCommand   why it could not be told
//
// A reboot clears it by itself: /var/run is a tmpfs, so the next boot's
// first evaluation finds no file and writes False.
//
// Metrics: lifecycle_agent_reboot_required (1 while the need holds, 0
// otherwise, kured's kured_reboot_required) and
// lifecycle_agent_reboot_required_check_errors_total (evaluations that
// ended Unknown).
//
// `kubectl lifecycle rollout reboot --needs-reboot` selects exactly the
// nodes whose RebootRequired is True.
//
// The GPU reset and replacement needs are internal/gpuhealth's own
// conditions (GPUResetRequired, GPUReplacementRequired).
//
// Windows and gates are internal/maintenance's; notifications are
// internal/notify's.
//
// # Automatic requests (Requester)
//
// A Requester turns a need into a LifecycleEvent of the node's own, bound
// to itself, in a disruption group whose maxConcurrent caps how many nodes
// of the fleet act at once. The request is journaled (journal bucket
// requests) before the event is created, so a crash or an outage between
// the two creates it later and a restart never creates a second one; the
// event is named per node, need and boot (RebootEvent), so a create whose
// answer was lost is found by name. A need is requested once: while the
// journal holds its request nothing new is made, even after the event
// ended with the need still there (a reboot that did not clear the need
// does not loop; it is logged). A need that goes away before its event was
// created is never created; one that goes away while its event runs does
// not cancel it. Each failed or SLA-expired request is recorded once on
// the group's circuit breaker, Lease <group>-breaker in the API (so every
// node of the group sees it; admission keeps it append-only for node
// identities); at breakerFailures entries no node of the group requests
// until an admin deletes the Lease. Reading the breaker fails closed. An
// event found gone has the outcome the journal's history records for it
// (with eventRetention 0 the agent deletes it as soon as it ends), or
// none — deleted before it ended, by an admin — which does not count.
//
// The agent builds one Requester for the reboot need under
// needs.reboot.policy request (group needs.reboot.*; the reboot driver
// must be enabled) and one for GPU resets under gpu.autoRemediate (group
// gpu.remediation.*, keys gpu-reset/<uuid>).
package needs
