package apiclient

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// RecordEvent creates a Kubernetes Event on a LifecycleEvent (in namespace
// default, as for other cluster-scoped objects). eventType is Normal or
// Warning; reason is CamelCase.
func (c *Client) RecordEvent(ctx context.Context, ev *v1alpha1.LifecycleEvent, eventType, reason, message string, now time.Time) error {
	t := metav1.NewTime(now)
	k := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: ev.Name + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "LifecycleEvent",
			Name: ev.Name, UID: ev.UID, ResourceVersion: ev.ResourceVersion,
		},
		Reason: reason, Message: message, Type: eventType,
		Source:         corev1.EventSource{Component: "lifecycle-agent", Host: c.Node},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
		ReportingController: "lifecycle-agent.x-k8s.io/agent", ReportingInstance: c.Node,
	}
	if _, err := c.Core.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, k, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("apiclient: record event on %s: %w", ev.Name, err)
	}
	return nil
}

// RecordNodeEvent creates a Kubernetes Event on this Node (in namespace
// default, where the kubelet records the Node's), as
// `kubectl events --for node/<name>` shows it.
func (c *Client) RecordNodeEvent(ctx context.Context, eventType, reason, message string, now time.Time) error {
	t := metav1.NewTime(now)
	k := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: c.Node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: c.Node},
		Reason:         reason, Message: message, Type: eventType,
		Source:         corev1.EventSource{Component: "lifecycle-agent", Host: c.Node},
		FirstTimestamp: t, LastTimestamp: t, Count: 1,
		ReportingController: "lifecycle-agent.x-k8s.io/agent", ReportingInstance: c.Node,
	}
	if _, err := c.Core.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, k, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("apiclient: record event on node %s: %w", c.Node, err)
	}
	return nil
}
