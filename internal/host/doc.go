// Package host is the agent's only door to the operating system's service
// manager: systemd-logind and the systemd manager over D-Bus, sd_notify, the
// boot ID, os-release and the kernel release, and command execution. It is
// the only package that imports godbus and go-systemd (STYLE rule 2); the
// test fake in logindtest lives beneath it for the same reason.
//
// # Seams
//
// Two layers (STYLE rule 3). Inside, an unexported transport interface is
// one bus connection: call a method, read a property, add a match rule,
// subscribe to signals. Outside, Logind offers verbs: Inhibit, Release (on
// the lock), WatchPrepareForShutdown, Reboot, PowerOff, InhibitDelayMax,
// ListInhibitors, EnsureInhibitDelay. Callers (drivers, the engine) declare
// the small interfaces they need over these verbs and test against
// recording fakes; the verbs themselves are tested against a real private
// dbus-daemon (logindtest). Everything is configured through Config,
// RunnerConfig, Paths and constructor arguments, never package variables.
//
// go-systemd's login1 is not used: it only dials the system bus and its
// Reboot drops the D-Bus error. Every method call here checks the reply
// and returns D-Bus errors as *BusError.
//
// # The logind lock discipline (STYLE rule 10)
//
// Logind holds an inhibitor lock for exactly as long as the file
// descriptor Inhibit returned is open, in any process. So:
//
//  1. At start, read InhibitDelayMax and warn when it is below the
//     configured shutdown budget (EnsureInhibitDelay can raise it), then
//     take a "delay" lock on "shutdown" and keep it for the life of the
//     process.
//  2. On PrepareForShutdown(true), do the shutdown bookkeeping, and
//     release the delay lock only after the journal step is committed.
//     The caller does the committing; this package never releases a lock
//     on its own.
//  3. On PrepareForShutdown(false) (shutdown cancelled), take the delay
//     lock again.
//  4. During critical steps (OS upgrade, GPU reset), also hold a "block"
//     lock on "shutdown:sleep", released once the step is journalled done.
//  5. Keep a live reference to every *InhibitLock until Release: the
//     descriptor belongs to an *os.File, and a collected *os.File closes
//     it, which silently releases the lock. A lock collected while held is
//     logged as an error.
//  6. Before asking logind to reboot or power off for our own step, and
//     after the journal records the intent, release our own delay and
//     block locks: logind would otherwise wait InhibitDelayMaxSec for our
//     delay lock. Root's Reboot(false) ignores block inhibitors (seen on a
//     real VM); nothing here relies on logind refusing a reboot because of
//     inhibitors (--check-inhibitors semantics).
//
// Locks do not depend on the bus connection: they survive a dbus-daemon
// restart and Logind.Close. Descriptors are close-on-exec, so a command we
// run never inherits (and keeps) a lock.
//
// # Signals and reconnects
//
// WatchPrepareForShutdown owns a bus connection. When it drops, the
// subscription reconnects with exponential backoff (Config.ReconnectMin to
// ReconnectMax) timed by the injected clock (k8s.io/utils/clock; nothing
// here calls time.Sleep), re-adds its match rule and re-reads logind's
// PreparingForShutdown property, so a shutdown that began while
// disconnected is still delivered. Only changes are delivered.
//
// # Files
//
// EnsureInhibitDelay writes /etc/systemd/logind.conf.d/99-lifecycle-agent.conf
// ([Login] InhibitDelayMaxSec=N, N = max(budget, the kubelet's
// 99-kubelet.conf) seconds) with WriteFileAtomic: temp file, fsync, rename,
// fsync of the directory (STYLE rule 8), and reloads logind through
// systemd1 Manager.KillUnit("systemd-logind.service", "all", SIGHUP). An
// unchanged file is neither rewritten nor reloaded.
//
// Paths reads the boot ID (/proc/sys/kernel/random/boot_id, a UUID new
// every boot: a reboot step is done when it differs from the one in the
// step's journal intent), os-release(5) and the kernel release.
//
// # Commands
//
// Runner.Run runs a command with a timeout (always: a default applies),
// in its own process group that is signalled as a whole, with
// exec.Cmd.WaitDelay so that a descendant holding stdout cannot hang it,
// and with bounded capture of stdout and stderr; failures are *ExitError
// carrying the exit code and the output (STYLE rule 15).
// Runner.RunTransient runs a long command as a transient systemd service
// (systemd-run --unit --wait --collect) so that it survives an agent
// restart; see TransientUnit.
//
// # sd_notify
//
// Notifier wraps go-systemd's daemon package: Ready, Status, Stopping,
// ExtendTimeout, Watchdog, WatchdogInterval and RunWatchdog. Without
// NOTIFY_SOCKET every call is a no-op.
//
// # Errors and logs
//
// Errors name the operation and wrap their cause with %w; sentinels carry
// the "host: " prefix. Logs go to the *slog.Logger passed in, with stable
// keys (what, mode, who, path, cmd, attempt, err).
package host
