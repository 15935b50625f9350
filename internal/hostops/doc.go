// Package hostops implements drivers.HostOps, the host verbs the drivers
// use, twice: Real performs them through internal/host, Simulated
// (host.mode=simulate) logs and records them and performs none. The agent
// builds one of the two from host.mode and hands it to the engine; the
// engine stamps every step intent with its BootID. This package imports no
// D-Bus or systemd library itself: internal/host remains their only
// importer (STYLE rule 2). Both are configured through a Config struct
// with an injected *slog.Logger and clock (STYLE rules 3, 13, 14).
//
// # Real
//
//   - BootID: /proc/sys/kernel/random/boot_id, read once by NewReal (it
//     cannot change while the process lives; NewReal fails when it cannot
//     be read, since every reboot decision rests on it).
//   - BootTime: /proc/stat btime, read again at each call (a clock stepped
//     after the boot moves it; a failed read answers the last one and logs
//     once; none read: the zero time). The readiness check compares the
//     kubelet's pod condition times with it.
//   - Reboot: the logind lock discipline of internal/host (its rule 6).
//     The agent holds a delay lock on "shutdown" for its whole life, and
//     logind waits up to InhibitDelayMaxSec (5 s by default) for every
//     delay lock, ours included, before it shuts down. So Reboot first
//     calls RealConfig.ReleaseLocks (the agent's hook that releases that
//     lock), then releases every block lock Inhibit handed out and not yet
//     released, then calls logind's Manager.Reboot(interactive=false) and
//     returns its D-Bus error, if any, as a *host.BusError (match with
//     errors.As). On a refusal RealConfig.RetakeLocks takes the delay lock
//     again. Root's Reboot(false) ignores block inhibitors (seen on a real
//     VM), so nothing relies on logind refusing a reboot because of them.
//     The caller calls Reboot only after the journal holds the step's
//     intent: the engine commits it before the step runs.
//   - Inhibit: a logind "block" lock (what "shutdown:sleep" for critical
//     steps), held until the returned release (idempotent) or Reboot. The
//     *host.InhibitLock stays referenced until then: a collected *os.File
//     closes its descriptor, which silently releases the lock.
//   - Run: the agent's child through host.Runner: its own process group,
//     a timeout, exec.Cmd.WaitDelay, bounded output. The environment is
//     RealConfig.BaseEnv (default: PATH only) followed by the caller's
//     entries; the agent's own environment (NOTIFY_SOCKET, LIFECYCLE_AGENT_*)
//     is never passed on. A command that ran and failed returns a
//     *CommandError: the runner's message with the output, and ExitStatus
//     (-1 when killed or timed out) for drivers.ExitStatusError.
//   - RunTransient: systemd-run --unit=<unit> --wait --collect, bounded by
//     the timeout in the wait and in the unit (RuntimeMaxSec), so that a
//     package upgrade that restarts lifecycle-agent.service cannot kill
//     the command. When a unit of that name is still active (the agent
//     restarted while it ran), RunTransient first waits for it to end,
//     polling systemctl is-active every UnitPollInterval, then runs the
//     command again: profile commands are idempotent. The unit's output is
//     in journalctl -u <unit>.
//   - StopUnits, StartUnits: systemctl stop|start -- <units>, bounded by
//     UnitTimeout.
//   - OSRelease: VERSION_ID of /etc/os-release (else /usr/lib/os-release)
//     and the kernel release (/proc/sys/kernel/osrelease).
//   - RebootRequired: RealConfig.RebootRequiredFile (/run/reboot-required,
//     left by Debian and Ubuntu packages) exists; a file that cannot be
//     examined counts as present.
//
// # Simulated
//
// Every action is logged at Info with mode=simulate and recorded
// (Actions, the last MaxActions); nothing is performed. Its state lives in
// SimulatedConfig.StateDir, so that the demo and the tests can drive it
// and it survives an agent restart:
//
//   - simulated-boot-id: the boot ID, a UUID, created by NewSimulated on
//     first use. Reboot writes a new one (temp file, fsync, rename, fsync
//     of the directory), so the reboot step sees a new boot ID at once and
//     a restarted agent's replay sees it too. BootID re-reads the file, so
//     writing a new UUID into it from outside simulates a reboot by someone
//     else (os-upgrade's external mode).
//   - simulated-host-boot-id: the real machine's boot ID when the
//     simulated boot began. A real reboot (an admin's, a power cut) is a
//     new simulated boot too: NewSimulated finds another real boot ID and
//     writes a new simulated one, so a shutdown journaled before it is
//     closed out. Absent (a state directory from before it was kept), a
//     simulated-boot-id file older than the machine's boot time means the
//     same; unreadable, it is written anew (a hint, not a refusal).
//   - BootTime is the real host's: a simulated reboot restarts no pod, so
//     no pod status is left from an earlier boot.
//   - simulated-os-release (optional): os-release(5) syntax; VERSION_ID is
//     the version and the non-standard KERNEL_RELEASE the kernel release
//     OSRelease reports. Without it, or without that key, the real host's
//     facts are read (read-only). A test or demo writes the "upgraded"
//     values here.
//   - simulated-reboot-required (optional): RebootRequired is true while
//     it exists; Reboot removes it, as a real reboot clears /run.
//
// Run and RunTransient record the command and succeed with no output;
// Inhibit returns a release that only records; StopUnits and StartUnits
// record. Drivers may consult Simulated() (the exec driver does not run
// its check commands, which the simulation would always answer "done").
package hostops
