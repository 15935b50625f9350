package apiclient

import (
	"context"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// nodeScopedClient is the clientset the drain library gets. As a node
// identity the agent may read only pods bound to its node (the Node
// authorizer's graph); once an evicted pod is deleted, reading it answers
// 403 "no relationship found" instead of 404. The drain library waits for
// a 404, so for pod reads that refusal is reported as what it means: the
// pod is gone from this node.
type nodeScopedClient struct{ kubernetes.Interface }

func (c nodeScopedClient) CoreV1() corev1client.CoreV1Interface {
	return nodeScopedCore{c.Interface.CoreV1()}
}

type nodeScopedCore struct{ corev1client.CoreV1Interface }

func (c nodeScopedCore) Pods(ns string) corev1client.PodInterface {
	return nodeScopedPods{PodInterface: c.CoreV1Interface.Pods(ns)}
}

type nodeScopedPods struct{ corev1client.PodInterface }

func (p nodeScopedPods) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error) {
	pod, err := p.PodInterface.Get(ctx, name, opts)
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "no relationship found between node") {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), name)
	}
	return pod, err
}
