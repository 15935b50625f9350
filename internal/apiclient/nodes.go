package apiclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// NodeCondition is one condition the agent sets on its Node.
type NodeCondition struct {
	Type    string
	Status  corev1.ConditionStatus
	Reason  string
	Message string
}

// ErrCordonNotOurs is returned by Uncordon when someone else cordoned the node.
var ErrCordonNotOurs = errors.New("apiclient: node was cordoned by someone else")

// GetNode returns this node.
func (c *Client) GetNode(ctx context.Context) (*corev1.Node, error) {
	n, err := c.Core.CoreV1().Nodes().Get(ctx, c.Node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("apiclient: get node %s: %w", c.Node, err)
	}
	return n, nil
}

// SetNodeConditions writes conds on nodes/status with a strategic-merge patch
// keyed by condition type: conditions of other types (the kubelet's) are
// left alone. lastTransitionTime changes only when a status changes. It is a
// no-op (no write) when nothing would change.
//
// The Node's conditions are compared with what the client's last patch
// returned (only this agent writes its condition types), so a change costs
// one request; the first call reads the Node.
func (c *Client) SetNodeConditions(ctx context.Context, now time.Time, conds ...NodeCondition) error {
	c.condMu.Lock()
	known := c.nodeConds
	c.condMu.Unlock()
	if known == nil {
		node, err := c.GetNode(ctx)
		if err != nil {
			return err
		}
		known = node.Status.Conditions
	}
	existing := map[string]corev1.NodeCondition{}
	for _, nc := range known {
		existing[string(nc.Type)] = nc
	}
	var out []map[string]any
	for _, want := range conds {
		old, had := existing[want.Type]
		if had && old.Status == want.Status && old.Reason == want.Reason && old.Message == want.Message {
			continue
		}
		transition := metav1.NewTime(now)
		if had && old.Status == want.Status {
			transition = old.LastTransitionTime
		}
		out = append(out, map[string]any{
			"type": want.Type, "status": want.Status, "reason": want.Reason, "message": want.Message,
			"lastHeartbeatTime": metav1.NewTime(now), "lastTransitionTime": transition,
		})
	}
	if len(out) == 0 {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": out}})
	got, err := c.Core.CoreV1().Nodes().Patch(ctx, c.Node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		c.condMu.Lock()
		c.nodeConds = nil // read again next time
		c.condMu.Unlock()
		return fmt.Errorf("apiclient: patch node %s conditions: %w", c.Node, err)
	}
	c.condMu.Lock()
	c.nodeConds = got.Status.Conditions
	c.condMu.Unlock()
	return nil
}

// Cordon marks the node unschedulable and records owner in the annotation
// lifecycle.x-k8s.io/cordoned-by, in one patch guarded by the node's
// resourceVersion. It reports whether the cordon is owner's: false when the
// node was already cordoned by someone else — another person, or the agent
// for another owner — and then nothing is written. It is idempotent: a node
// already cordoned for the same owner reports true.
func (c *Client) Cordon(ctx context.Context, owner string) (ours bool, err error) {
	ours, _, err = c.CordonMade(ctx, owner)
	return ours, err
}

// CordonMade is Cordon that also reports whether this call made the cordon
// (made) rather than finding the node already cordoned for owner.
func (c *Client) CordonMade(ctx context.Context, owner string) (ours, made bool, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e error
		ours, made, e = c.cordonOnce(ctx, owner)
		return e
	})
	return ours, made, err
}

func (c *Client) cordonOnce(ctx context.Context, owner string) (ours, made bool, err error) {
	node, err := c.GetNode(ctx)
	if err != nil {
		return false, false, err
	}
	if node.Spec.Unschedulable {
		return node.Annotations[v1alpha1.AnnotationCordonedBy] == owner, false, nil
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion, "annotations": map[string]any{v1alpha1.AnnotationCordonedBy: owner}},
		"spec":     map[string]any{"unschedulable": true},
	})
	if _, err := c.Core.CoreV1().Nodes().Patch(ctx, c.Node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return false, false, err // retried with a fresh read
		}
		return false, false, fmt.Errorf("apiclient: cordon node %s: %w", c.Node, err)
	}
	return true, true, nil
}

// CordonOwner returns the value of the ownership annotation ("" if none)
// and whether the node is unschedulable.
func (c *Client) CordonOwner(ctx context.Context) (owner string, cordoned bool, err error) {
	node, err := c.GetNode(ctx)
	if err != nil {
		return "", false, err
	}
	return node.Annotations[v1alpha1.AnnotationCordonedBy], node.Spec.Unschedulable, nil
}

// Uncordon makes the node schedulable again and removes the ownership
// annotation, but only when the cordon is ours (the annotation is present,
// and equals owner unless owner is empty) or force is set. A node that is
// not cordoned is left as it is. It returns ErrCordonNotOurs otherwise.
func (c *Client) Uncordon(ctx context.Context, owner string, force bool) (changed bool, err error) {
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e error
		changed, e = c.uncordonOnce(ctx, owner, force)
		return e
	})
	return changed, err
}

func (c *Client) uncordonOnce(ctx context.Context, owner string, force bool) (changed bool, err error) {
	node, err := c.GetNode(ctx)
	if err != nil {
		return false, err
	}
	by, annotated := node.Annotations[v1alpha1.AnnotationCordonedBy]
	if !node.Spec.Unschedulable {
		if annotated {
			// A stale annotation (someone uncordoned by hand): drop it.
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.AnnotationCordonedBy: nil}}})
			_, err := c.Core.CoreV1().Nodes().Patch(ctx, c.Node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return false, err
		}
		return false, nil
	}
	if !force && (!annotated || (owner != "" && by != owner)) {
		if annotated {
			return false, fmt.Errorf("%w (cordoned for %q, not %q)", ErrCordonNotOurs, by, owner)
		}
		return false, ErrCordonNotOurs
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion, "annotations": map[string]any{v1alpha1.AnnotationCordonedBy: nil}},
		"spec":     map[string]any{"unschedulable": false},
	})
	if _, err := c.Core.CoreV1().Nodes().Patch(ctx, c.Node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return false, err // retried with a fresh read
		}
		return false, fmt.Errorf("apiclient: uncordon node %s: %w", c.Node, err)
	}
	return true, nil
}

// NodeReady reports whether the kubelet reports the Node Ready in this
// boot. When bootID is set and the Node carries a boot ID
// (status.nodeInfo.bootID, which every kubelet reports), the two must
// match: right after a reboot the Node still shows the previous boot's
// Ready=True until the node lifecycle controller marks it Unknown (40 s by
// default) — longer than a fast reboot — so Ready alone would let the agent
// uncordon before this boot's kubelet is up. A Node without a boot ID has
// no kubelet reporting one (a test stand-in): Ready alone decides.
func (c *Client) NodeReady(ctx context.Context, bootID string) (bool, error) {
	node, err := c.GetNode(ctx)
	if err != nil {
		return false, err
	}
	return ReadyInBoot(node, bootID), nil
}

// ReadyInBoot is NodeReady's judgement of a Node object.
func ReadyInBoot(node *corev1.Node, bootID string) bool {
	if bootID != "" && node.Status.NodeInfo.BootID != "" && node.Status.NodeInfo.BootID != bootID {
		return false
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// NodePods lists the pods bound to this node (a field selector on
// spec.nodeName, which the Node authorizer allows a node's identity).
func (c *Client) NodePods(ctx context.Context) ([]corev1.Pod, error) {
	l, err := c.Core.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.Node})
	if err != nil {
		return nil, fmt.Errorf("apiclient: list pods on %s: %w", c.Node, err)
	}
	return l.Items, nil
}
