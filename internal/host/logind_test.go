package host

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

const testTimeout = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTestLogind returns a Logind on the fake's bus; edit may change the
// config first.
func newTestLogind(t *testing.T, srv *logindtest.Server, edit func(*Config)) *Logind {
	t.Helper()
	cfg := Config{Address: srv.Address(), Logger: testLogger(t), LogindConfDir: t.TempDir()}
	if edit != nil {
		edit(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func TestInhibit(t *testing.T) {
	for _, tc := range []struct {
		name string
		what string
		mode string
	}{
		{name: "delay shutdown", what: "shutdown", mode: ModeDelay},
		{name: "block shutdown and sleep", what: "shutdown:sleep", mode: ModeBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := logindtest.Start(t, logindtest.Options{})
			l := newTestLogind(t, srv, nil)

			lock, err := l.Inhibit(ctx, tc.what, "lifecycle-agent", "test", tc.mode)
			if err != nil {
				t.Fatalf("Inhibit: %v", err)
			}
			if !lock.Held() || lock.What != tc.what || lock.Mode != tc.mode {
				t.Fatalf("lock = %+v, held %v", lock, lock.Held())
			}
			// The lock is a real descriptor the fake watches.
			got := srv.Inhibitors()
			if len(got) != 1 || got[0].Mode != tc.mode || got[0].What != tc.what || got[0].Released {
				t.Fatalf("fake inhibitors = %+v", got)
			}
			listed, err := l.ListInhibitors(ctx)
			if err != nil {
				t.Fatalf("ListInhibitors: %v", err)
			}
			if len(listed) != 1 || listed[0].Who != "lifecycle-agent" || listed[0].Mode != tc.mode {
				t.Fatalf("ListInhibitors = %+v", listed)
			}

			if err := lock.Release(); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if err := srv.WaitReleased(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if lock.Held() {
				t.Fatal("lock still held after Release")
			}
			// Safe to call twice, and on nil.
			if err := lock.Release(); err != nil {
				t.Fatalf("second Release: %v", err)
			}
			if err := (*InhibitLock)(nil).Release(); err != nil {
				t.Fatalf("nil Release: %v", err)
			}
			if listed, err = l.ListInhibitors(ctx); err != nil || len(listed) != 0 {
				t.Fatalf("ListInhibitors after release = %+v, %v", listed, err)
			}
		})
	}
}

func TestInhibitErrors(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{})
	l := newTestLogind(t, srv, nil)
	srv.SetError("Inhibit", "org.freedesktop.DBus.Error.AccessDenied", "Permission denied")

	for _, tc := range []struct {
		name     string
		what     string
		mode     string
		wantIs   error
		wantName string
	}{
		{name: "bad mode", what: "shutdown", mode: "sometimes", wantIs: ErrInvalidInhibitMode},
		{name: "empty what", what: "", mode: ModeDelay, wantIs: ErrInvalidArgument},
		{name: "logind refuses", what: "shutdown", mode: ModeDelay, wantName: "org.freedesktop.DBus.Error.AccessDenied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lock, err := l.Inhibit(ctx, tc.what, "lifecycle-agent", "test", tc.mode)
			if err == nil {
				_ = lock.Release()
				t.Fatal("Inhibit succeeded")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Fatalf("error %v, want %v", err, tc.wantIs)
			}
			var be *BusError
			if tc.wantName != "" && (!errors.As(err, &be) || be.Name != tc.wantName || be.Message != "Permission denied") {
				t.Fatalf("error %v, want BusError %s", err, tc.wantName)
			}
		})
	}
}

func TestRebootAndPowerOff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		method  string
		call    func(*Logind, context.Context) error
		calls   func(*logindtest.Server) []bool
		failErr string
	}{
		{name: "reboot", method: "Reboot", call: (*Logind).Reboot, calls: (*logindtest.Server).Reboots},
		{name: "reboot refused", method: "Reboot", call: (*Logind).Reboot, calls: (*logindtest.Server).Reboots,
			failErr: "org.freedesktop.login1.OperationInProgress"},
		{name: "power off", method: "PowerOff", call: (*Logind).PowerOff, calls: (*logindtest.Server).PowerOffs},
		{name: "power off refused", method: "PowerOff", call: (*Logind).PowerOff, calls: (*logindtest.Server).PowerOffs,
			failErr: "org.freedesktop.DBus.Error.AccessDenied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv := logindtest.Start(t, logindtest.Options{})
			l := newTestLogind(t, srv, nil)
			if tc.failErr != "" {
				srv.SetError(tc.method, tc.failErr, "nope")
			}
			err := tc.call(l, ctx)
			if tc.failErr == "" {
				if err != nil {
					t.Fatalf("%s: %v", tc.method, err)
				}
				// Non-interactive, exactly once.
				if got := tc.calls(srv); len(got) != 1 || got[0] {
					t.Fatalf("fake saw %s calls %v, want [false]", tc.method, got)
				}
				return
			}
			var be *BusError
			if !errors.As(err, &be) || be.Name != tc.failErr || be.Message != "nope" {
				t.Fatalf("%s error = %v, want BusError %s", tc.method, err, tc.failErr)
			}
			if got := tc.calls(srv); len(got) != 0 {
				t.Fatalf("refused %s recorded: %v", tc.method, got)
			}
		})
	}
}

func TestInhibitDelayMax(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 90 * time.Second})
	l := newTestLogind(t, srv, nil)
	d, err := l.InhibitDelayMax(ctx)
	if err != nil || d != 90*time.Second {
		t.Fatalf("InhibitDelayMax = %s, %v; want 1m30s", d, err)
	}
	if got := usecToDuration(^uint64(0)); got <= 0 {
		t.Fatalf("infinite usec converted to %s", got)
	}
}

func TestCallsRedialAfterBusRestart(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{})
	l := newTestLogind(t, srv, nil)
	lock, err := l.Inhibit(ctx, "shutdown", "lifecycle-agent", "test", ModeDelay)
	if err != nil {
		t.Fatalf("Inhibit: %v", err)
	}
	defer lock.Release()
	old, err := l.transport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.RestartBus(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.done():
	case <-ctx.Done():
		t.Fatal("old connection not closed by the bus restart")
	}
	if err := l.Reboot(ctx); err != nil {
		t.Fatalf("Reboot after bus restart: %v", err)
	}
	if got := srv.Reboots(); len(got) != 1 {
		t.Fatalf("Reboots = %v", got)
	}
	// The lock does not depend on the bus connection.
	if srv.Inhibitors()[0].Released {
		t.Fatal("lock lost with the bus connection")
	}
}

func TestClosedLogind(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{})
	l := newTestLogind(t, srv, nil)
	if _, err := l.InhibitDelayMax(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Reboot(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reboot on closed client = %v, want ErrClosed", err)
	}
	if _, err := l.WatchPrepareForShutdown(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch on closed client = %v, want ErrClosed", err)
	}
}

func TestNoBusFails(t *testing.T) {
	ctx := testCtx(t)
	l, err := New(Config{Address: "unix:path=" + t.TempDir() + "/nope", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.InhibitDelayMax(ctx); err == nil {
		t.Fatal("InhibitDelayMax without a bus succeeded")
	}
	if _, err := l.WatchPrepareForShutdown(ctx); err == nil {
		t.Fatal("WatchPrepareForShutdown without a bus succeeded")
	}
}

func TestBusAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		cfg  string
		want string
	}{
		{name: "default socket", want: DefaultSystemBusAddress},
		{name: "environment", env: "unix:path=/run/other", want: "unix:path=/run/other"},
		{name: "config wins", env: "unix:path=/run/other", cfg: "unix:path=/run/mine", want: "unix:path=/run/mine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", tc.env)
			l, err := New(Config{Address: tc.cfg})
			if err != nil {
				t.Fatal(err)
			}
			if l.cfg.Address != tc.want {
				t.Fatalf("address = %q, want %q", l.cfg.Address, tc.want)
			}
		})
	}
	t.Run("environment reaches the bus", func(t *testing.T) {
		srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 7 * time.Second})
		t.Setenv("DBUS_SYSTEM_BUS_ADDRESS", srv.Address())
		l, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if d, err := l.InhibitDelayMax(testCtx(t)); err != nil || d != 7*time.Second {
			t.Fatalf("InhibitDelayMax = %s, %v", d, err)
		}
	})
	if _, err := New(Config{Address: "x", ReconnectMin: time.Minute, ReconnectMax: time.Second}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("New with ReconnectMax < ReconnectMin = %v, want ErrInvalidArgument", err)
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

//go:noinline
func inhibitAndDrop(ctx context.Context, l *Logind) error {
	_, err := l.Inhibit(ctx, "shutdown", "lifecycle-agent", "dropped", ModeDelay)
	return err
}

// TestLostLockReference shows why a live reference matters (STYLE rule
// 10): a collected lock is silently released, and we log it as an error.
func TestLostLockReference(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{})
	var logs syncBuffer
	l := newTestLogind(t, srv, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	if err := inhibitAndDrop(ctx, l); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !srv.Inhibitors()[0].Released || !strings.Contains(logs.String(), "garbage-collected without Release") {
		runtime.GC()
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("dropped lock: released %v, logs:\n%s", srv.Inhibitors()[0].Released, logs.String())
		}
	}
}
