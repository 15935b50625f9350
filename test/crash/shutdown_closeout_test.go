package crash

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
)

// TestShutdownAnnouncedDuringTheCloseOutsConditions: the node went down
// for a shutdown; at its next boot the agent closes that shutdown out,
// and logind announces a new one right after the close-out's uncordon,
// before its ShutdownComplete is posted (failpoint
// engineCloseOutBeforeConditions holds it there for a second). The Node
// must end as the new shutdown leaves it, cordoned and
// GracefulNodeShutdownInProgress=True: before, the close-out posted its
// ShutdownComplete (GracefulNodeShutdownInProgress=False) after the new
// shutdown's ShuttingDown, and the Node said the node was back while it
// went down.
//
// Past the budget: the close-out holds its turn (7 s) longer than the new
// shutdown's budget (2 s), as an uncordon on a slow API server would. The
// new shutdown posts its ShuttingDown without waiting, and cordons once
// the close-out's turn ends; the close-out then posts nothing (it would be
// older news) and waits for that shutdown to end. Before, the new
// shutdown made no cordon at all, and the close-out's ShutdownComplete,
// queued after its ShuttingDown, went out last.
func TestShutdownAnnouncedDuringTheCloseOutsConditions(t *testing.T) {
	for _, c := range []struct {
		name, budget, failpoint string
		pastBudget              bool
	}{
		{"within the budget", "10s", "engineCloseOutBeforeConditions=1*sleep(1000)", false},
		{"past the budget", "2s", "engineCloseOutBeforeConditions=1*sleep(7000)", true},
	} {
		t.Run(c.name, func(t *testing.T) { shutdownDuringTheCloseOut(t, c.budget, c.failpoint, c.pastBudget) })
	}
}

func shutdownDuringTheCloseOut(t *testing.T, budget, failpoint string, pastBudget bool) {
	ctx := context.Background()
	node := "closeout-race"
	if pastBudget {
		node = "closeout-late"
	}
	kubelet := chaosNode(t, node)
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	logind := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	c := chaosCase(t, node, "", agentConfig+"shutdown:\n  budget: "+budget+"\n", env.NodeConfig(node))
	c.kubelet = kubelet
	c.extraEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + logind.Address()}
	getNode := func() *corev1.Node {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	a := c.start(t, "")
	waitFor(t, "the agent's delay lock", 30*time.Second, a, func() bool { return heldDelay(logind) == 1 })
	if err := logind.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shutdown's cordon", 30*time.Second, a, func() bool { return getNode().Spec.Unschedulable })
	a.kill()

	// The next boot.
	if err := os.WriteFile(filepath.Join(c.dir, hostops.SimulatedBootIDFile), []byte("00000000-0000-4000-8000-00000000c105\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := logind.Close(); err != nil {
		t.Fatal(err)
	}
	logind = logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	c.extraEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=" + logind.Address()}
	a2 := c.start(t, failpoint)
	defer func() { _ = a2.stop(30 * time.Second) }()
	deadline := time.Now().Add(60 * time.Second)
	for getNode().Spec.Unschedulable {
		if time.Now().After(deadline) {
			t.Fatalf("the close-out did not uncordon within 60s:\n%s", tail(a2.log, 30))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if h := heldDelay(logind); h != 1 {
		t.Fatalf("%d delay locks held when the close-out uncordoned; want the agent's one (it watches logind)", h)
	}
	// Every GracefulNodeShutdownInProgress the Node shows from here on.
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for e := range w.ResultChan() {
			if n, ok := e.Object.(*corev1.Node); ok {
				if c := nodeCondition(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress); c != nil && (len(seen) == 0 || seen[len(seen)-1] != string(c.Status)+"/"+c.Reason) {
					seen = append(seen, string(c.Status)+"/"+c.Reason)
				}
			}
		}
	}()
	if err := logind.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	if !pastBudget {
		waitFor(t, "the new shutdown prepared and the old one closed out", 30*time.Second, a2, func() bool {
			l := a2.logText()
			return strings.Contains(l, "shutdown prepared") && strings.Contains(l, "shutdown closed out")
		})
	} else {
		waitFor(t, "the new shutdown prepared and the close-out's turn over", 30*time.Second, a2, func() bool {
			l := a2.logText()
			return strings.Contains(l, "shutdown prepared") &&
				(strings.Contains(l, "shutdown closed out") || strings.Contains(l, "closing out the last shutdown waits"))
		})
		// The cordon comes right after the close-out's turn.
		for deadline := time.Now().Add(5 * time.Second); !getNode().Spec.Unschedulable && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if l := a2.logText(); !strings.Contains(l, "past the shutdown budget") || !strings.Contains(l, "its end conditions left to the shutdown underway") {
			t.Errorf("the close-out did not leave its end conditions to the new shutdown, whose budget ran out:\n%s", tail(a2.log, 30))
		}
	}
	// Past the outbox's next turn (it looks at least every 5 s): a copy
	// of the close-out's conditions still queued would go out by then.
	time.Sleep(6 * time.Second)
	w.Stop()
	<-collected
	for i := 1; i < len(seen); i++ {
		if strings.HasPrefix(seen[i-1], "True/") && strings.HasPrefix(seen[i], "False/") {
			t.Errorf("GracefulNodeShutdownInProgress went back from %s to %s during the new shutdown (all seen: %v)", seen[i-1], seen[i], seen)
		}
	}
	n := getNode()
	lt := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
	gns := nodeCondition(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress)
	if lt == nil || gns == nil || lt.Status != corev1.ConditionTrue || gns.Status != corev1.ConditionTrue {
		t.Errorf("the Node during the new shutdown: LifecycleTransition %+v, GracefulNodeShutdownInProgress %+v; want both True (shutting down)", lt, gns)
	}
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Errorf("the node during the new shutdown: unschedulable=%v cordoned-by %q; want the new shutdown's cordon", n.Spec.Unschedulable, n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
	if !pastBudget {
		return
	}
	// logind cancels the new shutdown: the node is given back, and the
	// cancel is the last word (the earlier shutdown, closed out, does not
	// come back to say "shutting down" and "complete" after it).
	if err := logind.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancel's uncordon", 30*time.Second, a2, func() bool { return !getNode().Spec.Unschedulable })
	time.Sleep(6 * time.Second) // past the outbox's next turn
	n = getNode()
	lt = nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
	if n.Spec.Unschedulable || lt == nil || lt.Status != corev1.ConditionFalse || lt.Reason != "ShutdownCancelled" {
		t.Errorf("after the cancel: unschedulable=%v, LifecycleTransition %+v; want schedulable, False/ShutdownCancelled", n.Spec.Unschedulable, lt)
	}
}
