package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// TestPlannedWhileWaitingForTransition: an event bound to the node before
// its LifecycleTransition exists is planned maintenance (the merged KEP's
// MaintenancePlanned: "the Node is expected to undergo maintenance"): the
// Node says MaintenancePlanned=True naming it while it waits, and False
// once it is claimed; one deleted while it waits clears it too.
func TestPlannedWhileWaitingForTransition(t *testing.T) {
	node := "planned-transition"
	newNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitTransition(t, transitionName(node, "uncordon"))
	ctx := context.Background()
	lc := clients(t, env.AdminConfig())
	planned := func() *corev1.NodeCondition {
		return nodeCondition(getNode(t, node), v1alpha1.NodeConditionMaintenancePlanned)
	}

	// Waits for a transition that does not exist yet, then runs.
	lt := validLT(node + "-later-drain")
	lt.Spec.NodeName = ptr(node)
	createEvent(t, "planned-1", node, lt.Name, nil, nil)
	waitPlanned(t, node, "planned-1", "TransitionNotFound", "not found")
	if _, err := lc.Transitions.Create(ctx, lt, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, "planned-1", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("planned-1 ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	waitFor(t, "MaintenancePlanned False once the event was claimed", 30*time.Second, func() bool {
		c := planned()
		return c != nil && c.Status == corev1.ConditionFalse
	})

	// Waits, then is deleted: the plan is gone too.
	createEvent(t, "planned-2", node, node+"-never", nil, nil)
	waitPlanned(t, node, "planned-2", "TransitionNotFound")
	if err := lc.Events.Delete(ctx, "planned-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "MaintenancePlanned False once the waiting event is gone", 30*time.Second, func() bool {
		c := planned()
		return c != nil && c.Status == corev1.ConditionFalse
	})
}
