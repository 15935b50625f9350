package crash

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// TestRunningDeliveredBeforeReboot: a step with a Done check (the reboot)
// does not act before the API server has its Running. The journal's
// intent makes a replay ask before rebooting again; when the journal is
// lost, the status's Running is what does. Queued was not enough: the
// outbox is delivered asynchronously, and a real reboot went ahead of the
// delivery (the VM's power-cut scenario never saw the reboot step Running
// on the API), so a lost journal after it would have rebooted twice.
//
// Every status write is made 3 s slow (engineBeforeStatusWrite) and the
// agent dies right before the reboot step's action (the fourth step's
// engineBeforeSideEffect: cordon, evict, wait-empty, reboot). At the death
// the API server must show reboot=Running. Restarted on its journal, the
// agent ends the event Succeeded with one (simulated) reboot.
func TestRunningDeliveredBeforeReboot(t *testing.T) {
	ctx := context.Background()
	c, lc := rebootCase(t, "running-before-reboot")
	a := c.start(t, `engineBeforeStatusWrite=sleep(3000);engineBeforeSideEffect=3*off->panic("before the reboot")`)
	c.createReboot(t, lc, a)
	select {
	case <-a.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the agent did not reach the reboot's action in 2m:\n%s", tail(a.log, 40))
	}
	if l := a.logText(); !strings.Contains(l, "before the reboot") {
		t.Fatalf("the agent exited, but not at the armed failpoint:\n%s", tail(a.log, 40))
	}
	got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stepStates(got), "reboot=Running") {
		t.Fatalf("at the reboot's action the API server shows [%s]; want reboot=Running delivered before the step acts", stepStates(got))
	}

	b := c.start(t, "")
	defer func() { _ = b.stop(30 * time.Second) }()
	waitFor(t, "the event to succeed", 90*time.Second, b, func() bool {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && got.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded
	})
	reboots := 0
	for _, l := range c.logs {
		b, _ := os.ReadFile(l)
		reboots += strings.Count(string(b), logReboot)
	}
	if reboots != 1 {
		t.Errorf("%d simulated reboots for one event; want 1", reboots)
	}
}

// rebootCase is a node with a kubelet stand-in and its agent's set-up, and
// an admin client for its events.
func rebootCase(t *testing.T, node string) (*crashCase, *apiclient.LifecycleClients) {
	t.Helper()
	chaosNode(t, node)
	c := chaosCase(t, node, node+"-ev", agentConfig, env.NodeConfig(node))
	lc, err := apiclient.NewLifecycleClients(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c, lc
}

// createReboot creates the case's event, a reboot of its node, once agent
// a has published the node's reboot transition.
func (c *crashCase) createReboot(t *testing.T, lc *apiclient.LifecycleClients, a *agentProc) {
	t.Helper()
	ctx := context.Background()
	tn := c.node + "-reboot"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: c.node}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
