package host

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// notifySocket listens on a unixgram socket and points NOTIFY_SOCKET at it.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	dir := t.TempDir()
	if len(dir) > 90 {
		var err error
		if dir, err = os.MkdirTemp("", "sdn"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", path, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

// recv returns the next datagram, or "" after wait.
func recv(t *testing.T, conn *net.UnixConn, wait time.Duration) string {
	t.Helper()
	if err := conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, _, err := conn.ReadFromUnix(buf)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ""
	}
	if err != nil {
		t.Fatalf("read notify socket: %v", err)
	}
	return string(buf[:n])
}

func TestNotifierMessages(t *testing.T) {
	conn := notifySocket(t)
	n := NewNotifier(testLogger(t), nil)
	if !n.Enabled() {
		t.Fatal("Enabled() = false with NOTIFY_SOCKET set")
	}
	for _, tc := range []struct {
		name string
		send func() error
		want string
	}{
		{name: "ready", send: func() error { return n.Ready("journal replayed") }, want: "READY=1\nSTATUS=journal replayed"},
		{name: "status", send: func() error { return n.Status("event abc: step drain") }, want: "STATUS=event abc: step drain"},
		{name: "status newline flattened", send: func() error { return n.Status("two\nlines") }, want: "STATUS=two lines"},
		{name: "stopping", send: func() error { return n.Stopping("shutting down") }, want: "STOPPING=1\nSTATUS=shutting down"},
		{name: "extend timeout", send: func() error { return n.ExtendTimeout(90 * time.Second) }, want: "EXTEND_TIMEOUT_USEC=90000000"},
		{name: "watchdog", send: n.Watchdog, want: "WATCHDOG=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.send(); err != nil {
				t.Fatalf("send: %v", err)
			}
			if got := recv(t, conn, testTimeout); got != tc.want {
				t.Fatalf("received %q, want %q", got, tc.want)
			}
		})
	}
	if err := n.ExtendTimeout(0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("ExtendTimeout(0) = %v, want ErrInvalidArgument", err)
	}
}

func TestNotifierWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := NewNotifier(nil, nil)
	if n.Enabled() {
		t.Fatal("Enabled() = true without NOTIFY_SOCKET")
	}
	if err := n.Ready("x"); err != nil {
		t.Fatalf("Ready without NOTIFY_SOCKET: %v", err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent"))
	if err := n.Status("x"); err == nil {
		t.Fatal("Status to a missing socket succeeded")
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name    string
		usec    string
		pid     string
		want    time.Duration
		wantErr bool
	}{
		{name: "off"},
		{name: "on for us", usec: "30000000", pid: self, want: 30 * time.Second},
		{name: "on without pid", usec: "2000000", want: 2 * time.Second},
		{name: "meant for another process", usec: "30000000", pid: "1"},
		{name: "garbage", usec: "soon", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", tc.pid)
			got, err := NewNotifier(nil, nil).WatchdogInterval()
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("WatchdogInterval = %s, %v; want %s (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestRunWatchdog(t *testing.T) {
	conn := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "10000000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	ctx, cancel := context.WithCancel(testCtx(t))
	fc := clocktesting.NewFakeClock(time.Now())
	n := NewNotifier(testLogger(t), fc)
	health := make(chan error, 1)
	health <- nil
	current := error(nil)
	healthy := func() error {
		select {
		case current = <-health:
		default:
		}
		return current
	}
	done := make(chan error, 1)
	go func() { done <- n.RunWatchdog(ctx, healthy) }()

	if got := recv(t, conn, testTimeout); got != "WATCHDOG=1" {
		t.Fatalf("first ping %q", got)
	}
	// Every WatchdogSec/2 = 5s of the injected clock.
	waitForWaiter(t, ctx, fc)
	fc.Step(5 * time.Second)
	if got := recv(t, conn, testTimeout); got != "WATCHDOG=1" {
		t.Fatalf("second ping %q", got)
	}
	// Unhealthy: no ping.
	waitForWaiter(t, ctx, fc)
	health <- errors.New("engine stuck")
	fc.Step(5 * time.Second)
	if got := recv(t, conn, 200*time.Millisecond); got != "" {
		t.Fatalf("ping %q while unhealthy", got)
	}
	// Healthy again: pings resume.
	waitForWaiter(t, ctx, fc)
	health <- nil
	fc.Step(5 * time.Second)
	if got := recv(t, conn, testTimeout); got != "WATCHDOG=1" {
		t.Fatalf("ping after recovery %q", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunWatchdog = %v", err)
		}
	case <-testCtx(t).Done():
		t.Fatal("RunWatchdog did not return after cancel")
	}
}

func TestRunWatchdogOff(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "")
	if err := NewNotifier(nil, clocktesting.NewFakeClock(time.Now())).RunWatchdog(testCtx(t), nil); err != nil {
		t.Fatalf("RunWatchdog with the watchdog off = %v", err)
	}
}
