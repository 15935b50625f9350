package crash

import (
	"context"
	"os"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// What the finalizer (one write to add it, one to remove it, on every
// event: docs/benchmarks.md section 7) protects: a drain blocked by its
// PodDisruptionBudget; the agent is SIGKILLed; the event is deleted while
// it is down, and its journal is lost too (moved aside as corrupt, a
// re-imaged root). The deleted event must wait for its agent — still
// there, with a deletionTimestamp — and the restarted agent, which knows
// the event only from the API, must undo the cordon the event made (its
// annotation names it) before the event goes. Without the finalizer the
// event is gone at once and nothing is left to tell the agent that the
// node is cordoned by it: the node stays cordoned for good.
func TestDeletedWhileDownJournalLost(t *testing.T) {
	c, lc, cs, release := compoundCase(t, "compound-deleted-lost", true)
	defer release()
	ctx := context.Background()
	a1 := blockedDrain(t, c, lc, "")
	a1.kill()
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		t.Fatalf("the event deleted while its agent is down is gone at once: nothing will undo its cordon")
	case err != nil:
		t.Fatal(err)
	case ev.DeletionTimestamp == nil:
		t.Fatalf("the deleted event has no deletionTimestamp")
	}
	if err := os.Remove(c.journal()); err != nil {
		t.Fatal(err)
	}
	a2 := c.start(t, "")
	waitFor(t, "the deleted event to be gone (finalizer released)", 60*time.Second, a2, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// Gone only once its cordon was undone: the node is schedulable now.
	n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Spec.Unschedulable {
		t.Errorf("the event is gone but the node is still cordoned (cordoned-by %q)", n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
	waitUncordoned(t, c, cs, a2)
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}
