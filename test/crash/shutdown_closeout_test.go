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
func TestShutdownAnnouncedDuringTheCloseOutsConditions(t *testing.T) {
	ctx := context.Background()
	node := "closeout-race"
	kubelet := chaosNode(t, node)
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	logind := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	c := chaosCase(t, node, "", agentConfig+"shutdown:\n  budget: 10s\n", env.NodeConfig(node))
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
	a2 := c.start(t, `engineCloseOutBeforeConditions=1*sleep(1000)`)
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
	waitFor(t, "the new shutdown prepared and the old one closed out", 30*time.Second, a2, func() bool {
		l := a2.logText()
		return strings.Contains(l, "shutdown prepared") && strings.Contains(l, "shutdown closed out")
	})
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
}
