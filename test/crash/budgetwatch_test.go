package crash

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// TestDrainHeldAcrossWatchRestarts: a drain held by a PodDisruptionBudget
// that never frees (minAvailable 1 of 1) sends evictions only on its
// back-off (1 s doubling), whatever happens to its watches. The agent runs
// with apiTimeout 2s: before, the drain's budget and pod watches went
// through the client with that timeout, were cut every 2 s, and each cut
// woke the held pod to send an eviction at once — refused, a status write
// each. The drain ends at drain.timeout naming the budget, nothing is
// evicted past it, and the node is uncordoned.
func TestDrainHeldAcrossWatchRestarts(t *testing.T) {
	ctx := context.Background()
	admin := env.AdminConfig()
	node := "pdb-flap"
	kubelet := chaosNode(t, node)
	w := &testenv.Workload{Namespace: node, Name: "web", Node: node, Spare: "", Replicas: 1, MinAvailable: 1}
	if err := w.Start(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, admin, node, 1); err != nil {
		t.Fatal(err)
	}
	cfg := "logLevel: debug\neventRetention: 1h\napiTimeout: 2s\ndrain:\n  evictRetryDelay: 30s\n  timeout: 12s\n"
	c := chaosCase(t, node, node+"-drain-1", cfg, env.NodeConfig(node))
	c.kubelet = kubelet
	lc, a := startDrainAgent(t, c)
	defer func() { _ = a.stop(30 * time.Second) }()
	// Every status the event shows that names the held pod: one per
	// reason, not one per refusal.
	wa, err := lc.Events.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + c.event})
	if err != nil {
		t.Fatal(err)
	}
	defer wa.Stop()
	var notes []string
	notesDone := make(chan struct{})
	go func() {
		defer close(notesDone)
		for e := range wa.ResultChan() {
			// A change of message, not every version (another field of the
			// status may change under the same message).
			if ev, ok := e.Object.(*v1alpha1.LifecycleEvent); ok && strings.HasPrefix(ev.Status.Message, "eviction of pod") &&
				(len(notes) == 0 || notes[len(notes)-1] != ev.Status.Message) {
				notes = append(notes, ev.Status.Message)
			}
			if ev, ok := e.Object.(*v1alpha1.LifecycleEvent); ok && ev.Status.CompletionTime != nil {
				return
			}
		}
	}()
	got := runDrain(t, lc, c, a)
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(got.Status.Message, "timeout") ||
		!strings.Contains(got.Status.Message, "disruption budget") {
		t.Errorf("drain ended %s: %q; want Failed at its timeout naming the disruption budget", got.Status.ClaimStatus, got.Status.Message)
	}
	select {
	case <-notesDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the test's watch of the event did not see it end")
	}
	if len(notes) == 0 || len(notes) > 2 {
		t.Errorf("%d status messages naming the held pod, want 1 or 2 (held back, then refused; a repeated refusal is not news):\n%s", len(notes), strings.Join(notes, "\n"))
	}
	evs, err := auditEvictions(node)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.accepted) != 0 {
		t.Errorf("evicted past the budget: %v", evs.accepted)
	}
	// The back-off sends at about 1, 3 and 7 s into the 12 s drain; a cut
	// watch every 2 s added one more each time.
	if evs.refused == 0 || evs.refused > 4 {
		t.Errorf("%d evictions refused in a 12 s drain held by a budget that never frees; want 1 to 4 (the back-off's)", evs.refused)
	}
	t.Logf("evictions refused: %d", evs.refused)
	waitFor(t, "the node uncordoned", 30*time.Second, a, func() bool {
		n, err := kubernetes.NewForConfigOrDie(admin).CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && !n.Spec.Unschedulable
	})
}

// TestDrainWaitsForTerminatingPod: a pod already terminating when a drain
// starts — evicted or deleted before the agent was killed, or before a
// power cut, and still in its grace period — is waited for, not evicted
// again (the API server accepts a second eviction of a terminating pod,
// pointlessly: found by test/vm TestRealNode/PowerCutMidDrain). The other
// pods are evicted once each and the drain succeeds once the terminating
// one is gone.
func TestDrainWaitsForTerminatingPod(t *testing.T) {
	ctx := context.Background()
	admin := env.AdminConfig()
	ensureSpare(t)
	node := "drain-terminating"
	kubelet := chaosNode(t, node)
	w := &testenv.Workload{Namespace: node, Name: "web", Node: node, Spare: spareNode, Replicas: 3}
	if err := w.Start(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, admin, node, 3); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	pods, err := cs.CoreV1().Pods(node).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 3 {
		t.Fatalf("pods on %s: %v %v", node, pods, err)
	}
	stopping := pods.Items[0].Name
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"8s"}}}`, testenv.AnnotationTerminateAfter)
	if _, err := cs.CoreV1().Pods(node).Patch(ctx, stopping, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	grace := int64(30)
	if err := cs.CoreV1().Pods(node).Delete(ctx, stopping, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	c := chaosCase(t, node, node+"-drain-1", agentConfig, env.NodeConfig(node))
	c.kubelet = kubelet
	lc, a := startDrainAgent(t, c)
	defer func() { _ = a.stop(30 * time.Second) }()
	if p, err := cs.CoreV1().Pods(node).Get(ctx, stopping, metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("pod %s is not terminating when the drain starts (%v): the test's premise", stopping, err)
	}
	got := runDrain(t, lc, c, a)
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("drain ended %s: %q", got.Status.ClaimStatus, got.Status.Message)
	}
	evs, err := auditEvictions(node)
	if err != nil {
		t.Fatal(err)
	}
	if n := evs.accepted[stopping]; n != 0 {
		t.Errorf("the terminating pod %s was evicted %d time(s); want it waited for", stopping, n)
	}
	for _, p := range pods.Items[1:] {
		if n := evs.accepted[p.Name]; n != 1 {
			t.Errorf("pod %s evicted %d time(s), want once", p.Name, n)
		}
	}
	if f := kubelet.Finished()[node+"/"+stopping]; f != 1 {
		t.Errorf("the terminating pod finished %d time(s), want once (after its 8 s)", f)
	}
}

// startDrainAgent starts the case's agent and waits for its drain
// transition.
func startDrainAgent(t *testing.T, c *crashCase) (*apiclient.LifecycleClients, *agentProc) {
	t.Helper()
	lc, err := apiclient.NewLifecycleClients(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	a := c.start(t, "")
	waitFor(t, "the drain transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(context.Background(), c.node+"-drain", metav1.GetOptions{})
		return err == nil
	})
	return lc, a
}

// runDrain creates the case's drain event and waits (up to 2 minutes)
// until it has ended.
func runDrain(t *testing.T, lc *apiclient.LifecycleClients, c *crashCase, a *agentProc) *v1alpha1.LifecycleEvent {
	t.Helper()
	ctx := context.Background()
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: c.node + "-drain", BindingNode: c.node}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *v1alpha1.LifecycleEvent
	waitFor(t, "the drain to end", 2*time.Minute, a, func() bool {
		var err error
		got, err = lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && got.Status.CompletionTime != nil
	})
	return got
}
