package crash

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
)

const (
	machineA = "0123456789abcdef0123456789abcdef"
	machineB = "fedcba9876543210fedcba9876543210"
)

func (c *crashCase) setMachineID(t *testing.T, id string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, agent.SimulatedMachineIDFile), []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Two hosts given one node name and the default journal path (a cloned
// image, or a host re-imaged under its old name): host A claims a drain
// and dies; host B — another machine ID, its own (empty) journal at the
// same path — starts. B must not adopt A's event: with an identity of node
// name and journal path alone the two were one holder, and B ran A's drain
// a second time. The event is deleted: B leaves it (and its finalizer) to
// A while A's node Lease is live, and once that Lease has expired B lets
// it go — undoes the cordon, removes the finalizer — instead of leaving it
// Terminating forever. Then A comes back to an event that is gone: it
// evicts nothing and stops cleanly.
func TestOtherMachineSameNodeName(t *testing.T) {
	c, lc, cs, release := compoundCase(t, "compound-twin-host", true)
	ctx := context.Background()
	c.setMachineID(t, machineA)
	idA := agent.Identity(c.node, c.journal(), machineA)
	a := blockedDrain(t, c, lc, "")
	ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Status.Holder == nil || ev.Status.Holder.Identity != idA {
		t.Fatalf("holder %+v, want identity %s (node, machine ID, journal)", ev.Status.Holder, idA)
	}
	a.kill()

	// Host B: the same paths, another machine, a journal of its own.
	if err := os.Rename(c.journal(), c.journal()+".host-a"); err != nil {
		t.Fatal(err)
	}
	c.setMachineID(t, machineB)
	b := c.start(t, "")
	time.Sleep(claimBound) // an adopting agent resumes at once
	st, err := statusFromSocket(ctx, c.socket())
	if err != nil {
		t.Fatal(err)
	}
	if st.Event != nil {
		t.Errorf("host B runs %s, held by host A", st.Event.Name)
	}
	ev, err = lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed || ev.Status.Holder == nil || ev.Status.Holder.Identity != idA {
		t.Errorf("after host B started the event is %s held by %+v, want Claimed by host A (%s)", ev.Status.ClaimStatus, ev.Status.Holder, idA)
	}

	// Deleted while A's node Lease is live: B must leave it to A.
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if ev, err = lc.Events.Get(ctx, c.event, metav1.GetOptions{}); err != nil {
		t.Fatalf("the deleted event held by live host A is gone already (%v): host B released it", err)
	}
	// A's Lease expires. While the Node's kubelet reports another
	// machine's boot ID (B is a twin: A may be rebooting, longer than any
	// Lease), B must still leave the event to A; once the Node's boot ID
	// is B's (this host is the node's machine: re-imaged or replaced), B
	// releases it.
	setNodeBoot := func(boot string) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Status.NodeInfo.BootID = boot
			_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	setNodeBoot("0f4b7a0e-3333-4c3e-9d1a-5a5a5a5a5a03") // host A's, rebooting
	leases := lc.Leases(v1alpha1.SystemNamespace)
	l, err := leases.Get(ctx, "node-"+c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != idA {
		t.Fatalf("node Lease held by %v, want host A", l.Spec.HolderIdentity)
	}
	old := metav1.NewMicroTime(time.Now().Add(-10 * time.Minute))
	l.Spec.RenewTime = &old
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(12 * time.Second) // releaseOrphans looks every 10 s
	if _, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{}); err != nil {
		t.Fatalf("the deleted event of host A, Lease expired, is gone (%v): host B released it while the Node's kubelet is another machine's", err)
	}
	bootB, err := os.ReadFile(filepath.Join(c.dir, hostops.SimulatedBootIDFile))
	if err != nil {
		t.Fatal(err)
	}
	setNodeBoot(strings.TrimSpace(string(bootB)))
	// releaseOrphans looks again 30 s after a boot ID that was not its own.
	waitFor(t, "host B to release the deleted event of dead host A", 45*time.Second, b, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	waitUncordoned(t, c, cs, b)
	if err := b.stop(20 * time.Second); err != nil {
		t.Error(err)
	}

	// Host A again, with its journal: its event is gone.
	if err := os.Rename(c.journal()+".host-a", c.journal()); err != nil {
		t.Fatal(err)
	}
	c.setMachineID(t, machineA)
	release() // a drain that missed the cancel would evict now
	a = c.start(t, "")
	waitFor(t, "host A idle with nothing left to deliver", 60*time.Second, a, func() bool {
		st, err := statusFromSocket(ctx, c.socket())
		return err == nil && st.Event == nil && st.Outbox == 0
	})
	time.Sleep(time.Second)
	evs, err := auditEvictions(c.node)
	if err != nil {
		t.Fatal(err)
	}
	for pod, n := range evs.accepted {
		t.Errorf("pod %s evicted %d time(s): the cancelled drain ran", pod, n)
	}
	waitUncordoned(t, c, cs, a)
	if err := a.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// An agent upgraded from a version whose identity had no machine ID, in
// the middle of a drain: the old agent (no readable machine ID gives the
// old identity) claims the drain and holds the node Lease; the new one
// (a machine ID) resumes it from its journal, takes the Lease over under
// its new identity and finishes.
func TestIdentityUpgradeMidEvent(t *testing.T) {
	c, lc, _, release := compoundCase(t, "compound-id-upgrade", true)
	ctx := context.Background()
	c.setMachineID(t, "not a machine id")
	legacy := agent.LegacyIdentity(c.node, c.journal())
	a := blockedDrain(t, c, lc, "")
	ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Status.Holder == nil || ev.Status.Holder.Identity != legacy {
		t.Fatalf("holder %+v, want the legacy identity %s", ev.Status.Holder, legacy)
	}
	a.kill() // the upgrade restarts it at once: the node Lease is still live
	c.setMachineID(t, machineA)
	release()
	a = c.start(t, "")
	waitFor(t, "the drain to succeed after the upgrade", 90*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded && len(ev.Finalizers) == 0
	})
	// The Leases go last, after the finalizer (DESIGN.md: end order).
	waitFor(t, "the node Lease (held under the old identity) released", 30*time.Second, a, func() bool {
		l, err := lc.Leases(v1alpha1.SystemNamespace).Get(ctx, "node-"+c.node, metav1.GetOptions{})
		return err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "")
	})
	claimNextThenStop(t, c, lc, a)
	ev, err = lc.Events.Get(ctx, "uncordon-"+c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := agent.Identity(c.node, c.journal(), machineA); ev.Status.Holder == nil || ev.Status.Holder.Identity != want {
		t.Errorf("the next event is held by %+v, want the new identity %s", ev.Status.Holder, want)
	}
}
