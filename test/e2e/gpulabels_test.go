package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// TestGPUOperatorLabelsAsTheNode checks, on the real kube-apiserver with
// Node,RBAC and NodeRestriction, what gpu-reset does to clear the GPU
// Operator from its node, as system:node:<name>: set its own
// nvidia.com/gpu.deploy.<component> labels to "false" and back, read them,
// and list the DaemonSet pods that select them; and that it cannot touch
// another Node's labels.
func TestGPUOperatorLabelsAsTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const node, other = "node-gpu-labels", "node-gpu-other"
	const dp = "nvidia.com/gpu.deploy.device-plugin"
	for _, n := range []string{node, other} {
		if err := testenv.CreateNode(ctx, env.NodeConfig(n), n, map[string]string{dp: "true", "nvidia.com/gpu.deploy.driver": "true"}); err != nil {
			t.Fatalf("create node %s: %v", n, err)
		}
	}
	c, err := apiclient.New(env.NodeConfig(node), node, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}

	// A GPU Operator DaemonSet pod bound to the node (created as admin, as
	// the DaemonSet controller would), and one that selects nothing of ours.
	admin := kubernetes.NewForConfigOrDie(env.AdminConfig())
	mk := func(name string, sel map[string]string) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system"},
			Spec: corev1.PodSpec{NodeName: node, NodeSelector: sel, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		deadline := time.After(60 * time.Second)
		for {
			_, err := admin.CoreV1().Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				return
			}
			// The default ServiceAccount appears when the controller
			// manager has started; retry until then.
			select {
			case <-deadline:
				t.Fatalf("create pod %s: %v", name, err)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	mk("nvidia-device-plugin-daemonset-x", map[string]string{dp: "true"})
	mk("unrelated", nil)

	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{name: "reads its own labels", run: func(t *testing.T) {
			got, err := c.NodeLabels(ctx)
			if err != nil || got[dp] != "true" {
				t.Fatalf("NodeLabels = %v, %v", got, err)
			}
		}},
		{name: "lists the pods selecting the deploy label", run: func(t *testing.T) {
			got, err := c.PodsSelectingLabels(ctx, []string{dp})
			if err != nil || len(got) != 1 || got[0] != "kube-system/nvidia-device-plugin-daemonset-x" {
				t.Fatalf("PodsSelectingLabels = %v, %v", got, err)
			}
		}},
		{name: "pauses and restores its own deploy label", run: func(t *testing.T) {
			off, on := "false", "true"
			if err := c.SetNodeLabels(ctx, map[string]*string{dp: &off}); err != nil {
				t.Fatalf("as system:node:%s, setting %s=false: %v", node, dp, err)
			}
			got, _ := c.NodeLabels(ctx)
			if got[dp] != "false" || got["nvidia.com/gpu.deploy.driver"] != "true" {
				t.Fatalf("after pausing: %v", got)
			}
			if err := c.SetNodeLabels(ctx, map[string]*string{dp: &on}); err != nil {
				t.Fatal(err)
			}
			if got, _ := c.NodeLabels(ctx); got[dp] != "true" {
				t.Fatalf("after restoring: %v", got)
			}
		}},
		{name: "cannot set another node's labels", run: func(t *testing.T) {
			oc, err := apiclient.New(env.NodeConfig(node), other, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			off := "false"
			if err := oc.SetNodeLabels(ctx, map[string]*string{dp: &off}); !apierrors.IsForbidden(err) {
				t.Fatalf("node %s patching %s's labels: %v, want Forbidden", node, other, err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.run)
	}
}
