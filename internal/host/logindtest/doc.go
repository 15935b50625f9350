// Package logindtest runs a fake systemd-logind on a private D-Bus for
// tests, benchmarks and demos.
//
// Start (tests) or New (any program) launches a private dbus-daemon from a
// generated configuration: allow-all policy, EXTERNAL authentication, a
// unix socket in a temporary directory. On that bus the fake owns
// org.freedesktop.login1 and exports /org/freedesktop/login1 with interface
// org.freedesktop.login1.Manager:
//
//   - Inhibit(what, who, why, mode) returns a real pipe write end
//     (dbus.UnixFD). The fake keeps the read end and records the lock as
//     released when it reads EOF, that is when every copy of the write end
//     is closed. Its own copy is closed right after the reply was written
//     (see inhibit).
//   - ListInhibitors, Reboot(interactive), PowerOff(interactive): recorded;
//     Reboot and PowerOff can be made to fail with a D-Bus error.
//   - Properties InhibitDelayMaxUSec and PreparingForShutdown (godbus prop),
//     and introspection.
//   - Signal PrepareForShutdown(b), sent by EmitPrepareForShutdown.
//
// It also owns org.freedesktop.systemd1 and records
// Manager.KillUnit(name, mode, signal); with Options.ConfDir set, a SIGHUP
// to systemd-logind.service re-reads the logind drop-ins there and updates
// InhibitDelayMaxUSec, as logind would.
//
// KillBus, StartBus and RestartBus stop and start the dbus-daemon at the
// same address, to test reconnects. Inhibitor pipes survive a restart, as
// logind's do.
//
// dbus-daemon comes from the Debian package dbus. Without it, Start fails
// the test, and New returns ErrNoDBusDaemon: it never skips.
//
// This package imports godbus and lives under internal/host for that reason
// (STYLE rule 2). It must not import internal/host, whose in-package tests
// import it.
package logindtest
