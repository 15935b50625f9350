package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// TestCancelIsNotAFailure: an event deleted mid-drain (behind a budget that
// never frees) is cancelled, not failed. A watcher of the event sees no end
// state at any time — Succeeded, Failed and SlaExpired are the KEP's, and a
// deletion is none of them — then the object gone; a Kubernetes Event with
// reason Cancelled is recorded on the LifecycleEvent and on the Node; the
// node is uncordoned (our cordon undone).
func TestCancelIsNotAFailure(t *testing.T) {
	node := "cancel-truth"
	newNode(t, node)
	startWorkload(t, "cancel-truth-ns", node, "", 1, 1) // minAvailable 1 of 1: held
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitTransition(t, transitionName(node, "drain"))
	ctx := context.Background()
	lc := clients(t, env.AdminConfig())
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	name := "cancel-truth-1"

	w := watchEventNamed(ctx, t, lc, name)
	var mu sync.Mutex
	var seen []string  // claimStatus/message of every version seen
	var ended []string // the versions that showed an end state
	gone := make(chan struct{})
	go func() {
		for e := range w.ResultChan() {
			if e.Type == watch.Deleted {
				close(gone)
				return
			}
			if ev, ok := e.Object.(*v1alpha1.LifecycleEvent); ok {
				mu.Lock()
				seen = append(seen, string(ev.Status.ClaimStatus)+": "+ev.Status.Message)
				if ev.Status.ClaimStatus.Finished() || ev.Status.CompletionTime != nil {
					ended = append(ended, fmt.Sprintf("%s %q (completion %v)", ev.Status.ClaimStatus, ev.Status.Message, ev.Status.CompletionTime))
				}
				mu.Unlock()
			}
		}
	}()

	createEvent(t, name, node, transitionName(node, "drain"), nil, nil)
	waitFor(t, "the drain held by the budget", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(ctx, name, metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "evict" && strings.Contains(ev.Status.Message, "disruption budget")
	})
	if err := lc.Events.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled event was not gone within 30 s (finalizer kept)")
	}
	if _, err := lc.Events.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the cancel: %v, want NotFound", err)
	}
	mu.Lock()
	t.Logf("versions seen:\n%s", strings.Join(seen, "\n"))
	if len(ended) > 0 {
		t.Errorf("a watcher saw an end state on a cancelled event: %s", strings.Join(ended, "; "))
	}
	mu.Unlock()

	for _, kind := range []string{"LifecycleEvent", "Node"} {
		waitFor(t, "a Kubernetes Event reason Cancelled on the "+kind, 15*time.Second, func() bool {
			l, err := cs.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, k := range l.Items {
				want := name
				if kind == "Node" {
					want = node
				}
				if k.Reason == "Cancelled" && k.InvolvedObject.Kind == kind && k.InvolvedObject.Name == want && k.Type == corev1.EventTypeNormal &&
					strings.Contains(k.Message, "cancelled") {
					return true
				}
				if k.InvolvedObject.Name == name && k.Reason == "Failed" {
					t.Errorf("a Failed Kubernetes Event for the cancelled event: %q", k.Message)
				}
			}
			return false
		})
	}
	waitFor(t, "the node uncordoned", 30*time.Second, func() bool { return !getNode(t, node).Spec.Unschedulable })
}
