package engine

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

func isConflict(err error) bool      { return apierrors.IsConflict(err) }
func isNotFound(err error) bool      { return apierrors.IsNotFound(err) }
func isAlreadyExists(err error) bool { return apierrors.IsAlreadyExists(err) }
func isInvalid(err error) bool       { return apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) }

// runtime is what a step sees of the engine.
type stepRuntime struct {
	e *Engine
	a *active
}

func (r *stepRuntime) EventName() string         { return r.a.name }
func (r *stepRuntime) Node() string              { return r.e.cfg.Node }
func (r *stepRuntime) BootID() string            { return r.e.cfg.Host.BootID() }
func (r *stepRuntime) Host() drivers.HostOps     { return r.e.cfg.Host }
func (r *stepRuntime) Params() map[string]string { return r.a.params }
func (r *stepRuntime) API() drivers.NodeAPI      { return r.e.cfg.API }

// Progress may be called from several goroutines at once (kubectl's drain
// library reports each pod's eviction from that pod's goroutine).
func (r *stepRuntime) Progress(msg string) {
	r.a.statusMu.Lock()
	r.a.status.Message = truncate(msg)
	step := r.a.status.CurrentStep
	r.a.statusMu.Unlock()
	_ = r.e.pushStatusLazy(r.a) // a following state supersedes it (pushStatusLazy)
	if step == drivers.StepWaitWorkloads {
		// Its progress names what the node waits for, which the Node's
		// MaintenanceInProgress names too (eventConditions); pushNode
		// queues a write only when the conditions change. The readiness
		// step reports from its own (the engine's) goroutine, so lastNode
		// is not raced; other steps report from several.
		_ = r.e.pushNode(r.a, running)
	}
	r.e.log.Info("progress", "event", r.a.name, "step", step, "message", msg)
}

// StepStarted is the time of the running step's first intent record:
// every attempt appends one, the first is kept until the event ends. The
// zero time when the journal cannot be read or has none (an adopted event
// whose journal was lost gets one rebuilt at adoption, rebuiltSteps).
func (r *stepRuntime) StepStarted() time.Time {
	r.a.statusMu.Lock()
	step := r.a.status.CurrentStep
	r.a.statusMu.Unlock()
	return r.e.firstIntent(r.a.uid, step, "")
}

// firstIntent is the time of step's first intent record under uid, in the
// boot boot ("": any); the zero time when there is none or the journal
// cannot be read.
func (e *Engine) firstIntent(uid, step, boot string) time.Time {
	recs, err := e.cfg.Journal.Steps(uid)
	if err != nil {
		return time.Time{}
	}
	for _, rec := range recs {
		if rec.Step == step && rec.Phase == journal.PhaseIntent && (boot == "" || rec.BootID == boot) {
			return rec.At
		}
	}
	return time.Time{}
}

func change(r *stepRuntime, c drivers.Change) journal.Change {
	kind := journal.ChangeCordon
	if c.Kind == "annotation" {
		kind = journal.ChangeAnnotation
	}
	return journal.Change{Kind: kind, Node: c.Key, EventUID: r.a.uid, Value: r.a.name}
}

func (r *stepRuntime) Own(c drivers.Change) error {
	_, err := r.e.cfg.Journal.AddOwned(change(r, c))
	return err
}

func (r *stepRuntime) Disown(c drivers.Change) error {
	return r.e.cfg.Journal.RemoveOwned(change(r, c).Key())
}

func (r *stepRuntime) Owns(c drivers.Change) bool {
	return r.e.owns(r.a.uid, change(r, c).Key())
}
