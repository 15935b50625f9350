package testenv

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// Workload is NOT a StatefulSet controller. The test control plane runs no
// scheduler and no workload controllers, so Workload creates a StatefulSet
// object (for the pods' controllerRef, which drain requires) and its pods
// bound to a node directly, and — as a controller plus scheduler would —
// replaces each deleted pod with a new one on Spare.
type Workload struct {
	Namespace, Name string
	Node, Spare     string
	Replicas        int
	// MinAvailable, when > 0, adds a PodDisruptionBudget.
	MinAvailable int
	// PodSpec, when set, gives the pods' spec for a node (Node's and
	// Spare's alike): e.g. a real image for a real kubelet. Nil: a
	// placeholder image that only a kubelet stand-in "runs".
	PodSpec  func(node string) corev1.PodSpec
	mu       sync.Mutex
	replaced int
}

// Replaced returns how many pods were recreated on the spare node.
func (w *Workload) Replaced() int { w.mu.Lock(); defer w.mu.Unlock(); return w.replaced }

// CreateNode registers a Node with a Ready condition (no kubelet behind it).
func CreateNode(ctx context.Context, cfg *rest.Config, name string, labels map[string]string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "kubelet stand-in", LastHeartbeatTime: now, LastTransitionTime: now}}
	_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	return err
}

// SetNodeReady sets the Node's Ready condition as the kubelet would: True
// (KubeletReady) or False (KubeletNotReady, as while the node reboots).
func SetNodeReady(ctx context.Context, cfg *rest.Config, name string, ready bool) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st, reason := corev1.ConditionTrue, "KubeletReady"
		if !ready {
			st, reason = corev1.ConditionFalse, "KubeletNotReady"
		}
		now := metav1.Now()
		c := corev1.NodeCondition{Type: corev1.NodeReady, Status: st, Reason: reason, Message: "kubelet stand-in", LastHeartbeatTime: now, LastTransitionTime: now}
		found := false
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i], found = c, true
			}
		}
		if !found {
			n.Status.Conditions = append(n.Status.Conditions, c)
		}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// waitDefaultServiceAccount waits for namespace ns's default
// ServiceAccount, which kube-controller-manager creates a moment after the
// namespace: the ServiceAccount admission plugin refuses a pod before it
// ("serviceaccount \"default\" not found").
func waitDefaultServiceAccount(ctx context.Context, cs kubernetes.Interface, ns string) error {
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := poll(sctx, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(sctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("testenv: no default ServiceAccount in %s (is kube-controller-manager running?): %w", ns, err)
	}
	return nil
}

// Start creates the namespace, the StatefulSet object, the pods and the
// PDB, then keeps replacing deleted pods on Spare until ctx ends.
func (w *Workload) Start(ctx context.Context, cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	if err := waitDefaultServiceAccount(ctx, cs, w.Namespace); err != nil {
		return err
	}
	labels := map[string]string{"app": w.Name}
	replicas := int32(w.Replicas)
	sts, err := cs.AppsV1().StatefulSets(w.Namespace).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: w.Name},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: w.spec("")}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if w.MinAvailable > 0 {
		ma := intstr.FromInt32(int32(w.MinAvailable))
		if _, err := cs.PolicyV1().PodDisruptionBudgets(w.Namespace).Create(ctx, &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: w.Name},
			Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &ma, Selector: &metav1.LabelSelector{MatchLabels: labels}},
		}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	ref := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: ptr(true)}
	for i := 0; i < w.Replicas; i++ {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", w.Name, i), Labels: labels, OwnerReferences: []metav1.OwnerReference{ref}},
			Spec: w.spec(w.Node)}
		if _, err := cs.CoreV1().Pods(w.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	watcher, err := cs.CoreV1().Pods(w.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + w.Name})
	if err != nil {
		return err
	}
	go func() {
		defer watcher.Stop()
		n := w.Replicas
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type != watch.Deleted || pod.Spec.NodeName == w.Spare || w.Spare == "" {
				continue
			}
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", w.Name, n), Labels: labels, OwnerReferences: []metav1.OwnerReference{ref}},
				Spec: w.spec(w.Spare)}
			n++
			if _, err := cs.CoreV1().Pods(w.Namespace).Create(ctx, p, metav1.CreateOptions{}); err == nil {
				w.mu.Lock()
				w.replaced++
				w.mu.Unlock()
			}
		}
	}()
	return nil
}

func (w *Workload) spec(node string) corev1.PodSpec {
	if w.PodSpec != nil {
		s := w.PodSpec(node)
		s.NodeName = node
		return s
	}
	return podSpec(node)
}

func podSpec(node string) corev1.PodSpec {
	grace := int64(5)
	return corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &grace, AutomountServiceAccountToken: ptr(false),
		Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}}
}

// WaitPodsRunning waits until n pods on node are Running.
func WaitPodsRunning(ctx context.Context, cfg *rest.Config, node string, n int) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return poll(ctx, func() (bool, error) {
		l, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node + ",status.phase=Running"})
		return err == nil && len(l.Items) >= n, nil
	})
}
