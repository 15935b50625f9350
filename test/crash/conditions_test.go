package crash

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// The Node conditions of a gpu-reset with drain=true, by the real agent on
// go-nvml's mock of a DGX H100 (the failpoint build has the tag
// lifecycle_testnvml), in the order the API server stored them
// (docs/conditions.md): the drain is DrainInProgress then Drained, the
// reset MaintenanceInProgress, the uncordon ends Drained.
func TestGPUResetConditions(t *testing.T) {
	ctx := context.Background()
	admin := env.AdminConfig()
	ensureSpare(t)
	node := "gpu-cond-node"
	kubelet := chaosNode(t, node)
	w := &testenv.Workload{Namespace: node, Name: "web", Node: node, Spare: spareNode, Replicas: replicas}
	if err := w.Start(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, admin, node, replicas); err != nil {
		t.Fatal(err)
	}
	c := chaosCase(t, node, "gpu-cond", chaosConfig, env.NodeConfig(node))
	c.kubelet = kubelet
	c.extraEnv = append(c.extraEnv, "LIFECYCLE_AGENT_TEST_NVML=dgxh100")
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	rec := testenv.RecordConditions(t, admin, node)
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	tn := node + "-gpu-reset"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	m := rec.Mark()
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: node, Parameters: map[string]string{"gpus": "0", "drain": "true"}}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the gpu-reset to end", 2*time.Minute, a, func() bool {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && got.Status.CompletionTime != nil
	})
	got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("gpu-reset ended %s: %s", got.Status.ClaimStatus, got.Status.Message)
	}
	const (
		lt, dip, drained = v1alpha1.NodeConditionLifecycleTransition, v1alpha1.NodeConditionDrainInProgress, v1alpha1.NodeConditionDrained
		planned, mip     = v1alpha1.NodeConditionMaintenancePlanned, v1alpha1.NodeConditionMaintenanceInProgress
	)
	rec.Expect(t, m, []string{
		lt + "=True/GPUResetStarted", dip + "=True/AdminRequested",
		dip + "=False/DrainCompleted", drained + "=True/DrainCompleted",
		mip + "=True/AdminRequested", drained + "=False/ReturnedToService",
		mip + "=False/MaintenanceCompleted", lt + "=False/GPUResetComplete",
	}, planned)
}
