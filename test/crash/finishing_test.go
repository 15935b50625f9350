package crash

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// A crash right after the end state is committed (Finishing), before the
// agent reported anything: the writes that report it were journaled in the
// same transaction, so the next start delivers them — the Node condition
// first, then Succeeded — and only then releases the finalizer. Before,
// the end state and its two outbox writes were three commits: a crash
// between them (found by a 500-schedule batch, os-upgrade with a twin, a
// panic and a cancel) was replayed from Finishing with nothing to deliver,
// leaving LifecycleTransition=True for good (the event deleted) or the
// event Claimed with no end status, which the agent then adopted and ran
// again.
func TestCrashAfterFinishingCommit(t *testing.T) {
	c, lc, cs, _ := compoundCase(t, "compound-finishing", false)
	ctx := context.Background()
	crashOnUncordon(t, c, lc, `journalAfterFinishingCommit=panic("crash after the end state")`)
	if ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{}); err != nil || ev.Status.ClaimStatus.Finished() {
		t.Fatalf("at the crash the event is %v (%v); want it not yet reported finished", ev.Status.ClaimStatus, err)
	}

	a := c.start(t, "")
	var n *corev1.Node
	waitFor(t, "Succeeded, the finalizer gone and the Node out of its transition", 60*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if err != nil || ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || hasFinalizer(ev) {
			return false
		}
		if n, err = cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{}); err != nil {
			return false
		}
		lt := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
		return lt != nil && lt.Status == corev1.ConditionFalse
	})
	if lt := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); lt.Reason != "MaintenanceComplete" {
		t.Errorf("LifecycleTransition at rest: %s/%s; want False with the transition's end state", lt.Status, lt.Reason)
	}
	claimNextThenStop(t, c, lc, a)
	// Finished once: the end state replayed, never the event run again
	// (without the fix the status never came, the agent adopted its own
	// Claimed event and ran its step a second time).
	finishedOnce(t, c)
}

// A crash at the claim's first outbox write, and the event deleted while
// the agent is down: the Node must not keep a transition for an event that
// is gone. The start's Node conditions used to be queued on their own,
// before the claim's snapshot: the restarted agent delivered
// LifecycleTransition=True for an event its journal did not know, and
// nobody took it back (found by a fault-schedule batch, schedule 95: a
// reboot, a panic at journalAfterOutboxCommit, a cancel). Now they are
// queued in the snapshot's transaction, so the event is either unknown and
// nothing was reported, or journaled and its cancel takes them back.
//
// The claim's node Lease must not stay held for the event that is gone
// either (DESIGN §2: released at the end; TestChaos invariant 7): nothing
// of the dead agent's run will release it, so the restarted agent's sweep
// (engine releaseStaleLeases) does. Without it the Lease named the gone
// event until it expired, and another identity of this node (a re-imaged
// host) could not claim meanwhile (found by a fault-schedule batch,
// schedules 80 and 95 of seed 1796633434137702643).
func TestCrashAtClaimThenDeleted(t *testing.T) {
	crashAtClaimThenDeleted(t, "compound-claim-crash-deleted", `journalAfterOutboxCommit=panic("crash at the first outbox write")`)
}

// The same, the agent killed right after its claim's status write, before
// the finalizer: the deletion while it is down removes the event at once.
func TestCrashAfterClaimWriteThenDeleted(t *testing.T) {
	crashAtClaimThenDeleted(t, "compound-claimwrite-crash-deleted", `engineAfterClaim=panic("crash after the claim write")`)
}

// And killed in the claim's journal commit, after the finalizer: the
// deleted event waits for its finalizer, the restarted agent's journal
// does not know it, and releaseOrphans lets it go.
func TestCrashInClaimCommitThenDeleted(t *testing.T) {
	crashAtClaimThenDeleted(t, "compound-claimcommit-crash-deleted", `journalBeforeEventCommit=panic("crash in the claim's commit")`)
}

func crashAtClaimThenDeleted(t *testing.T, node, failpoint string) {
	c, lc, cs, _ := compoundCase(t, node, false)
	ctx := context.Background()
	crashOnUncordon(t, c, lc, failpoint)
	if h := leaseHolder(t, lc, apiclient.NodeLeaseName(c.node)); h == "" {
		t.Fatal("the claim took no node Lease before the crash: the case tests nothing")
	}
	// Cancelled while the agent is down.
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	a := c.start(t, "")
	var n *corev1.Node
	waitFor(t, "the event gone and the Node not mid-transition", 60*time.Second, a, func() bool {
		if _, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{}); err == nil {
			return false
		}
		st, err := statusFromSocket(ctx, c.socket())
		if err != nil || st.State != "idle" || st.Outbox != 0 || st.Unfinished != 0 {
			return false
		}
		n, err = cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		return err == nil
	})
	if lt := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); lt != nil && lt.Status == corev1.ConditionTrue {
		t.Errorf("LifecycleTransition=True/%s at rest (%q) for an event that is gone", lt.Reason, lt.Message)
	}
	if n.Spec.Unschedulable {
		t.Errorf("node left cordoned (cordoned-by %q)", n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
	lease := apiclient.NodeLeaseName(c.node)
	waitFor(t, "the node Lease released for the gone event", 20*time.Second, a, func() bool {
		return leaseHolder(t, lc, lease) == ""
	}, func() string { return lease + " held by " + leaseHolder(t, lc, lease) })
	claimNextThenStop(t, c, lc, a)
}

// crashOnUncordon starts the agent with a failpoint that panics, creates
// c's uncordon event and waits until the agent died of it.
func crashOnUncordon(t *testing.T, c *crashCase, lc *apiclient.LifecycleClients, failpoint string) {
	t.Helper()
	a := c.start(t, failpoint)
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(context.Background(), c.node+"-uncordon", metav1.GetOptions{})
		return err == nil
	})
	createDrain(t, lc, c, c.event, "uncordon")
	select {
	case <-a.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent did not die of %s in 60s", failpoint)
	}
}

// eventRetention 0: the finish deletes the event itself, right after its
// move to history. A crash between the two leaves a finished event, its
// finalizer off, that no running code path of the dead agent will delete:
// the restarted agent's collect must, from its watch (the history says the
// event is ours and done; it is not run again).
func TestCrashBeforeFinishDelete(t *testing.T) {
	c, lc, _, _ := compoundCase(t, "compound-finish-delete", false)
	ctx := context.Background()
	if err := os.WriteFile(c.config(), []byte(strings.Replace(agentConfig, "eventRetention: 1h", "eventRetention: 0s", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	crashOnUncordon(t, c, lc, `engineBeforeFinishDelete=panic("crash before the finish's delete")`)
	ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil || ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || hasFinalizer(ev) {
		t.Fatalf("at the crash the event is %v (%v); want it Succeeded, its finalizer off, not yet deleted", ev.Status.ClaimStatus, err)
	}

	a := c.start(t, "")
	waitFor(t, "the finished event deleted by the restarted agent", 60*time.Second, a, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err := a.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	finishedOnce(t, c)
}

// finishedOnce: the journal's history holds the case's event exactly once
// (its end replayed after a crash, never the event run again).
func finishedOnce(t *testing.T, c *crashCase) {
	t.Helper()
	doc, err := c.exportJournal()
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for _, h := range doc.History {
		if h.Event.Name == c.event {
			runs++
		}
	}
	if runs != 1 {
		t.Errorf("the journal's history holds %s %d times; want once", c.event, runs)
	}
}

// A renewal of the node Lease that lands after the finish released it
// takes the Lease back for an event that has ended: held at rest, by this
// agent for an event that is over, until it expires (40 s), and no other
// identity of the node can claim meanwhile (a renewal reads a released
// Lease as free). The renewal loop ran until execute returned, after the
// releases; found by a review of chaos invariant 7's race. The failpoint
// holds the finish 15 s after the releases, across the loop's tick (every
// LeaseDuration/3, 13.3 s); at rest the node Lease must have no holder.
func TestNoLeaseRenewalAfterRelease(t *testing.T) {
	c, lc, _, _ := compoundCase(t, "compound-renew-release", false)
	ctx := context.Background()
	a := c.start(t, `engineAfterLeaseRelease=sleep(15000)`)
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-uncordon", metav1.GetOptions{})
		return err == nil
	})
	createDrain(t, lc, c, c.event, "uncordon")
	state := func() string {
		st, err := statusFromSocket(ctx, c.socket())
		if err != nil {
			return err.Error()
		}
		return st.State
	}
	waitFor(t, "the agent idle after the event (the failpoint holds its finish 15 s)", 90*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded && state() == "idle"
	}, state)
	if holder := leaseHolder(t, lc, apiclient.NodeLeaseName(c.node)); holder != "" {
		t.Errorf("node Lease %s held at rest by %s: renewed after the finish released it", apiclient.NodeLeaseName(c.node), holder)
	}
	if err := a.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}
