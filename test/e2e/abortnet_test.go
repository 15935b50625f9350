package e2e

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// unplugDriver cordons, then fails a step and unplugs the node's network
// as it fails, for unplugFor: its abort (an Abortable's, as os-upgrade's)
// meets "network is unreachable", as an os-upgrade's verify did in the VM
// when it ran right after the boot, before the network was up.
type unplugDriver struct {
	proxy  *testenv.CutProxy
	aborts atomic.Int32
}

const unplugFor = 4 * time.Second

func (d *unplugDriver) Name() string       { return "e2e.lifecycle-agent.x-k8s.io/unplug" }
func (d *unplugDriver) Short() string      { return "unplug" }
func (d *unplugDriver) Start() string      { return "UnplugStarted" }
func (d *unplugDriver) End() string        { return "UnplugComplete" }
func (d *unplugDriver) SLA() time.Duration { return 10 * time.Minute }

func (d *unplugDriver) Plan(map[string]string) ([]drivers.Step, error) {
	return []drivers.Step{
		{Name: "cordon", NeedsAPI: true, Run: func(ctx context.Context, rt drivers.Runtime) error {
			if err := rt.Own(drivers.Change{Kind: "cordon", Key: rt.Node()}); err != nil {
				return err
			}
			_, err := rt.API().Cordon(ctx, rt.EventName())
			return err
		}},
		{Name: "verify", Run: func(ctx context.Context, rt drivers.Runtime) error {
			d.proxy.Unplug()
			time.AfterFunc(unplugFor, d.proxy.Heal)
			return errors.New("the target was not reached")
		}},
	}, nil
}

func (d *unplugDriver) Abort(ctx context.Context, rt drivers.Runtime) error {
	d.aborts.Add(1)
	cordon := drivers.Change{Kind: "cordon", Key: rt.Node()}
	if _, err := rt.API().Uncordon(ctx, rt.EventName(), false); err != nil && !errors.Is(err, apiclient.ErrCordonNotOurs) {
		return err
	}
	if rt.Owns(cordon) {
		return rt.Disown(cordon)
	}
	return nil
}

// A driver's abort that meets the node's own network down ("connect:
// network is unreachable") is retried until the network is back: the node
// is uncordoned and the event's message is the step's failure alone.
// Before, the abort gave up at once and the node stayed cordoned by an
// event that had ended.
func TestAbortRetriedWhileNetworkUnreachable(t *testing.T) {
	node := "unplug-node"
	newNode(t, node)
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	d := &unplugDriver{proxy: proxy}
	a := startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{d}, rest: proxy.Unpluggable(env.NodeConfig(node))})
	tn := transitionName(node, "unplug")
	waitTransition(t, tn)
	createEvent(t, "unplug-1", node, tn, nil, nil)
	ev := waitEvent(t, "unplug-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "the target was not reached") || strings.Contains(ev.Status.Message, "abort:") {
		t.Fatalf("event ended %s: %q; want Failed with the step's failure and nothing the abort left undone\nagent log:\n%s", ev.Status.ClaimStatus, ev.Status.Message, a.logBuf.String())
	}
	n := getNode(t, node)
	if n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
		t.Fatalf("node left cordoned (unschedulable=%v, cordoned-by %q) after the abort", n.Spec.Unschedulable, n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
	if got := d.aborts.Load(); got < 2 {
		t.Fatalf("the abort ran %d times; want it retried while the network was unreachable", got)
	}
	a.stop(t)
	if doc := exportJournal(t, a.Journal); len(doc.Owned) != 0 {
		t.Fatalf("the journal still owns %+v", doc.Owned)
	}
}
