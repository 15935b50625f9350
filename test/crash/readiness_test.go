package crash

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// TestReadinessWaitAcrossCrash: the real agent reboots a node (simulated
// host) whose 8 nvidia.com/gpu are not re-registered after the reboot; it
// waits before the uncordon, naming them, and is SIGKILLed during that
// wait. Restarted, it resumes the wait against the snapshot journaled at
// claim — not one re-read now, which would see 0 GPUs and pass at once —
// and the event ends Succeeded, uncordoned, only once the GPUs are back.
func TestReadinessWaitAcrossCrash(t *testing.T) {
	ctx := context.Background()
	admin := env.AdminConfig()
	node := "ready-crash"
	kubelet := chaosNode(t, node)
	cs := kubernetes.NewForConfigOrDie(admin)
	setGPUs := func(n int64) {
		t.Helper()
		if err := testenv.SetAllocatable(ctx, admin, node, "nvidia.com/gpu", n); err != nil {
			t.Fatal(err)
		}
	}
	setReady := func(ready bool) {
		t.Helper()
		if err := testenv.SetNodeReady(ctx, admin, node, ready); err != nil {
			t.Fatal(err)
		}
	}
	// A DaemonSet with its pod on the node (the stand-in makes it Ready).
	if _, err := testenv.CreateDaemonSetPod(ctx, admin, node, "plugin", node, "lifecycle.test/pause:1"); err != nil {
		t.Fatal(err)
	}
	setGPUs(8)
	c := chaosCase(t, node, node+"-reboot", agentConfig+"readiness:\n  timeout: 5m\n", env.NodeConfig(node))
	c.kubelet = kubelet
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	a := c.start(t, "")
	tn := node + "-reboot"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	// NotReady from here: the event stops at wait-ready after the reboot.
	setReady(false)
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: node}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := func() string {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if err != nil {
			return "error: " + err.Error()
		}
		return string(got.Status.ClaimStatus) + ": " + got.Status.Message + " [" + stepStates(got) + "]"
	}
	waitFor(t, "the reboot done, waiting for Ready", time.Minute, a, func() bool { return strings.Contains(msg(), "reboot=Done") }, msg)
	setGPUs(0)
	setReady(true)
	const missing = "allocatable nvidia.com/gpu is 0 of 8"
	waitFor(t, "the wait naming the GPUs", time.Minute, a, func() bool { return strings.Contains(msg(), missing) }, msg)
	a.kill()
	cordoned := func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Spec.Unschedulable
	}
	if !cordoned() {
		t.Fatal("the node is not cordoned while the agent waits for the GPUs")
	}
	a = c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	// The restarted agent waits again (it has 5 s to wrongly pass).
	time.Sleep(5 * time.Second)
	if m := msg(); !strings.HasPrefix(m, "Claimed") || !cordoned() {
		t.Fatalf("after the restart, with the GPUs still missing: %s (cordoned %v); want the wait resumed against the claim-time snapshot", m, cordoned())
	}
	waitFor(t, "the restarted agent naming the GPUs", time.Minute, a, func() bool { return strings.Contains(msg(), missing) }, msg)
	setGPUs(8)
	waitFor(t, "the reboot to succeed", time.Minute, a, func() bool { return strings.HasPrefix(msg(), "Succeeded") }, msg)
	if m := msg(); !strings.Contains(m, "wait-workloads-ready=Done,uncordon=Done") {
		t.Errorf("steps: %s", m)
	}
	if cordoned() {
		t.Error("the node is still cordoned after the event succeeded")
	}
}
