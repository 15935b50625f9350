package logindtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
)

const testTimeout = 10 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, s *Server) *dbus.Conn {
	t.Helper()
	c, err := dbus.Connect(s.Address())
	if err != nil {
		t.Fatalf("connect to fake bus: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pipeRefs counts the descriptors of this process that refer to the pipe
// with the given inode.
func pipeRefs(t *testing.T, ino uint64) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	want := fmt.Sprintf("pipe:[%d]", ino)
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && l == want {
			n++
		}
	}
	return n
}

func TestInhibitHandsOutPipeAndSeesRelease(t *testing.T) {
	ctx := testCtx(t)
	s := Start(t, Options{})
	c := connect(t, s)

	var fd dbus.UnixFD
	err := c.Object(Login1Name, Login1Path).CallWithContext(ctx, Login1Manager+".Inhibit", 0,
		"shutdown", "test", "because", "delay").Store(&fd)
	if err != nil {
		t.Fatalf("Inhibit: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(fd), &st); err != nil {
		t.Fatalf("fstat inhibit fd: %v", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Fatalf("inhibit fd mode %o, want a FIFO", st.Mode)
	}
	// Our write end and the fake's read end; the fake's copy of the write
	// end is closed right after the reply was written.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for pipeRefs(t, st.Ino) != 2 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("pipe has %d descriptors in this process, want 2 (fake kept its copy of the write end)", pipeRefs(t, st.Ino))
		}
	}
	got := s.Inhibitors()
	want := Inhibitor{ID: 0, What: "shutdown", Who: "test", Why: "because", Mode: "delay", Sender: c.Names()[0]}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("Inhibitors() = %+v, want [%+v]", got, want)
	}
	if err := syscall.Close(int(fd)); err != nil {
		t.Fatalf("close inhibit fd: %v", err)
	}
	if err := s.WaitReleased(ctx, 0); err != nil {
		t.Fatal(err)
	}
}

func TestInhibitRejectsBadArguments(t *testing.T) {
	ctx := testCtx(t)
	s := Start(t, Options{})
	c := connect(t, s)
	for _, tc := range []struct{ name, what, mode string }{
		{name: "bad mode", what: "shutdown", mode: "maybe"},
		{name: "bad what", what: "shutdown:lunch", mode: "block"},
		{name: "delay on key", what: "handle-power-key", mode: "delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fd dbus.UnixFD
			err := c.Object(Login1Name, Login1Path).CallWithContext(ctx, Login1Manager+".Inhibit", 0,
				tc.what, "test", "why", tc.mode).Store(&fd)
			var de dbus.Error
			if !errors.As(err, &de) || de.Name != "org.freedesktop.DBus.Error.InvalidArgs" {
				t.Fatalf("Inhibit(%q, %q) error = %v, want InvalidArgs", tc.what, tc.mode, err)
			}
		})
	}
	if n := len(s.Inhibitors()); n != 0 {
		t.Fatalf("%d inhibitors recorded for rejected calls", n)
	}
}

func TestIntrospectionAndProperties(t *testing.T) {
	ctx := testCtx(t)
	s := Start(t, Options{InhibitDelayMax: 30 * time.Second})
	c := connect(t, s)
	obj := c.Object(Login1Name, Login1Path)

	var xml string
	if err := obj.CallWithContext(ctx, "org.freedesktop.DBus.Introspectable.Introspect", 0).Store(&xml); err != nil {
		t.Fatalf("Introspect: %v", err)
	}
	for _, w := range []string{"Inhibit", "PrepareForShutdown", "InhibitDelayMaxUSec", "Reboot", "PowerOff", "ListInhibitors"} {
		if !strings.Contains(xml, `"`+w+`"`) {
			t.Errorf("introspection lacks %q:\n%s", w, xml)
		}
	}
	v, err := obj.GetProperty(Login1Manager + ".InhibitDelayMaxUSec")
	if err != nil {
		t.Fatalf("get InhibitDelayMaxUSec: %v", err)
	}
	if got, ok := v.Value().(uint64); !ok || got != 30_000_000 {
		t.Fatalf("InhibitDelayMaxUSec = %v, want uint64 30000000", v)
	}
	s.SetInhibitDelayMax(90 * time.Second)
	if v, err = obj.GetProperty(Login1Manager + ".InhibitDelayMaxUSec"); err != nil || v.Value() != uint64(90_000_000) {
		t.Fatalf("InhibitDelayMaxUSec after set = %v, %v; want 90000000", v, err)
	}
}

func TestRebootErrorAndRecording(t *testing.T) {
	ctx := testCtx(t)
	s := Start(t, Options{})
	c := connect(t, s)
	obj := c.Object(Login1Name, Login1Path)

	s.SetError("Reboot", "org.freedesktop.login1.OperationInProgress", "busy")
	err := obj.CallWithContext(ctx, Login1Manager+".Reboot", 0, false).Err
	var de dbus.Error
	if !errors.As(err, &de) || de.Name != "org.freedesktop.login1.OperationInProgress" {
		t.Fatalf("Reboot error = %v, want OperationInProgress", err)
	}
	if n := len(s.Reboots()); n != 0 {
		t.Fatalf("failed Reboot recorded %d times", n)
	}
	s.SetError("Reboot", "", "")
	if err := obj.CallWithContext(ctx, Login1Manager+".Reboot", 0, true).Err; err != nil {
		t.Fatalf("Reboot: %v", err)
	}
	if got := s.Reboots(); len(got) != 1 || !got[0] {
		t.Fatalf("Reboots() = %v, want [true]", got)
	}
}

func TestKillUnitRereadsConfDir(t *testing.T) {
	ctx := testCtx(t)
	conf := t.TempDir()
	s := Start(t, Options{ConfDir: conf})
	c := connect(t, s)
	for name, body := range map[string]string{
		"10-a.conf":  "[Login]\nInhibitDelayMaxSec=10\n",
		"99-zz.conf": "[Login]\nInhibitDelayMaxSec=45s\n",
	} {
		if err := os.WriteFile(filepath.Join(conf, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := c.Object(Systemd1Name, Systemd1Path).CallWithContext(ctx, Systemd1Manager+".KillUnit", 0,
		"systemd-logind.service", "all", int32(syscall.SIGHUP)).Err
	if err != nil {
		t.Fatalf("KillUnit: %v", err)
	}
	if got := s.InhibitDelayMax(); got != 45*time.Second {
		t.Fatalf("InhibitDelayMax after reload = %s, want 45s", got)
	}
	want := KillUnitCall{Unit: "systemd-logind.service", Mode: "all", Signal: int32(syscall.SIGHUP)}
	if got := s.KillUnits(); len(got) != 1 || got[0] != want {
		t.Fatalf("KillUnits() = %+v, want [%+v]", got, want)
	}
}

func TestRestartBusKeepsLocksAndServesAgain(t *testing.T) {
	ctx := testCtx(t)
	s := Start(t, Options{})
	c := connect(t, s)
	var fd dbus.UnixFD
	if err := c.Object(Login1Name, Login1Path).CallWithContext(ctx, Login1Manager+".Inhibit", 0,
		"shutdown", "test", "why", "block").Store(&fd); err != nil {
		t.Fatalf("Inhibit: %v", err)
	}
	if err := s.RestartBus(); err != nil {
		t.Fatalf("RestartBus: %v", err)
	}
	select {
	case <-c.Context().Done():
	case <-ctx.Done():
		t.Fatal("client connection survived the bus restart")
	}
	if s.Inhibitors()[0].Released {
		t.Fatal("lock released by a bus restart")
	}
	c2 := connect(t, s)
	if err := c2.Object(Login1Name, Login1Path).CallWithContext(ctx, Login1Manager+".PowerOff", 0, false).Err; err != nil {
		t.Fatalf("PowerOff after restart: %v", err)
	}
	if got := s.PowerOffs(); len(got) != 1 {
		t.Fatalf("PowerOffs() = %v, want one call", got)
	}
	_ = syscall.Close(int(fd))
	if err := s.WaitReleased(ctx, 0); err != nil {
		t.Fatal(err)
	}
}

func TestNewWithoutDBusDaemonFailsLoudly(t *testing.T) {
	_, err := New("", Options{DBusDaemon: "/nonexistent/dbus-daemon"})
	if !errors.Is(err, ErrNoDBusDaemon) {
		t.Fatalf("New error = %v, want ErrNoDBusDaemon", err)
	}
	if !strings.Contains(err.Error(), "install the Debian package dbus") {
		t.Fatalf("error %q does not say how to install dbus-daemon", err)
	}
}

// A test whose name holds characters a D-Bus address must escape (the
// chaos schedules' "kill@947ms") still gets a bus.
func TestStartUnderAnOddTestName(t *testing.T) {
	t.Run("kill@947ms+cancel", func(t *testing.T) {
		s := Start(t, Options{})
		if strings.ContainsAny(s.Address(), "@+") {
			t.Fatalf("address %q holds characters D-Bus wants escaped", s.Address())
		}
		conn := connect(t, s)
		if err := conn.Object("org.freedesktop.login1", "/org/freedesktop/login1").Call("org.freedesktop.DBus.Peer.Ping", 0).Err; err != nil {
			t.Fatal(err)
		}
	})
}
