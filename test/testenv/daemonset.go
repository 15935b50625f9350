package testenv

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// CreateDaemonSetPod creates namespace ns, a DaemonSet name in it and its
// pod name-<node> bound to node, owned by the DaemonSet as its controller
// would own it. No DaemonSet controller runs in the test control plane:
// this is the pod it would have made (a kubelet stand-in or the VM's real
// kubelet then runs it). It returns the pod's name.
func CreateDaemonSetPod(ctx context.Context, cfg *rest.Config, ns, name, node, image string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	if err := waitDefaultServiceAccount(ctx, cs, ns); err != nil {
		return "", err
	}
	labels := map[string]string{"app": name}
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: image}}}
	ds, err := cs.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	yes := true
	spec.NodeName = node
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + node, Labels: labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}}},
		Spec: spec}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	return pod.Name, nil
}

// SetAllocatable sets a resource's allocatable and capacity count on the
// Node's status, as a device plugin's registration makes the kubelet do.
func SetAllocatable(ctx context.Context, cfg *rest.Config, node string, res corev1.ResourceName, n int64) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		nd, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if nd.Status.Allocatable == nil {
			nd.Status.Allocatable = corev1.ResourceList{}
		}
		if nd.Status.Capacity == nil {
			nd.Status.Capacity = corev1.ResourceList{}
		}
		nd.Status.Allocatable[res] = *resource.NewQuantity(n, resource.DecimalSI)
		nd.Status.Capacity[res] = *resource.NewQuantity(n, resource.DecimalSI)
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, nd, metav1.UpdateOptions{})
		return err
	})
}
