package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The outbox: status and Node condition writes queued in the journal and
// delivered by flushLoop, lazily for progress-only status (pushStatusLazy),
// and the cache of the event as the last write returned it. Split out of
// run.go; moved, not changed.

type nodePayload struct {
	Conditions []apiclient.NodeCondition `json:"conditions"`
}

func (e *Engine) pushStatus(a *active) error {
	_, err := e.cfg.Journal.OutboxPush(a.statusEntry())
	if err != nil {
		e.log.Error("outbox push", "event", a.name, "err", err)
	}
	poke(e.flushWake)
	return err
}

// runningDeliveryWait bounds how long a step with a Done check waits for
// its Running to reach the API server before it acts (awaitStatus).
const runningDeliveryWait = 10 * time.Second

// awaitStatus waits until no status of the event is left in the outbox,
// at most bound, and not at all while the API server is unreachable; it
// reports whether the status was delivered. A step with a Done check
// calls it between queuing its Running and acting: the journal's intent
// is what makes a replay ask before acting again, and the status's
// Running is what does it when the journal is lost (rebuiltSteps). Queued
// is not enough: a reboot that went ahead of the delivery (the flusher is
// asynchronous) took the Running down with the old boot, and a lost
// journal after it would have repeated the reboot. An API server that is
// down does not hold the node up: the agent works offline, as before.
func (e *Engine) awaitStatus(ctx context.Context, a *active, bound time.Duration) bool {
	until := e.cfg.Clock.Now().Add(bound)
	for {
		pending, err := e.cfg.Journal.OutboxPending()
		if err != nil {
			return false
		}
		queued := false
		for _, p := range pending {
			if p.UID == a.uid && p.Kind == journal.OutboxEventStatus {
				queued = true
			}
		}
		if !queued {
			return true
		}
		if ctx.Err() != nil || !e.cfg.API.Contact().Reachable || !e.cfg.Clock.Now().Before(until) {
			return false
		}
		poke(e.flushWake)
		select {
		case <-ctx.Done():
		case <-e.flushed:
		case <-e.cfg.Clock.After(250 * time.Millisecond):
		}
	}
}

// statusLinger is how long a lazy status entry (pushStatusLazy) waits at
// the head of the outbox for a newer status of its event to supersede it.
const statusLinger = time.Second

// pushStatusLazy queues the event's status as pushStatus does, for a write
// that only shows live progress: a step's Running (of a step without a
// Done check: repeating it is harmless) or a progress message. Such an
// entry is delivered statusLinger after it was queued, unless a newer
// status of the event supersedes it first — the next step's Running, a
// slot wait, the end state — so a step that ends within statusLinger
// costs no status write of its own. A lazy entry that supersedes another
// keeps the older one's time: a stream of progress messages still goes
// out, at most one write a second. Nothing is reordered: the outbox stays
// in order, entries queued behind it wait (at most statusLinger), and the
// Node's conditions still go out after the status queued before them and
// before the status queued after them.
//
// While a step with a Done check runs, an entry that supersedes a status
// still queued that must go out at once (pushStatus: that step's Running)
// is not lazy either: it carries that Running on. Once the step is done
// the journal holds the proof and its later progress lingers again.
// After a restart nothing is lazy.
func (e *Engine) pushStatusLazy(a *active) error {
	checked := a.runningCheckedStep()
	e.lazyMu.Lock()
	defer e.lazyMu.Unlock()
	until, urgent := e.cfg.Clock.Now().Add(statusLinger), false
	if pending, err := e.cfg.Journal.OutboxPending(); err == nil {
		for _, p := range pending {
			if p.UID != a.uid || p.Kind != journal.OutboxEventStatus {
				continue
			}
			if t, lazy := e.lazy[p.Seq]; lazy {
				until = minTime(until, t)
			} else {
				urgent = checked
			}
		}
	}
	seq, err := e.cfg.Journal.OutboxPush(a.statusEntry())
	if err != nil {
		e.log.Error("outbox push", "event", a.name, "err", err)
	} else if !urgent {
		if e.lazy == nil {
			e.lazy = map[uint64]time.Time{}
		}
		e.lazy[seq] = until
	}
	poke(e.flushWake)
	return err
}

// runningCheckedStep reports whether the current step has a Done check
// and is Running.
func (a *active) runningCheckedStep() bool {
	a.statusMu.Lock()
	defer a.statusMu.Unlock()
	for i, s := range a.steps {
		if s.Name == a.status.CurrentStep && i < len(a.status.Steps) {
			return s.Done != nil && a.status.Steps[i].State == v1alpha1.StepRunning
		}
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// acked forgets the lazy time of an outbox entry delivered (or dropped).
func (e *Engine) acked(seq uint64) {
	e.lazyMu.Lock()
	delete(e.lazy, seq)
	e.lazyMu.Unlock()
}

// lingering is how long the outbox's head entry still waits (lazy), and
// forgets lazy entries that are gone from the outbox (superseded).
func (e *Engine) lingering(pending []journal.OutboxEntry) time.Duration {
	e.lazyMu.Lock()
	defer e.lazyMu.Unlock()
	if len(e.lazy) == 0 {
		return 0
	}
	if len(e.lazy) > len(pending) {
		// Superseded ones; not those queued since pending was read.
		in, last := map[uint64]bool{}, uint64(0)
		for _, p := range pending {
			in[p.Seq], last = true, max(last, p.Seq)
		}
		for seq := range e.lazy {
			if seq <= last && !in[seq] {
				delete(e.lazy, seq)
			}
		}
	}
	until, ok := e.lazy[pending[0].Seq]
	if !ok {
		return 0
	}
	// Past its time it stays lazy until acked: a status queued while it
	// is being delivered supersedes it with its (past) time, and goes out
	// right after it.
	return max(until.Sub(e.cfg.Clock.Now()), 0)
}

// statusEntry is the outbox entry of the event's status as it is now.
func (a *active) statusEntry() journal.OutboxEntry {
	a.statusMu.Lock()
	raw, _ := json.Marshal(a.status)
	a.statusMu.Unlock()
	return journal.OutboxEntry{UID: a.uid, Kind: journal.OutboxEventStatus, Payload: raw}
}

// flushLoop delivers the outbox in order while the API server answers.
func (e *Engine) flushLoop(ctx context.Context) {
	fails := 0
	for ctx.Err() == nil {
		pending, err := e.cfg.Journal.OutboxPending()
		e.cfg.Metrics.OutboxDepth.Set(float64(len(pending)))
		if err == nil && len(pending) > 0 {
			if wait := e.lingering(pending); wait > 0 {
				select {
				case <-ctx.Done():
				case <-e.flushWake: // maybe superseded
				case <-e.cfg.Clock.After(wait):
				}
				continue
			}
			if err := e.deliver(ctx, pending[0]); err != nil {
				if isInvalid(err) && ctx.Err() == nil {
					// The server refuses this write for good (422/400): drop
					// it rather than hold back every later one. Anything else
					// (403 while a restarted server's authorizer warms up,
					// conflicts, outages) is retried.
					e.log.Warn("outbox: the API server refused a write; dropping it", "seq", pending[0].Seq, "kind", pending[0].Kind.String(), "err", err)
					_ = e.cfg.Journal.OutboxAck(pending[0].Seq)
					e.acked(pending[0].Seq)
					poke(e.flushed)
					continue
				}
				fails++
				e.log.Info("outbox delivery failed; will retry", "seq", pending[0].Seq, "depth", len(pending), "err", err)
				if !e.sleep(ctx, retryWait(fails, err)) {
					return
				}
				continue
			}
			fails = 0
			_ = e.cfg.Journal.OutboxAck(pending[0].Seq)
			e.acked(pending[0].Seq)
			poke(e.flushed)
			continue
		}
		select {
		case <-ctx.Done():
		case <-e.flushWake:
		case <-e.cfg.Clock.After(5 * time.Second):
		}
	}
}

func (e *Engine) deliver(ctx context.Context, en journal.OutboxEntry) error {
	switch en.Kind {
	case journal.OutboxNodeCondition:
		var p nodePayload
		if err := json.Unmarshal(en.Payload, &p); err != nil {
			return nil // undecodable: drop it rather than block the outbox
		}
		return e.cfg.API.SetNodeConditions(ctx, e.cfg.Clock.Now(), p.Conditions...)
	case journal.OutboxEventStatus:
		var st v1alpha1.LifecycleEventStatus
		if err := json.Unmarshal(en.Payload, &st); err != nil {
			return nil
		}
		for i := 0; i < 5; i++ {
			// First try with the object our last write returned (one
			// request); a conflict means someone else wrote since: read it.
			ev := e.recalled(en.UID)
			if ev == nil || i > 0 {
				var err error
				if ev, err = e.eventByUID(ctx, en.UID); err != nil {
					return err
				}
			}
			if ev == nil {
				return nil // gone: nothing to write
			}
			ev.Status = st
			// gofail: var engineBeforeStatusWrite struct{}
			got, err := e.cfg.API.UpdateEventStatus(ctx, ev)
			if err == nil {
				// gofail: var engineAfterStatusWrite struct{}
				e.remember(got)
				return nil
			}
			if isNotFound(err) {
				e.forget(en.UID)
				return nil
			}
			if !isConflict(err) {
				return err
			}
		}
		return fmt.Errorf("status of %s: too many conflicts", en.UID)
	}
	return nil
}

// remember keeps ev, as a write of ours returned it, for the next status
// write of the same event (see deliver). Only the running event is kept.
func (e *Engine) remember(ev *v1alpha1.LifecycleEvent) {
	if ev == nil {
		return
	}
	e.mu.Lock()
	e.last = ev.DeepCopy()
	e.mu.Unlock()
}

// recalled returns a copy of the remembered object of event uid, or nil.
func (e *Engine) recalled(uid string) *v1alpha1.LifecycleEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last == nil || string(e.last.UID) != uid {
		return nil
	}
	return e.last.DeepCopy()
}

func (e *Engine) forget(uid string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last != nil && string(e.last.UID) == uid {
		e.last = nil
	}
}

// eventByUID reads the event the outbox entry is about, by the name the
// journal recorded; nil if it is gone or was replaced.
func (e *Engine) eventByUID(ctx context.Context, uid string) (*v1alpha1.LifecycleEvent, error) {
	rec, ok, err := e.cfg.Journal.Event(uid)
	name := ""
	if err == nil && ok {
		name = rec.Name
	}
	if name == "" {
		e.mu.Lock()
		if e.current != nil && e.current.uid == uid {
			name = e.current.name
		}
		e.mu.Unlock()
	}
	if name == "" {
		return nil, nil
	}
	ev, err := e.cfg.API.GetEvent(ctx, name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if string(ev.UID) != uid {
		return nil, nil
	}
	return ev, nil
}
