package apiclient

import (
	"context"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodsOnNode lists, as namespace/name, the pods bound to this node that
// have not finished and match the label selector (the blocking-pods gate).
func (c *Client) PodsOnNode(ctx context.Context, selector string) ([]string, error) {
	pods, err := c.Core.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + c.Node, LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("apiclient: list pods on %s matching %s: %w", c.Node, selector, err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}
