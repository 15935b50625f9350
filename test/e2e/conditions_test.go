package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// recordConditions records node's lifecycle conditions as the API server
// stores them (testenv.ConditionRecorder).
func recordConditions(t *testing.T, node string) *testenv.ConditionRecorder {
	t.Helper()
	return testenv.RecordConditions(t, env.AdminConfig(), node)
}

// The Node Lifecycle Conditions (KEP-5683 as merged) and the proposal's
// LifecycleTransition, per driver, in the order the API server stored
// them: the type is the state, the status whether it is active, the reason
// the cause (docs/conditions.md) — never a state name.
func TestNodeConditionSequences(t *testing.T) {
	node, spare := "cond-node", "cond-spare"
	newNode(t, node)
	newNode(t, spare)
	startWorkload(t, "cond-ns", node, spare, 2, 1)
	rec := recordConditions(t, node)
	gate := newGateDriver("maint", true, "work")
	startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{gate}, configure: func(c *config.Config) {
		c.Reboot.ReadyTimeout = 10 * time.Second
		c.Exec.Drivers = []config.ExecDriver{{Name: "flash", Start: "FlashStarted", End: "FlashComplete",
			Steps: []config.ExecStep{{Name: "flash", Command: []string{"/bin/true"}, Timeout: time.Minute}}}}
	}})
	for _, d := range []string{"drain", "uncordon", "reboot", "flash", "maint"} {
		waitTransition(t, transitionName(node, d))
	}
	const (
		lt, dip, drained = v1alpha1.NodeConditionLifecycleTransition, v1alpha1.NodeConditionDrainInProgress, v1alpha1.NodeConditionDrained
		planned, mip     = v1alpha1.NodeConditionMaintenancePlanned, v1alpha1.NodeConditionMaintenanceInProgress
	)

	t.Run("drain", func(t *testing.T) {
		m := rec.Mark()
		createEvent(t, "cond-drain", node, transitionName(node, "drain"), nil, nil)
		if ev := waitEvent(t, "cond-drain", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("drain: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
		}
		rec.Expect(t, m, []string{
			lt + "=True/DrainStarted", dip + "=True/AdminRequested",
			dip + "=False/DrainCompleted", drained + "=True/DrainCompleted", lt + "=False/DrainComplete",
		}, mip, planned)
	})

	// A pipeline's drain, reboot, uncordon: the reboot's own drain finds
	// the drain event's cordon and leaves it (its uncordon lifts only its
	// own), so the node is still cordoned when the reboot ends. Its end
	// said Drained=False/ReturnedToService, "back in service", while the
	// Node was unschedulable; now Drained stays True until the uncordon.
	t.Run("reboot after a drain leaves the drain's cordon, still Drained", func(t *testing.T) {
		m := rec.Mark()
		createEvent(t, "cond-reboot-drained", node, transitionName(node, "reboot"), nil, nil)
		ev := waitEvent(t, "cond-reboot-drained", time.Minute)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("reboot: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
		}
		if !strings.Contains(stepMessages(ev), "cordon: "+drivers.CordonNotOurs) {
			t.Errorf("the reboot's cordon step does not say the cordon was not its own: %s", stepMessages(ev))
		}
		rec.Expect(t, m, []string{lt + "=True/RebootStarted", drained + "=True/DrainCompleted", lt + "=False/RebootComplete"},
			drained+"=False/ReturnedToService", mip+"=False/EventFailed")
		n := getNode(t, node)
		if c := nodeCondition(n, drained); !n.Spec.Unschedulable || c == nil || c.Status != "True" || !strings.Contains(c.Message, "the cordon it found stays") {
			t.Errorf("after the reboot: unschedulable %v, Drained %+v; want the drain event's cordon and Drained=True", n.Spec.Unschedulable, c)
		}
	})

	t.Run("uncordon puts the node back in service", func(t *testing.T) {
		m := rec.Mark()
		createEvent(t, "cond-uncordon", node, transitionName(node, "uncordon"), nil, nil)
		if ev := waitEvent(t, "cond-uncordon", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("uncordon: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
		}
		rec.Expect(t, m, []string{lt + "=True/Uncordoning", drained + "=False/ReturnedToService", lt + "=False/MaintenanceComplete"}, dip+"=True", mip)
	})

	t.Run("reboot asked by a local pipeline, queued behind a disruption slot", func(t *testing.T) {
		// The group's only slot is held for another node's unfinished event.
		lc := clients(t, env.AdminConfig())
		ctx := context.Background()
		blocker := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: "cond-blocker"},
			Spec: v1alpha1.LifecycleEventSpec{TransitionName: transitionName(spare, "drain"), BindingNode: spare}}
		blocker, err := lc.Events.Create(ctx, blocker, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		holder, secs, now := "cond-spare/other", int32(40), metav1.NowMicro()
		slot := &v1alpha1.LifecycleLease{ObjectMeta: metav1.ObjectMeta{Name: "cond-rack-0", Namespace: v1alpha1.SystemNamespace,
			Annotations: map[string]string{apiclient.AnnotationLeaseEvent: blocker.Name, apiclient.AnnotationLeaseEventUID: string(blocker.UID)}},
			Spec: coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}
		if _, err := lc.Leases(v1alpha1.SystemNamespace).Create(ctx, slot, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		m := rec.Mark()
		ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: "cond-reboot", Labels: map[string]string{"lifecycle.x-k8s.io/requested-by": "local"}},
			Spec: v1alpha1.LifecycleEventSpec{TransitionName: transitionName(node, "reboot"), BindingNode: node,
				Disruption: &v1alpha1.DisruptionBudget{Group: "cond-rack", MaxConcurrent: 1}}}
		if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.Expect(t, m, []string{planned + "=True/LocalRequest"}, dip+"=True")
		if ev, _ := lc.Events.Get(ctx, "cond-reboot", metav1.GetOptions{}); ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending || ev.Status.Sla != nil ||
			!strings.Contains(ev.Status.Message, "cond-rack-0: event cond-blocker (cond-spare/other)") {
			t.Errorf("queued for its slot the event is %s (sla %v): %q; want Pending, no sla yet, the holder named", ev.Status.ClaimStatus, ev.Status.Sla, ev.Status.Message)
		}
		// The other node's event ends: it is deleted and its holder gives
		// the slot back (the admission policy lets a node take a live
		// slot from another only once it has expired).
		if err := lc.Events.Delete(ctx, blocker.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		held, err := lc.Leases(v1alpha1.SystemNamespace).Get(ctx, "cond-rack-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		empty := ""
		held.Spec.HolderIdentity = &empty
		if _, err := lc.Leases(v1alpha1.SystemNamespace).Update(ctx, held, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if ev := waitEvent(t, "cond-reboot", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("reboot: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
		}
		rec.Expect(t, m, []string{
			planned + "=True/LocalRequest", lt + "=True/RebootStarted", planned + "=False/MaintenanceStarted",
			dip + "=True/LocalRequest", dip + "=False/DrainCompleted", drained + "=True/DrainCompleted",
			mip + "=True/LocalRequest", drained + "=False/ReturnedToService",
			mip + "=False/MaintenanceCompleted", lt + "=False/RebootComplete",
		})
	})

	t.Run("exec driver", func(t *testing.T) {
		m := rec.Mark()
		createEvent(t, "cond-flash", node, transitionName(node, "flash"), nil, nil)
		if ev := waitEvent(t, "cond-flash", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("flash: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
		}
		// Its one step runs at once (simulate mode): the True state may be
		// superseded in the outbox before it is sent; the end is not.
		rec.Expect(t, m, []string{lt + "=True/FlashStarted", mip + "=False/MaintenanceCompleted", lt + "=False/FlashComplete"}, dip, drained)
	})

	t.Run("a disruptive driver's step in progress", func(t *testing.T) {
		m := rec.Mark()
		createEvent(t, "cond-maint", node, transitionName(node, "maint"), nil, nil)
		rec.Expect(t, m, []string{lt + "=True/GateStarted", mip + "=True/AdminRequested"}, dip, drained)
		gate.open("work")
		if ev := waitEvent(t, "cond-maint", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("maint: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
		}
		rec.Expect(t, m, []string{mip + "=False/MaintenanceCompleted", lt + "=False/GateComplete"})
	})

	t.Run("a cancelled drain", func(t *testing.T) {
		// A budget that allows no eviction holds the drain; then it is deleted.
		startWorkload(t, "cond-ns2", node, spare, 1, 1)
		m := rec.Mark()
		createEvent(t, "cond-cancel", node, transitionName(node, "drain"), nil, nil)
		rec.Expect(t, m, []string{dip + "=True/AdminRequested"})
		if err := clients(t, env.AdminConfig()).Events.Delete(context.Background(), "cond-cancel", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		rec.Expect(t, m, []string{drained + "=False/DrainIncomplete", dip + "=False/EventCancelled", lt + "=False/Cancelled"}, drained+"=True")
	})
}

// A transition made by an admin names its own states: status.driver and
// the LifecycleTransition condition use them, not the driver's defaults.
func TestTransitionStateNames(t *testing.T) {
	node := "names-node"
	newNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitTransition(t, transitionName(node, "uncordon"))
	lc := clients(t, env.AdminConfig())
	ctx := context.Background()
	own := &v1alpha1.LifecycleTransition{ObjectMeta: metav1.ObjectMeta{Name: "names-back-to-work"},
		Spec: v1alpha1.LifecycleTransitionSpec{Start: "ReturningToWork", End: "BackAtWork", NodeName: &node, Driver: "lifecycle-agent.x-k8s.io/uncordon"}}
	if _, err := lc.Transitions.Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createEvent(t, "names-1", node, own.Name, nil, nil)
	ev := waitEvent(t, "names-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("%s %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if d := ev.Status.Driver; d.Start != "ReturningToWork" || d.End != "BackAtWork" {
		t.Errorf("status.driver = %+v, want the transition's ReturningToWork → BackAtWork", d)
	}
	if c := nodeCondition(getNode(t, node), v1alpha1.NodeConditionLifecycleTransition); c == nil || c.Reason != "BackAtWork" {
		t.Errorf("LifecycleTransition = %+v, want reason BackAtWork", c)
	}
	if !strings.Contains(ev.Status.Message, "ReturningToWork → BackAtWork") {
		t.Errorf("message %q does not name the transition's states", ev.Status.Message)
	}
}

// drain.timeout bounds the evictions: a drain a budget holds fails when it
// passes, saying so, and the node is uncordoned (the abort's default undo).
func TestDrainTimeout(t *testing.T) {
	node, spare := "timeout-node", "timeout-spare"
	newNode(t, node)
	newNode(t, spare)
	startWorkload(t, "timeout-ns", node, spare, 1, 1) // minAvailable 1 of 1: no eviction allowed
	startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) { c.Drain.Timeout = 2 * time.Second }})
	waitTransition(t, transitionName(node, "drain"))
	start := time.Now()
	createEvent(t, "timeout-1", node, transitionName(node, "drain"), nil, nil)
	ev := waitEvent(t, "timeout-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "timeout") || !strings.Contains(ev.Status.Message, "evict") {
		t.Fatalf("got %s %q after %s; want Failed in evict naming the timeout", ev.Status.ClaimStatus, ev.Status.Message, time.Since(start).Round(time.Second))
	}
	waitFor(t, "the node uncordoned", 30*time.Second, func() bool { return !getNode(t, node).Spec.Unschedulable })
}

// One Claimed event per node, whoever claimed it: while a third-party
// controller holds an event of this node, the agent claims nothing else and
// says so on the waiting event (Pending, the blocker named); once that event
// ends, the waiting one runs.
func TestOneClaimedEventPerNode(t *testing.T) {
	node := "third-party-node"
	newNode(t, node)
	lc := clients(t, env.AdminConfig())
	ctx := context.Background()
	other := &v1alpha1.LifecycleTransition{ObjectMeta: metav1.ObjectMeta{Name: "third-party-firmware"},
		Spec: v1alpha1.LifecycleTransitionSpec{Start: "FirmwareStarted", End: "FirmwareDone", NodeName: &node, Driver: "vendor.example.com/firmware"}}
	if _, err := lc.Transitions.Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	blocker := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: "third-party-1"},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: other.Name, BindingNode: node}}
	blocker, err := lc.Events.Create(ctx, blocker, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	blocker.Status = v1alpha1.LifecycleEventStatus{ClaimStatus: v1alpha1.LifecycleEventClaimed,
		Holder: &v1alpha1.Holder{Identity: "vendor-controller-0", ClaimTime: &now}}
	if blocker, err = lc.Events.UpdateStatus(ctx, blocker, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitTransition(t, transitionName(node, "uncordon"))
	createEvent(t, "third-party-mine", node, transitionName(node, "uncordon"), nil, nil)
	waitFor(t, "the agent's event Pending, naming the blocker", 20*time.Second, func() bool {
		ev, err := lc.Events.Get(ctx, "third-party-mine", metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventPending &&
			strings.Contains(ev.Status.Message, "third-party-1") && strings.Contains(ev.Status.Message, "vendor-controller-0")
	})
	time.Sleep(2 * time.Second)
	if ev, _ := lc.Events.Get(ctx, "third-party-mine", metav1.GetOptions{}); ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
		t.Fatalf("claimed while another holder's event runs on the node: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	blocker.Status.ClaimStatus = v1alpha1.LifecycleEventSucceeded
	if _, err := lc.Events.UpdateStatus(ctx, blocker, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, "third-party-mine", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("after the blocker ended: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
}

// stepMessages lists an event's steps as "name: message" lines.
func stepMessages(ev *v1alpha1.LifecycleEvent) string {
	var b strings.Builder
	for _, s := range ev.Status.Steps {
		b.WriteString(s.Name + ": " + s.Message + "\n")
	}
	return b.String()
}
