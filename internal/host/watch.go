package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/godbus/dbus/v5"
)

// prepareForShutdownMatch is the match rule for logind's PrepareForShutdown.
// dbus-daemon resolves the well-known sender name at delivery time, so the
// rule stays valid across a logind restart.
func prepareForShutdownMatch() []dbus.MatchOption {
	return []dbus.MatchOption{
		dbus.WithMatchSender(login1Dest),
		dbus.WithMatchObjectPath(login1Path),
		dbus.WithMatchInterface(login1Manager),
		dbus.WithMatchMember("PrepareForShutdown"),
	}
}

// subscription is one connection carrying the PrepareForShutdown match.
type subscription struct {
	t  transport
	ch chan *dbus.Signal
}

// WatchPrepareForShutdown subscribes to logind's PrepareForShutdown signal
// and returns a channel of its argument: true when a shutdown or reboot
// begins, false when one was cancelled.
//
// The subscription has its own bus connection. When the connection drops
// (dbus-daemon restarted, socket closed), it reconnects with exponential
// backoff timed by Config.Clock, re-adds the match rule and reads logind's
// PreparingForShutdown property, so a change missed while disconnected is
// still delivered. The same property is read once after the first
// subscribe: a shutdown already in progress is delivered as true.
//
// Only changes are delivered: a value equal to the previous one is dropped.
// Two changes missed in a row while disconnected (false then true) are
// seen as no change. Values are never dropped for a slow reader; the
// subscription waits for the reader instead.
//
// The channel is closed when ctx ends or the Logind is closed; Close waits
// for the subscription's goroutine. The error is non-nil only when the
// first subscribe fails; callers should fail closed.
func (l *Logind) WatchPrepareForShutdown(ctx context.Context) (<-chan bool, error) {
	l.mu.Lock()
	if l.isClosed {
		l.mu.Unlock()
		return nil, fmt.Errorf("host: watch PrepareForShutdown: %w", ErrClosed)
	}
	l.watchers.Add(1)
	l.mu.Unlock()
	sub, err := l.subscribe(ctx)
	if err != nil {
		l.watchers.Done()
		return nil, fmt.Errorf("host: watch PrepareForShutdown: %w", err)
	}
	out := make(chan bool, 1)
	go func() {
		defer l.watchers.Done()
		l.watchLoop(ctx, sub, out)
	}()
	return out, nil
}

// subscribe dials a connection, registers for signals and adds the match.
func (l *Logind) subscribe(ctx context.Context) (*subscription, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	t, err := l.dial(ctx)
	if err != nil {
		return nil, err
	}
	// Buffered so that a burst does not make godbus spawn a goroutine per
	// signal; ordering is kept either way only while the buffer has room.
	ch := make(chan *dbus.Signal, 16)
	t.subscribe(ch)
	if err := t.addMatch(ctx, prepareForShutdownMatch()...); err != nil {
		_ = t.close()
		return nil, fmt.Errorf("add match for PrepareForShutdown: %w", err)
	}
	return &subscription{t: t, ch: ch}, nil
}

// preparing reads PreparingForShutdown over the subscription's connection.
func (l *Logind) preparing(ctx context.Context, sub *subscription) (bool, error) {
	ctx, cancel := l.withTimeout(ctx)
	defer cancel()
	v, err := sub.t.getProperty(ctx, login1Dest, login1Path, login1Manager, "PreparingForShutdown")
	if err != nil {
		return false, err
	}
	b, ok := v.Value().(bool)
	if !ok {
		return false, fmt.Errorf("%w: PreparingForShutdown has type %s", ErrUnexpectedReply, v.Signature())
	}
	return b, nil
}

func (l *Logind) watchLoop(ctx context.Context, sub *subscription, out chan<- bool) {
	defer close(out)
	last := false
	deliver := func(v bool, source string) bool {
		if v == last {
			return true
		}
		select {
		case out <- v:
			last = v
			l.log.Info("PrepareForShutdown", "active", v, "source", source)
			return true
		case <-ctx.Done():
			return false
		case <-l.closed:
			return false
		}
	}
	syncState := func() bool {
		p, err := l.preparing(ctx, sub)
		if err != nil {
			l.log.Warn("cannot read PreparingForShutdown; relying on signals", "err", err)
			return true
		}
		return deliver(p, "property")
	}
	defer func() {
		if sub != nil {
			_ = sub.t.close()
		}
	}()
	if !syncState() {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.closed:
			return
		case sig, ok := <-sub.ch:
			if !ok {
				l.log.Warn("bus connection of PrepareForShutdown subscription lost; reconnecting")
				_ = sub.t.close()
				sub = l.resubscribe(ctx)
				if sub == nil {
					return
				}
				if !syncState() {
					return
				}
				continue
			}
			v, ok := parsePrepareForShutdown(sig)
			if !ok {
				continue
			}
			if !deliver(v, "signal") {
				return
			}
		}
	}
}

// parsePrepareForShutdown extracts the argument of a PrepareForShutdown
// signal; every other signal on the connection (NameAcquired, ...) is
// ignored.
func parsePrepareForShutdown(sig *dbus.Signal) (bool, bool) {
	if sig == nil || sig.Name != prepareForShutdownSig || sig.Path != login1Path || len(sig.Body) != 1 {
		return false, false
	}
	v, ok := sig.Body[0].(bool)
	return v, ok
}

// resubscribe retries subscribe with exponential backoff until it succeeds
// or ctx ends (nil). It waits on Config.Clock, never sleeps.
func (l *Logind) resubscribe(ctx context.Context) *subscription {
	delay := l.cfg.ReconnectMin
	for attempt := 1; ; attempt++ {
		timer := l.clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-l.closed:
			timer.Stop()
			return nil
		case <-timer.C():
		}
		sub, err := l.subscribe(ctx)
		if err == nil {
			l.log.Info("PrepareForShutdown subscription re-established", "attempt", attempt)
			return sub
		}
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return nil
		}
		delay = min(delay*2, l.cfg.ReconnectMax)
		// One line per attempt; the backoff bounds the rate.
		l.log.Warn("PrepareForShutdown subscription: reconnect failed", "attempt", attempt, "retry_in", delay, "err", err)
	}
}
