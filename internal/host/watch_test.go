package host

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

// expectValue waits for the next value on ch.
func expectValue(t *testing.T, ctx context.Context, ch <-chan bool, want bool) {
	t.Helper()
	select {
	case got, ok := <-ch:
		if !ok {
			t.Fatalf("watch channel closed, want %v", want)
		}
		if got != want {
			t.Fatalf("PrepareForShutdown = %v, want %v", got, want)
		}
	case <-ctx.Done():
		t.Fatalf("no PrepareForShutdown(%v) before the test timeout", want)
	}
}

// expectNothing checks that nothing arrives on ch for a short while.
func expectNothing[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("unexpected %s: %v", what, v)
	case <-time.After(100 * time.Millisecond):
	}
}

// waitForWaiter waits until something waits on the fake clock.
func waitForWaiter(t *testing.T, ctx context.Context, fc *clocktesting.FakeClock) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !fc.HasWaiters() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("nothing waited on the clock before the test timeout")
		}
	}
}

func TestWatchPrepareForShutdown(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{})
	l := newTestLogind(t, srv, nil)
	wctx, cancel := context.WithCancel(ctx)
	ch, err := l.WatchPrepareForShutdown(wctx)
	if err != nil {
		t.Fatalf("WatchPrepareForShutdown: %v", err)
	}
	for _, v := range []bool{true, false, true} {
		if err := srv.EmitPrepareForShutdown(v); err != nil {
			t.Fatal(err)
		}
		expectValue(t, ctx, ch, v)
	}
	// A repeated value is not a change.
	if err := srv.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	expectNothing(t, ch, "repeated PrepareForShutdown")
	cancel()
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("value after cancel")
		}
	case <-ctx.Done():
		t.Fatal("watch channel not closed after cancel")
	}
}

func TestWatchSeesShutdownAlreadyInProgress(t *testing.T) {
	ctx := testCtx(t)
	srv := logindtest.Start(t, logindtest.Options{})
	srv.SetPreparingForShutdown(true)
	l := newTestLogind(t, srv, nil)
	if p, err := l.PreparingForShutdown(ctx); err != nil || !p {
		t.Fatalf("PreparingForShutdown = %v, %v; want true", p, err)
	}
	ch, err := l.WatchPrepareForShutdown(ctx)
	if err != nil {
		t.Fatal(err)
	}
	expectValue(t, ctx, ch, true)
}

func TestWatchReconnectsAfterBusRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		// whileDown runs with the bus down; reconnect must then deliver
		// want from the PreparingForShutdown property.
		whileDown func(*logindtest.Server)
		want      *bool
	}{
		{name: "no change while down"},
		{
			name:      "shutdown began while down",
			whileDown: func(s *logindtest.Server) { s.SetPreparingForShutdown(true) },
			want:      func() *bool { b := true; return &b }(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			fc := clocktesting.NewFakeClock(time.Now())
			srv := logindtest.Start(t, logindtest.Options{})
			l := newTestLogind(t, srv, func(c *Config) {
				c.Clock = fc
				c.ReconnectMin = time.Second
				c.ReconnectMax = 8 * time.Second
			})
			ch, err := l.WatchPrepareForShutdown(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.EmitPrepareForShutdown(true); err != nil {
				t.Fatal(err)
			}
			expectValue(t, ctx, ch, true)
			if err := srv.EmitPrepareForShutdown(false); err != nil {
				t.Fatal(err)
			}
			expectValue(t, ctx, ch, false)

			if err := srv.KillBus(); err != nil {
				t.Fatal(err)
			}
			// The subscription noticed and waits out its backoff on our clock.
			waitForWaiter(t, ctx, fc)
			if tc.whileDown != nil {
				tc.whileDown(srv)
			}
			if err := srv.StartBus(); err != nil {
				t.Fatal(err)
			}
			fc.Step(time.Second)
			if tc.want != nil {
				expectValue(t, ctx, ch, *tc.want)
			}
			// The match rule is back: signals arrive again. Emit until one
			// does, since the resubscribe runs concurrently.
			next := true
			if tc.want != nil {
				next = !*tc.want
			}
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				if err := srv.EmitPrepareForShutdown(next); err != nil {
					t.Fatal(err)
				}
				select {
				case got, ok := <-ch:
					if !ok || got != next {
						t.Fatalf("after reconnect got %v (open %v), want %v", got, ok, next)
					}
					// Resubscribed (the property was read after the match
					// was added): this one can only come as a signal.
					if err := srv.EmitPrepareForShutdown(!next); err != nil {
						t.Fatal(err)
					}
					expectValue(t, ctx, ch, !next)
					return
				case <-tick.C:
				case <-ctx.Done():
					t.Fatal("no signal after the bus restart")
				}
			}
		})
	}
}

// fakeTransport is a hand-written recording transport for the backoff
// test.
type fakeTransport struct {
	mu        sync.Mutex
	subs      []chan<- *dbus.Signal
	matches   int
	closed    chan struct{}
	closeOnce sync.Once
}

func newFakeTransport() *fakeTransport { return &fakeTransport{closed: make(chan struct{})} }

func (f *fakeTransport) call(context.Context, string, dbus.ObjectPath, string, ...any) ([]any, error) {
	return nil, errors.New("fake: no methods")
}

func (f *fakeTransport) getProperty(_ context.Context, _ string, _ dbus.ObjectPath, _, name string) (dbus.Variant, error) {
	if name == "PreparingForShutdown" {
		return dbus.MakeVariant(false), nil
	}
	return dbus.Variant{}, errors.New("fake: no such property")
}

func (f *fakeTransport) addMatch(context.Context, ...dbus.MatchOption) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.matches++
	return nil
}

func (f *fakeTransport) subscribe(ch chan<- *dbus.Signal) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subs = append(f.subs, ch)
}

func (f *fakeTransport) done() <-chan struct{} { return f.closed }

func (f *fakeTransport) close() error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		close(f.closed)
		for _, ch := range f.subs {
			close(ch)
		}
	})
	return nil
}

func (f *fakeTransport) emit(v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.subs {
		ch <- &dbus.Signal{Name: prepareForShutdownSig, Path: login1Path, Body: []any{v}}
	}
}

func TestWatchBackoff(t *testing.T) {
	ctx := testCtx(t)
	fc := clocktesting.NewFakeClock(time.Now())
	first := newFakeTransport()
	last := newFakeTransport()
	dials := make(chan int, 10)
	var (
		mu sync.Mutex
		n  int
	)
	dial := func(context.Context) (transport, error) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		dials <- k
		switch {
		case k == 1:
			return first, nil
		case k < 5:
			return nil, errors.New("fake: bus down")
		default:
			return last, nil
		}
	}
	l, err := newLogind(Config{Logger: testLogger(t), Clock: fc, ReconnectMin: time.Second, ReconnectMax: 3 * time.Second}, dial)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ch, err := l.WatchPrepareForShutdown(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := <-dials; got != 1 {
		t.Fatalf("dial %d, want 1", got)
	}
	first.emit(true)
	expectValue(t, ctx, ch, true)

	_ = first.close() // connection lost
	// Waits: 1s, then 2s, then 3s (capped), then 3s; dials 2..5.
	for i, wait := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second} {
		waitForWaiter(t, ctx, fc)
		fc.Step(wait - time.Millisecond)
		expectNothing(t, dials, "early dial")
		fc.Step(time.Millisecond)
		select {
		case got := <-dials:
			if got != i+2 {
				t.Fatalf("dial %d, want %d", got, i+2)
			}
		case <-ctx.Done():
			t.Fatalf("no dial %d after %s", i+2, wait)
		}
	}
	// The property says no shutdown: the change missed while down.
	expectValue(t, ctx, ch, false)
	last.emit(true)
	expectValue(t, ctx, ch, true)
	last.mu.Lock()
	matches := last.matches
	last.mu.Unlock()
	if matches != 1 {
		t.Fatalf("match added %d times on the new connection, want 1", matches)
	}
}
