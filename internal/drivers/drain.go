package drivers

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// Drain is lifecycle-agent.x-k8s.io/drain: DrainStarted → DrainComplete.
// Steps: cordon (recording that the cordon is ours), evict through the
// Eviction API honouring PDBs, wait until no evictable pod is left.
// Parameters: gracePeriodSeconds (-1..86400, default -1: the pods' own),
// deleteEmptyDirData (bool), podSelector (a label selector).
type Drain struct {
	// RetryDelay between PDB-refused evictions.
	RetryDelay time.Duration
	// Timeout bounds the evictions (config drain.timeout); 0: none but the sla.
	Timeout time.Duration
}

// DrainTiming is the config's drain.evictRetryDelay and drain.timeout.
type DrainTiming struct {
	RetryDelay time.Duration
	Timeout    time.Duration // 0: no limit of its own
}

func (Drain) Name() string       { return Prefix + "drain" }
func (Drain) Short() string      { return "drain" }
func (Drain) Start() string      { return "DrainStarted" }
func (Drain) End() string        { return "DrainComplete" }
func (Drain) SLA() time.Duration { return time.Hour }

// DrainOptionsFrom validates the drain parameters.
func DrainOptionsFrom(m map[string]string, timing DrainTiming, known ...string) (apiclient.DrainOptions, error) {
	p := newParams(m, append([]string{"gracePeriodSeconds", "deleteEmptyDirData", "podSelector"}, known...)...)
	o := apiclient.DrainOptions{
		GracePeriodSeconds: p.int("gracePeriodSeconds", -1, -1, 86400),
		DeleteEmptyDirData: p.bool("deleteEmptyDirData", false),
		PodSelector:        p.str("podSelector", ""),
		RetryDelay:         timing.RetryDelay,
		Timeout:            timing.Timeout,
	}
	if o.PodSelector != "" {
		if _, err := labels.Parse(o.PodSelector); err != nil {
			p.errs = append(p.errs, fmt.Errorf("%w: parameters.podSelector: %v", ErrBadParameter, err))
		}
	}
	return o, p.err()
}

func (d Drain) Plan(m map[string]string) ([]Step, error) {
	o, err := DrainOptionsFrom(m, DrainTiming{d.RetryDelay, d.Timeout})
	if err != nil {
		return nil, err
	}
	return DrainSteps(o), nil
}

// DrainSteps are the cordon, evict and wait steps, shared with the drivers
// that drain first (reboot, os-upgrade, gpu-reset).
func DrainSteps(o apiclient.DrainOptions) []Step {
	return []Step{
		{Name: "cordon", NeedsAPI: true, Disruptive: true, Cordons: true, Run: cordonStep},
		{Name: "evict", NeedsAPI: true, Disruptive: true, Run: func(ctx context.Context, rt Runtime) error {
			o := o
			o.OnBlocked = rt.Progress
			o.OnEvicted = func(pod string) { rt.Progress("evicted " + pod) }
			res, err := rt.API().Drain(ctx, o)
			if err != nil {
				return err
			}
			msg := fmt.Sprintf("evicted %d pods", len(res.Evicted))
			if res.Warnings != "" {
				msg += "; " + strings.ReplaceAll(res.Warnings, "\n", " ")
			}
			rt.Progress(msg)
			return nil
		}},
		{Name: "wait-empty", NeedsAPI: true, Run: func(ctx context.Context, rt Runtime) error {
			left, err := rt.API().PodsLeft(ctx, o)
			if err != nil {
				return err
			}
			if len(left) > 0 {
				return fmt.Errorf("%d pods still on the node: %s", len(left), strings.Join(left, ", "))
			}
			return nil
		}},
	}
}

// cordonStep cordons and records the cordon as ours. The change is owned
// (journaled) before the API call, so a crash in between is undone too; an
// existing cordon by someone else is left alone and not owned.
func cordonStep(ctx context.Context, rt Runtime) error {
	ch := Change{Kind: "cordon", Key: rt.Node()}
	if err := rt.Own(ch); err != nil {
		return err
	}
	ours, err := rt.API().Cordon(ctx, rt.EventName())
	if err != nil {
		return err
	}
	if !ours {
		// Whose, for the message: a read only on this rare path.
		if owner, _, err := rt.API().CordonOwner(ctx); err == nil && owner != "" {
			rt.Progress(fmt.Sprintf("node was already cordoned by lifecycle-agent for %s; leaving that cordon in place: this event does not own it (an uncordon lifts it)", owner))
		} else {
			rt.Progress("node was already cordoned by someone else; leaving that cordon in place")
		}
		return rt.Disown(ch)
	}
	return nil
}

// Uncordon is lifecycle-agent.x-k8s.io/uncordon: Uncordoning →
// MaintenanceComplete. It uncordons only a cordon the agent made (the node
// carries lifecycle.x-k8s.io/cordoned-by), unless force=true.
type Uncordon struct{}

func (Uncordon) Name() string       { return Prefix + "uncordon" }
func (Uncordon) Short() string      { return "uncordon" }
func (Uncordon) Start() string      { return "Uncordoning" }
func (Uncordon) End() string        { return "MaintenanceComplete" }
func (Uncordon) SLA() time.Duration { return 10 * time.Minute }

func (Uncordon) Plan(m map[string]string) ([]Step, error) {
	p := newParams(m, "force")
	force := p.bool("force", false)
	if err := p.err(); err != nil {
		return nil, err
	}
	return []Step{{Name: "uncordon", NeedsAPI: true, Run: func(ctx context.Context, rt Runtime) error {
		changed, err := rt.API().Uncordon(ctx, "", force)
		if err != nil {
			if strings.Contains(err.Error(), "cordoned by someone else") {
				return fmt.Errorf("the node was cordoned by someone else, not by lifecycle-agent; set parameters.force=true to uncordon it anyway")
			}
			return err
		}
		if changed {
			rt.Progress("node uncordoned")
		} else {
			rt.Progress("node was not cordoned")
		}
		return rt.Disown(Change{Kind: "cordon", Key: rt.Node()})
	}}}, nil
}
