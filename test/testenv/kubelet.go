package testenv

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// KubeletStandIn is NOT a kubelet. The test control plane has none, so this
// small loop does the two things of a kubelet that drain depends on, for the
// pods bound to one node: it marks new pods Running and Ready, and it
// finishes pods that are being deleted or were evicted (a grace-0 delete),
// as a kubelet does once their containers stopped.
type KubeletStandIn struct {
	mu       sync.Mutex
	finished map[string]int // namespace/name -> times finished
}

// Finished returns how many times each pod was finished.
func (k *KubeletStandIn) Finished() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	m := make(map[string]int, len(k.finished))
	for a, b := range k.finished {
		m[a] = b
	}
	return m
}

// RunKubeletStandIn runs the stand-in for node until ctx ends.
func RunKubeletStandIn(ctx context.Context, cfg *rest.Config, node string) (*KubeletStandIn, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	k := &KubeletStandIn{finished: map[string]int{}}
	sel := fields.OneTermEqualSelector("spec.nodeName", node).String()
	go func() {
		for ctx.Err() == nil {
			w, err := cs.CoreV1().Pods("").Watch(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
					continue
				}
			}
			for ev := range w.ResultChan() {
				pod, ok := ev.Object.(*corev1.Pod)
				if !ok || ev.Type == watch.Deleted {
					continue
				}
				k.handle(ctx, cs, pod)
			}
			w.Stop()
		}
	}()
	return k, nil
}

func (k *KubeletStandIn) handle(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil {
		zero := int64(0)
		err := cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err == nil {
			k.mu.Lock()
			k.finished[pod.Namespace+"/"+pod.Name]++
			k.mu.Unlock()
		}
		return
	}
	if pod.Status.Phase == corev1.PodRunning {
		return
	}
	p := pod.DeepCopy()
	now := metav1.Now()
	p.Status.Phase = corev1.PodRunning
	p.Status.StartTime = &now
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	_, _ = cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
}
