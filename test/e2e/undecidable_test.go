package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
)

// undecidableDriver has one step that runs until stopped and whose replay
// in a later boot cannot tell whether it took effect (as os-upgrade's
// upgrade without a profile check after a power cut).
type undecidableDriver struct{ runs atomic.Int32 }

func (d *undecidableDriver) Name() string       { return "e2e.lifecycle-agent.x-k8s.io/undecidable" }
func (d *undecidableDriver) Short() string      { return "undecidable" }
func (d *undecidableDriver) Start() string      { return "ActStarted" }
func (d *undecidableDriver) End() string        { return "ActComplete" }
func (d *undecidableDriver) SLA() time.Duration { return 10 * time.Minute }

func (d *undecidableDriver) Plan(map[string]string) ([]drivers.Step, error) {
	return []drivers.Step{{Name: "act", Disruptive: true,
		Run: func(ctx context.Context, rt drivers.Runtime) error {
			d.runs.Add(1)
			<-ctx.Done()
			return ctx.Err()
		},
		Done: func(_ context.Context, rt drivers.Runtime, intentBootID string) (bool, error) {
			if intentBootID != rt.BootID() {
				return false, fmt.Errorf("%w: the node went down while act ran", drivers.ErrUndecidable)
			}
			return false, nil
		},
	}}, nil
}

// A step whose replay says it cannot tell (drivers.ErrUndecidable) is not
// run again: the event fails with the step's own explanation.
func TestReplayUndecidableStepFails(t *testing.T) {
	node := "undecidable-node"
	newNode(t, node)
	d := &undecidableDriver{}
	a := startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{d}})
	tn := transitionName(node, "undecidable")
	waitTransition(t, tn)
	createEvent(t, "undecidable-1", node, tn, nil, nil)
	lc := clients(t, env.AdminConfig())
	waitFor(t, "step act running", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "undecidable-1", metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "act" && d.runs.Load() == 1
	})
	a.stop(t)
	// The node went down and came back: a new boot.
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("5e0c1d2e-0000-4000-8000-0000000000aa\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{d}, dir: a.dir})
	ev := waitEvent(t, "undecidable-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "step act failed: cannot tell whether the step took effect: the node went down while act ran") {
		t.Fatalf("event ended %s: %q; want Failed with the step's explanation", ev.Status.ClaimStatus, ev.Status.Message)
	}
	var act *v1alpha1.StepStatus
	for i := range ev.Status.Steps {
		if ev.Status.Steps[i].Name == "act" {
			act = &ev.Status.Steps[i]
		}
	}
	if act == nil || act.State != v1alpha1.StepFailed || act.Attempt != 1 || act.StartTime == nil {
		t.Errorf("step act: %+v; want Failed, attempt 1, with the start of the attempt it ends", act)
	}
	if n := d.runs.Load(); n != 1 {
		t.Errorf("the step ran %d times; a replay that cannot tell must not run it again", n)
	}
}
