package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The boot after a shutdown gives the node back only when it is ready
// (DESIGN §3, "Ready means ready"): before the uncordon that closes the
// shutdown out, the agent runs Config.ShutdownReturn's steps, the reboot
// driver's wait-ready (the kubelet's Ready of this boot) and
// wait-workloads-ready (package readiness: the DaemonSets and extended
// resources the node had when the shutdown began, the configured
// conditions, the command), each as for an event:
//
//   - the snapshot they require is taken when logind announces the shutdown,
//     beside the conditions and the cordon and within the shutdown budget
//     (PrepareShutdown), and journaled with the shutdown's record; the
//     kubelet's own shutdown is then only starting to stop pods. Not read
//     (an API server that does not answer in time): the checks compare
//     against nothing and say so;
//   - the waits run only when the shutdown's cordon is ours: a node someone
//     else cordoned stays as it is and is closed out at once;
//   - each step is journaled (intent, then done or failed) under the
//     shutdown's record, so a restart of the agent during the readiness
//     wait resumes it with what is left of readiness.timeout (wait-ready
//     starts its reboot.readyTimeout again, as in a reboot event), and a
//     step that failed is not run again, nor one whose failure kept the
//     cordon; a step done or begun in an earlier boot (a power loss during
//     the wait, no logind shutdown) is waited for again, from its start;
//   - another shutdown announced during the wait stops it (PrepareShutdown
//     cancels Engine.returning) and does not take the cordon's record over:
//     the earlier shutdown keeps it, and its close-out runs again at the
//     next start, or right after the new shutdown is cancelled
//     (closeOutAgain); records are closed out oldest first;
//   - while they run, LifecycleTransition (reason ShuttingDown) names what
//     the node waits for, through the outbox (a message that changes
//     within a second supersedes the last);
//   - a step that fails (the kubelet not Ready in this boot within
//     reboot.readyTimeout — unlike a reboot event's abort, which gives the
//     node back: nothing asked for this shutdown, and a node whose kubelet
//     is not Ready is not ready — or the workloads not back within
//     readiness.timeout) closes the shutdown out Failed:
//     LifecycleTransition=False with reason NotReadyAfterShutdown naming
//     it, and with readiness.onTimeout keepCordoned (the default) the node
//     stays cordoned by the shutdown for an admin to give back;
//   - a shutdown during an event (attrs "during") leaves LifecycleTransition
//     to the event: the wait's progress and NotReadyAfterShutdown are then
//     in GracefulNodeShutdownInProgress's message only;
//   - wait-ready is retried while the API server does not answer (its
//     error reads as an outage), as the engine retries an event's step that
//     needs the API; the readiness wait handles an outage itself;
//   - the wait holds the engine's loop, as a running event does: an event
//     for the node is claimed once the node is back or the wait has ended.

// ReasonNotReadyAfterShutdown is LifecycleTransition's reason when the
// node came back from a shutdown but was not ready within the waits.
const ReasonNotReadyAfterShutdown = "NotReadyAfterShutdown"

const stateReturning = "returning after a shutdown"

// shutdownRuntime is what a NodeReturn step sees: the shutdown's record
// stands for the event.
type shutdownRuntime struct {
	e     *Engine
	r     journal.EventRecord
	step  string
	shown string
}

func (s *shutdownRuntime) EventName() string     { return s.r.Name }
func (s *shutdownRuntime) Node() string          { return s.e.cfg.Node }
func (s *shutdownRuntime) BootID() string        { return s.e.cfg.Host.BootID() }
func (s *shutdownRuntime) Host() drivers.HostOps { return s.e.cfg.Host }
func (s *shutdownRuntime) API() drivers.NodeAPI  { return s.e.cfg.API }

func (s *shutdownRuntime) Params() map[string]string {
	p := map[string]string{}
	if v, ok := s.r.Attrs[drivers.ResolvedReadiness]; ok {
		p[drivers.ResolvedReadiness] = v
	}
	return p
}

// Progress names what the node waits for on LifecycleTransition, lazily
// (it lingers a second in the outbox, superseded by what follows).
func (s *shutdownRuntime) Progress(msg string) {
	s.e.log.Info("progress", "event", s.r.Name, "step", s.step, "message", msg)
	if msg == s.shown {
		return
	}
	s.shown = msg
	s.e.pushShutdownConditions(s.r, shutdownStart, corev1.ConditionTrue, returningMsg(s.r)+"; "+msg, true)
}

func returningMsg(r journal.EventRecord) string {
	return transitionMsg("shutdown", r.Name) + ": node restarted after a shutdown; kept cordoned until lifecycle-agent closes it out"
}

// change maps a step's change to the shutdown's records: the cordon (key
// the node) is the one PrepareShutdown made, owner "shutdown".
func (s *shutdownRuntime) change(c drivers.Change) journal.Change {
	return journal.Change{Kind: journal.ChangeCordon, Node: c.Key, Name: shutdownOwner, EventUID: s.r.UID, Value: shutdownOwner}
}

func (s *shutdownRuntime) Own(c drivers.Change) error {
	_, err := s.e.cfg.Journal.AddOwned(s.change(c))
	return err
}

func (s *shutdownRuntime) Disown(c drivers.Change) error {
	return s.e.cfg.Journal.RemoveOwned(s.change(c).Key())
}

func (s *shutdownRuntime) Owns(c drivers.Change) bool {
	return s.e.owns(s.r.UID, s.change(c).Key())
}

// StepStarted is the time of the step's first intent under the shutdown
// in this boot: a wait begun in an earlier boot (cut by a power loss) is
// begun again.
func (s *shutdownRuntime) StepStarted() time.Time {
	return s.e.firstIntent(s.r.UID, s.step, s.e.cfg.Host.BootID())
}

// owns reports whether the journal holds the owned change key for uid.
func (e *Engine) owns(uid, key string) bool { return uid != "" && e.ownedBy(key) == uid }

// ownsNot reports whether the journal says, read without error, that uid
// does not own key (a journal it cannot read says nothing).
func (e *Engine) ownsNot(uid, key string) bool {
	owner, err := e.owner(key)
	return err == nil && owner != uid
}

// ownedBy is the event UID of the owned change key ("": none, or the
// journal cannot be read).
func (e *Engine) ownedBy(key string) string {
	owner, _ := e.owner(key)
	return owner
}

// owner is the event UID of the owned change key ("": none).
func (e *Engine) owner(key string) (string, error) {
	cs, err := e.cfg.Journal.Owned()
	if err != nil {
		return "", err
	}
	for _, c := range cs {
		if c.Key() == key {
			return c.EventUID, nil
		}
	}
	return "", nil
}

// shutdownCordonKey and shutdownKeptKey are the owned records of a
// shutdown's cordon and of its readiness failure keeping it.
func (e *Engine) shutdownCordonKey() string {
	return journal.Change{Kind: journal.ChangeCordon, Node: e.cfg.Node, Name: shutdownOwner}.Key()
}

func (e *Engine) shutdownKeptKey() string {
	return journal.Change{Kind: journal.ChangeCordon, Node: drivers.CordonKept(e.cfg.Node).Key, Name: shutdownOwner}.Key()
}

// pushShutdownConditions queues the shutdown's Node conditions in the
// outbox (superseding any still queued for it) and wakes the flusher;
// lazy ones linger a second.
func (e *Engine) pushShutdownConditions(r journal.EventRecord, reason string, status corev1.ConditionStatus, msg string, lazy bool) {
	conds := e.shutdownConditions(reason, status, corev1.ConditionFalse, msg, r.Attrs["during"] != "")
	raw, _ := json.Marshal(nodePayload{Conditions: conds})
	e.lazyMu.Lock()
	seq, err := e.cfg.Journal.OutboxPush(journal.OutboxEntry{UID: r.UID, Kind: journal.OutboxNodeCondition, Payload: raw})
	if err == nil && lazy {
		if e.lazy == nil {
			e.lazy = map[uint64]time.Time{}
		}
		e.lazy[seq] = e.cfg.Clock.Now().Add(statusLinger)
	}
	e.lazyMu.Unlock()
	if err != nil {
		e.log.Error("outbox push", "event", r.Name, "err", err)
	}
	poke(e.flushWake)
}

// waitsToReturn reports whether r's close-out runs ShutdownReturn's steps:
// its cordon is ours, or they have begun (a replay after a crash that came
// after the cordon's records were dropped still ends as they decided).
func (e *Engine) waitsToReturn(r journal.EventRecord) bool {
	if len(e.cfg.ShutdownReturn.Steps) == 0 {
		return false
	}
	if e.owns(r.UID, e.shutdownCordonKey()) {
		return true
	}
	recs, _ := e.cfg.Journal.Steps(r.UID)
	for _, rec := range recs {
		for _, st := range e.cfg.ShutdownReturn.Steps {
			if rec.Step == st.Name {
				return true
			}
		}
	}
	return false
}

// returnAfterShutdown runs ShutdownReturn's steps for r, a shutdown of an
// earlier boot whose cordon is ours. nil: the node is back; a notBack
// error says why it is not; ctx's error when the agent stops; any other,
// the journal's, is worth another try.
func (e *Engine) returnAfterShutdown(ctx context.Context, r journal.EventRecord) error {
	nr := e.cfg.ShutdownReturn
	recs, err := e.cfg.Journal.Steps(r.UID)
	if err != nil {
		return fmt.Errorf("engine: reading the shutdown's steps: %w", err)
	}
	// A step done in an earlier boot (the wait cut by a power loss before
	// the close-out) is waited for again in this one; a failure stands.
	boot := e.cfg.Host.BootID()
	last := map[string]journal.StepRecord{}
	attempts := map[string]int{}
	failed := ""
	for _, rec := range recs {
		if rec.Phase == journal.PhaseIntent {
			attempts[rec.Step]++
		}
		if rec.BootID != boot && rec.State != journal.StepFailed {
			delete(last, rec.Step)
			continue
		}
		last[rec.Step] = rec
		if rec.State == journal.StepFailed {
			failed = rec.Message
		}
	}
	if e.owns(r.UID, e.shutdownKeptKey()) {
		// A step failed and kept the cordon before a restart that came
		// before its failure was journaled, or after: the decision stands.
		if failed == "" {
			failed = "the node was not ready after the shutdown (decided before the agent restarted)" + drivers.KeptSuffix
		}
		return notBack{errors.New(failed)}
	}
	// The wait holds the engine's loop: it is progress all the same.
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for e.sleep(bctx, time.Second) {
			e.alive()
		}
	}()
	e.setState(stateReturning, "event", r.Name)
	for _, st := range nr.Steps {
		switch l, ok := last[st.Name]; {
		case ok && l.Phase == journal.PhaseDone && l.State == journal.StepDone:
			continue
		case ok && l.Phase == journal.PhaseDone && l.State == journal.StepFailed:
			return notBack{errors.New(l.Message)} // decided before a restart: not run again
		}
		record := func(phase journal.StepPhase, state journal.StepState, msg string) error {
			if _, err := e.cfg.Journal.AppendStep(r.UID, journal.StepRecord{Step: st.Name, Phase: phase,
				State: state, Attempt: attempts[st.Name], BootID: boot, Message: msg}); err != nil {
				return fmt.Errorf("engine: journal %s: %w", st.Name, err)
			}
			return nil
		}
		for {
			attempts[st.Name]++
			if err := record(journal.PhaseIntent, journal.StepRunning, ""); err != nil {
				return err
			}
			rt := &shutdownRuntime{e: e, r: r, step: st.Name}
			err := st.Run(ctx, rt)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err == nil {
				if err := record(journal.PhaseDone, journal.StepDone, ""); err != nil {
					return err
				}
				break
			}
			if st.NeedsAPI && isTransient(err) {
				e.log.Warn("shutdown: a step failed while the API server does not answer; retrying", "event", r.Name, "step", st.Name, "err", err)
				if !e.sleep(ctx, 2*time.Second) {
					return ctx.Err()
				}
				continue
			}
			msg := err.Error()
			if nr.KeepCordoned && rt.Owns(drivers.Change{Kind: "cordon", Key: e.cfg.Node}) && !rt.Owns(drivers.CordonKept(e.cfg.Node)) {
				if err := rt.Own(drivers.CordonKept(e.cfg.Node)); err != nil {
					return fmt.Errorf("engine: journal the kept cordon: %w", err)
				}
				msg += drivers.KeptSuffix
			}
			// Failed for good: a replay closes the shutdown out with it.
			if err := record(journal.PhaseDone, journal.StepFailed, msg); err != nil {
				return err
			}
			return notBack{errors.New(msg)}
		}
	}
	return nil
}

// notBack is a NodeReturn step's failure: the shutdown ends Failed with it.
// Any other error of returnAfterShutdown (the journal's) is retried.
type notBack struct{ error }
