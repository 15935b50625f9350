package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// The engine's own event parameters: they are taken out of
// spec.parameters before the driver sees them.
const (
	// ParamMaintenanceWindow=ignore: the event does not wait for a window.
	ParamMaintenanceWindow = "maintenanceWindow"
	// ParamGates=ignore: the event does not wait for the gates.
	ParamGates  = "gates"
	paramIgnore = "ignore"
)

// ReasonMaintenanceWindow: MaintenancePlanned is True because the event
// waits for a maintenance window (the merged KEP's example reason).
const ReasonMaintenanceWindow = "MaintenanceWindow"

// startOpts is what an event's own parameters say about windows and gates.
type startOpts struct {
	ignoreWindow, ignoreGates bool
}

// splitParams takes the engine's parameters out of an event's: the rest is
// the driver's. A value other than "ignore" is refused, naming the parameter.
func splitParams(p map[string]string) (map[string]string, startOpts, error) {
	var o startOpts
	if _, w := p[ParamMaintenanceWindow]; !w {
		if _, g := p[ParamGates]; !g {
			return p, o, nil
		}
	}
	out := make(map[string]string, len(p))
	for k, v := range p {
		switch k {
		case ParamMaintenanceWindow, ParamGates:
			if v != paramIgnore {
				return nil, o, fmt.Errorf("%w: parameter %s: want %q (or leave it out), got %q", drivers.ErrBadParameter, k, paramIgnore, v)
			}
			if k == ParamMaintenanceWindow {
				o.ignoreWindow = true
			} else {
				o.ignoreGates = true
			}
		default:
			out[k] = v
		}
	}
	return out, o, nil
}

// disruptive reports whether a plan has a disruptive step: only such an
// event waits for a window and for the gates (an uncordon never does).
func disruptive(steps []drivers.Step) bool {
	for _, s := range steps {
		if s.Disruptive {
			return true
		}
	}
	return false
}

// gatePassValid is how long a pass of the gates stands.
const gatePassValid = 10 * time.Second

// gateRecheck is the back-off between evaluations of blocked gates: 10 s,
// doubling to 2 minutes; a pass resets it.
func gateRecheck(fails int) time.Duration {
	return min(10*time.Second<<min(fails-1, 4), 2*time.Minute)
}

// startWait says why ev may not start now ("" when it may): outside every
// maintenance window, or held by a gate. It runs before the disruption slot
// and the claim, so a waiting event holds no slot and its sla does not run.
// The gates are evaluated on a back-off; between evaluations their last
// blockers stand, and a pass stands for gatePassValid.
func (e *Engine) startWait(ctx context.Context, ev *v1alpha1.LifecycleEvent, steps []drivers.Step, o startOpts, now time.Time) (msg, reason string) {
	if !disruptive(steps) {
		return "", ""
	}
	if !o.ignoreWindow {
		if msg := e.cfg.Windows.Wait(now); msg != "" {
			return msg, ReasonMaintenanceWindow
		}
	}
	if o.ignoreGates || len(e.cfg.Gates) == 0 {
		return "", ""
	}
	if !now.Before(e.gateNext) {
		e.gateBlockers = maintenance.Blockers(ctx, e.cfg.Gates)
		if len(e.gateBlockers) == 0 {
			// A pass stands for gatePassValid: an event that goes on to
			// wait for a disruption slot (polled every 2 s) does not query
			// Prometheus or run the command at each poll.
			e.gateFails = 0
			e.gateNext = now.Add(gatePassValid)
		} else {
			e.gateFails++
			e.gateNext = now.Add(gateRecheck(e.gateFails))
			e.log.Info("gates block", "event", ev.Name, "blockers", strings.Join(e.gateBlockers, "; "), "recheck", e.gateNext.Sub(now))
		}
	}
	if len(e.gateBlockers) == 0 {
		return "", ""
	}
	return "waiting for gates: " + strings.Join(e.gateBlockers, "; "), causeOf(ev)
}
