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
	holding  map[string]bool
}

// AnnotationTerminateAfter on a pod makes the stand-in finish it that long
// (a Go duration) after its deletion began, as a kubelet whose container
// takes its grace period to stop: the pod stays terminating meanwhile.
const AnnotationTerminateAfter = "testenv.lifecycle-agent/terminate-after"

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
	k := &KubeletStandIn{finished: map[string]int{}, holding: map[string]bool{}}
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
	if d, err := time.ParseDuration(pod.Annotations[AnnotationTerminateAfter]); err == nil && pod.DeletionTimestamp != nil {
		key := string(pod.UID)
		k.mu.Lock()
		held := k.holding[key]
		k.holding[key] = true
		k.mu.Unlock()
		if !held {
			p := pod.DeepCopy()
			time.AfterFunc(d, func() { // d after the deletion was first seen
				k.finish(ctx, cs, p)
			})
		}
		return
	}
	if pod.DeletionTimestamp != nil {
		k.finish(ctx, cs, pod)
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

// finish deletes pod for good (grace 0), as the kubelet does once its
// containers stopped.
func (k *KubeletStandIn) finish(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) {
	zero := int64(0)
	err := cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err == nil {
		k.mu.Lock()
		k.finished[pod.Namespace+"/"+pod.Name]++
		k.mu.Unlock()
	}
}
