package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Local requests (`lifecycle-agent request`, for provisioning pipelines).
//
// A request names one of this agent's drivers. It is validated locally
// (driver enabled, parameters accepted by the driver's Plan), then the agent
// creates the LifecycleEvent as the node identity, bound to this node. When
// the API server is unreachable the request is journaled as a pending local
// event and published as soon as the server answers; it then runs through
// the normal claim. Decision: it does not run before it is published — the
// transitions a pipeline asks for (drain, reboot, OS upgrade) disrupt the
// node, and a disruption the cluster cannot see, nor budget (spec.disruption),
// is what this agent exists to prevent.

// ErrUnknownDriver is returned for a request naming no enabled driver.
var ErrUnknownDriver = errors.New("engine: no such enabled driver")

const requestDriver = "local-request"

// RequestResult says what became of a request.
type RequestResult struct {
	Event  string `json:"event"`
	Queued bool   `json:"queued"` // journaled; published when the API answers
}

// Request validates and creates (or queues) an event for driver on this node.
func (e *Engine) Request(ctx context.Context, driver string, params map[string]string) (RequestResult, error) {
	d := e.driverByName(driver)
	if d == nil {
		var names []string
		for _, x := range e.driverList() {
			names = append(names, x.Short())
		}
		return RequestResult{}, fmt.Errorf("%w: %q (enabled: %s)", ErrUnknownDriver, driver, strings.Join(names, ", "))
	}
	dp, _, err := splitParams(params)
	if err != nil {
		return RequestResult{}, err
	}
	if _, err := d.Plan(dp); err != nil {
		return RequestResult{}, err
	}
	now := e.cfg.Clock.Now().UTC()
	name := fmt.Sprintf("%s-%s-%s", e.cfg.Node, d.Short(), now.Format("20060102-150405")+fmt.Sprintf("-%06d", now.Nanosecond()/1000))
	ev := &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"lifecycle.x-k8s.io/requested-by": "local"}},
		Spec:       v1alpha1.LifecycleEventSpec{TransitionName: TransitionName(e.cfg.Node, d), BindingNode: e.cfg.Node, Parameters: params},
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = e.cfg.API.LC.Events.Create(cctx, ev, metav1.CreateOptions{})
	cancel()
	if err == nil {
		e.log.Info("request created", "event", name, "driver", d.Name())
		return RequestResult{Event: name}, nil
	}
	if !isTransient(err) {
		return RequestResult{}, fmt.Errorf("creating %s: %w", name, err)
	}
	raw, _ := json.Marshal(ev)
	if err := e.cfg.Journal.PutEvent(journal.EventRecord{UID: "local-request-" + name, Name: name, Driver: requestDriver,
		State: journal.EventClaimed, Object: raw, Attrs: map[string]string{"local": "request"}}); err != nil {
		return RequestResult{}, err
	}
	e.log.Warn("the API server is unreachable: request queued in the journal", "event", name, "err", err)
	return RequestResult{Event: name, Queued: true}, nil
}

func (e *Engine) driverByName(n string) drivers.Driver {
	for _, d := range e.driverList() {
		if d.Name() == n || d.Short() == n {
			return d
		}
	}
	return nil
}

// publishRequests creates the events of queued requests.
func (e *Engine) publishRequests(ctx context.Context) {
	recs, err := e.cfg.Journal.Events()
	if err != nil {
		return
	}
	for _, r := range recs {
		if r.Driver != requestDriver {
			continue
		}
		var ev v1alpha1.LifecycleEvent
		if json.Unmarshal(r.Object, &ev) != nil {
			_ = e.cfg.Journal.FinishEvent(r.UID, journal.OutcomeFailed, "undecodable request")
			continue
		}
		_, err := e.cfg.API.LC.Events.Create(ctx, &ev, metav1.CreateOptions{})
		if err != nil && !isAlreadyExists(err) {
			e.log.Warn("publishing a queued request failed; will retry", "event", ev.Name, "err", err)
			continue
		}
		e.log.Info("queued request published", "event", ev.Name)
		_ = e.cfg.Journal.FinishEvent(r.UID, journal.OutcomeSucceeded, "published")
	}
}

// Queued reports whether a request is still waiting in the journal.
func (e *Engine) Queued(name string) bool {
	recs, err := e.cfg.Journal.Events()
	if err != nil {
		return false
	}
	for _, r := range recs {
		if r.Driver == requestDriver && r.Name == name {
			return true
		}
	}
	return false
}

// Event reads an event from the API server (for `request --wait`).
func (e *Engine) Event(ctx context.Context, name string) (*v1alpha1.LifecycleEvent, error) {
	return e.cfg.API.GetEvent(ctx, name)
}
