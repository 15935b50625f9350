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
// A command, when set, replaces the file. Both empty: the detector is off
// and the agent writes no RebootRequired condition.
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
// Not here yet (issue 15): automatic requests, windows, gates and
// notifications; the GPU health monitor's recovery actions as needs.
package needs
