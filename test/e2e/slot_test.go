package e2e

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// A disruption slot is held until its event ends or is gone, not until its
// Lease expires: node-a's event holds the only slot of a group, its agent
// goes quiet (a reboot that outlasts the Lease, POST included, or an API
// partition) and the Lease expires; node-b must not get the slot. Once
// node-a's event has ended, node-b gets it.
func TestSlotHeldPastLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	a, err := apiclient.New(env.NodeConfig("node-a"), "node-a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b, err := apiclient.New(env.NodeConfig("node-b"), "node-b", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	lc := clients(t, env.AdminConfig())
	evA := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: "slot-a"},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: "node-a-reboot", BindingNode: "node-a",
			Disruption: &v1alpha1.DisruptionBudget{Group: "slot-rack", MaxConcurrent: 1}}}
	evA, err = lc.Events.Create(ctx, evA, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Events.Delete(context.Background(), "slot-a", metav1.DeleteOptions{}) })
	now := metav1.Now()
	evA.Status = v1alpha1.LifecycleEventStatus{ClaimStatus: v1alpha1.LifecycleEventClaimed,
		Holder: &v1alpha1.Holder{Identity: "node-a/test", ClaimTime: &now, RenewTime: &now}}
	if evA, err = lc.Events.UpdateStatus(ctx, evA, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ha := apiclient.LeaseHolder{Identity: "node-a/test", Event: "slot-a", EventUID: string(evA.UID), Duration: time.Second}
	slot, err := a.AcquireSlot(ctx, "slot-rack", 1, ha, time.Now())
	if err != nil {
		t.Fatalf("node-a: %v", err)
	}
	// Let the 1 s Lease expire by far.
	time.Sleep(2500 * time.Millisecond)
	hb := apiclient.LeaseHolder{Identity: "node-b/test", Event: "slot-b", EventUID: "uid-b", Duration: time.Second}
	if got, err := b.AcquireSlot(ctx, "slot-rack", 1, hb, time.Now()); !errors.Is(err, apiclient.ErrNoSlot) {
		t.Fatalf("node-b took %q (err %v) while node-a's event was still Claimed: the budget of 1 would be exceeded", got, err)
	}
	// node-a's event ends: the slot is free although node-a never released it.
	evA.Status.ClaimStatus = v1alpha1.LifecycleEventSucceeded
	evA.Status.CompletionTime = &now
	if _, err := lc.Events.UpdateStatus(ctx, evA, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := b.AcquireSlot(ctx, "slot-rack", 1, hb, time.Now())
	if err != nil || got != slot {
		t.Fatalf("node-b after node-a's event ended: %q, %v; want %q", got, err, slot)
	}
}
