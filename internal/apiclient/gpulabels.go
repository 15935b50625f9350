package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Verbs of the gpu-reset driver for the NVIDIA GPU Operator's per-node
// deploy labels (drivers.GPUOperatorAPI). As system:node:<name>, the agent
// may patch its own Node's labels outside the kubernetes.io and k8s.io
// namespaces (NodeRestriction), and list the pods bound to it; see
// test/e2e/gpulabels_test.go.

// NodeLabels returns this Node's labels.
func (c *Client) NodeLabels(ctx context.Context) (map[string]string, error) {
	n, err := c.GetNode(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(n.Labels))
	for k, v := range n.Labels {
		out[k] = v
	}
	return out, nil
}

// SetNodeLabels sets (or, for a nil value, removes) labels on this Node in
// one merge patch; other labels are left alone.
func (c *Client) SetNodeLabels(ctx context.Context, labels map[string]*string) error {
	if len(labels) == 0 {
		return nil
	}
	m := make(map[string]any, len(labels))
	for k, v := range labels {
		if v == nil {
			m[k] = nil
		} else {
			m[k] = *v
		}
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": m}})
	if err != nil {
		return err
	}
	if _, err := c.Core.CoreV1().Nodes().Patch(ctx, c.Node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("apiclient: patch node %s labels: %w", c.Node, err)
	}
	return nil
}

// PodsSelectingLabels lists, as namespace/name, the pods bound to this
// node that have not finished and whose spec.nodeSelector names one of
// keys: the GPU Operator's DaemonSet pods carry nodeSelector
// nvidia.com/gpu.deploy.<component>: "true".
func (c *Client) PodsSelectingLabels(ctx context.Context, keys []string) ([]string, error) {
	pods, err := c.Core.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.Node})
	if err != nil {
		return nil, fmt.Errorf("apiclient: list pods on %s: %w", c.Node, err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, k := range keys {
			if _, ok := p.Spec.NodeSelector[k]; ok {
				out = append(out, p.Namespace+"/"+p.Name)
				break
			}
		}
	}
	sort.Strings(out)
	return out, nil
}
