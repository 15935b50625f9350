package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// failFinalizer is the node's transport with one fault: the first
// metadata update of one event (the claim's finalizer write, a PUT without
// /status) is lost on the way, as on a connection that dies under it.
type failFinalizer struct {
	next http.RoundTripper
	path string

	mu     sync.Mutex
	failed bool
}

func (f *failFinalizer) RoundTrip(req *http.Request) (*http.Response, error) {
	f.mu.Lock()
	fail := !f.failed && req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, f.path)
	if fail {
		f.failed = true
	}
	f.mu.Unlock()
	if fail {
		return nil, errors.New("injected: connection reset by peer")
	}
	return f.next.RoundTrip(req)
}

// Two events wait for one node; the claim of the first lands, and then
// adding its finalizer fails. That event is Claimed by this agent on the
// server all the same, so nothing else may be claimed before it is
// adopted: one claimed event per node (DESIGN §4, the KEP's rule). The
// claim loop went on to the second event in the same round instead, and
// the node held two claimed events, the second running while the first
// waited, Claimed, with its sla running.
func TestClaimErrorClaimsNothingElse(t *testing.T) {
	node := "claim-error"
	newNode(t, node)
	first, second := node+"-a", node+"-b"
	inject := &failFinalizer{path: "/lifecycleevents/" + first}
	rc := env.NodeConfig(node)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { inject.next = rt; return inject })
	g := newGateDriver("two", false, "hold")
	tn := transitionName(node, "two")
	// Both wait before the agent starts, so that one claim round sees both.
	createEvent(t, first, node, tn, nil, nil)
	createEvent(t, second, node, tn, nil, nil)
	startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{g}, rest: rc})
	lc := clients(t, env.AdminConfig())
	ctx := context.Background()
	claimed := func() (a, b bool) {
		for name, v := range map[string]*bool{first: &a, second: &b} {
			ev, err := lc.Events.Get(ctx, name, metav1.GetOptions{})
			*v = err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed
		}
		return a, b
	}
	waitFor(t, "the first event claimed", 30*time.Second, func() bool { a, _ := claimed(); return a })
	// The first event's step holds at its gate; watch both for a while.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		if a, b := claimed(); a && b {
			t.Fatalf("events %s and %s both Claimed on node %s", first, second, node)
		}
	}
	inject.mu.Lock()
	failed := inject.failed
	inject.mu.Unlock()
	if !failed {
		t.Fatal("the finalizer write of the first event was never sent: the case tests nothing")
	}
	g.open("hold")
	for _, name := range []string{first, second} {
		if ev := waitEvent(t, name, 60*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("event %s ended %s: %s", name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
}

// An event Claimed by this agent that its journal lost (the journal file
// gone), and an older one Pending: the restarted agent adopts its own
// claimed event before it claims anything new. It claimed the older
// Pending one first (the claim order is by creation), and the node held
// two claimed events, the adopted one waiting behind the new one.
func TestAdoptsBeforeClaimingAnother(t *testing.T) {
	node := "adopt-first"
	newNode(t, node)
	dir := t.TempDir()
	lc := clients(t, env.AdminConfig())
	ctx := context.Background()
	older, mine := node+"-x", node+"-y"
	claimHeldThenJournalLost(t, node, dir, mine, func() {
		// Its transition is published only by the next agent: it waits.
		createEvent(t, older, node, transitionName(node, "three"), nil, nil)
	})
	g2, g3 := newGateDriver("two", false, "hold"), newGateDriver("three", false, "step3")
	startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, extra: []drivers.Driver{g2, g3}})
	waitFor(t, "the older event's transition", 30*time.Second, func() bool {
		_, err := lc.Transitions.Get(ctx, transitionName(node, "three"), metav1.GetOptions{})
		return err == nil
	})
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		ev, err := lc.Events.Get(ctx, older, metav1.GetOptions{})
		if err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed {
			t.Fatalf("event %s claimed while %s, Claimed by this agent, waited to be adopted", older, mine)
		}
	}
	g2.open("hold")
	g3.open("step3")
	for _, name := range []string{mine, older} {
		if ev := waitEvent(t, name, 60*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("event %s ended %s: %s", name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
}

// The same lost journal, but the restarted agent no longer has the claimed
// event's driver (its config dropped it, or its hardware is gone): the
// event is adopted to be failed, saying why, and aborted — as a replay from
// the journal does — so the node's next event runs. Left Claimed, it held
// every other event of the node back for good.
func TestAdoptsAnEventWhoseDriverIsGone(t *testing.T) {
	node := "adopt-gone"
	newNode(t, node)
	dir := t.TempDir()
	mine, next := node+"-y", node+"-z"
	claimHeldThenJournalLost(t, node, dir, mine, func() {})
	createEvent(t, next, node, transitionName(node, "three"), nil, nil)
	g3 := newGateDriver("three", false, "step3")
	g3.open("step3")
	startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, extra: []drivers.Driver{g3}})
	ev := waitEvent(t, mine, 60*time.Second)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "not enabled") {
		t.Fatalf("event %s, its driver gone, ended %s: %q; want Failed saying the driver is not enabled", mine, ev.Status.ClaimStatus, ev.Status.Message)
	}
	if ev := waitEvent(t, next, 60*time.Second); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("event %s ended %s: %s", next, ev.Status.ClaimStatus, ev.Status.Message)
	}
}

// claimHeldThenJournalLost has an agent for node (journal in dir, the gate
// driver "two") claim event name and hold at its step, then stops it and
// removes its journal (lost, or moved aside as corrupt): the event stays
// Claimed by that agent's identity, which the next agent on dir keeps.
// before runs once the transition is published, before the event exists.
func claimHeldThenJournalLost(t *testing.T, node, dir, name string, before func()) {
	t.Helper()
	lc := clients(t, env.AdminConfig())
	ctx := context.Background()
	a := startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, extra: []drivers.Driver{newGateDriver("two", false, "hold")}})
	waitFor(t, "the transition", 30*time.Second, func() bool {
		_, err := lc.Transitions.Get(ctx, transitionName(node, "two"), metav1.GetOptions{})
		return err == nil
	})
	before()
	createEvent(t, name, node, transitionName(node, "two"), nil, nil)
	waitFor(t, "the event claimed and held at its step", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(ctx, name, metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "hold"
	})
	a.stop(t)
	if err := os.Remove(filepath.Join(dir, "journal.db")); err != nil {
		t.Fatal(err)
	}
}
