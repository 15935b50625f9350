package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// Two agent processes (journals) for the same node race over 200 events:
// never two Claimed at once, and no event processed twice.
func TestTwoAgentsOneNode(t *testing.T) {
	const n = 200
	node := "race-node"
	newNode(t, node)
	a1 := startAgent(t, node, agentOpts{retention: time.Hour})
	a2 := startAgent(t, node, agentOpts{retention: time.Hour})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "uncordon"), metav1.GetOptions{})
		return err == nil
	})
	// Watch every status change, to catch two Claimed at once.
	lc := clients(t, env.AdminConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := lc.Events.Watch(ctx, metav1.ListOptions{FieldSelector: "spec.bindingNode=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	claimed := map[string]bool{}
	maxClaimed := 0
	go func() {
		for e := range w.ResultChan() {
			ev, ok := e.Object.(*v1alpha1.LifecycleEvent)
			if !ok {
				continue
			}
			mu.Lock()
			if ev.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed {
				claimed[ev.Name] = true
			} else {
				delete(claimed, ev.Name)
			}
			if len(claimed) > maxClaimed {
				maxClaimed = len(claimed)
			}
			mu.Unlock()
		}
	}()
	for i := 0; i < n; i++ {
		createEvent(t, fmt.Sprintf("race-%03d", i), node, transitionName(node, "uncordon"), nil, nil)
	}
	deadline := time.Now().Add(8 * time.Minute)
	var list *v1alpha1.LifecycleEventList
	for time.Now().Before(deadline) {
		list, err = lc.Events.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.bindingNode=" + node})
		if err == nil {
			done := 0
			for _, ev := range list.Items {
				if ev.Status.ClaimStatus.Finished() && len(ev.Finalizers) == 0 {
					done++
				}
			}
			if done == n {
				break
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	type span struct {
		name       string
		start, end time.Time
		holder     string
	}
	var spans []span
	holders := map[string]int{}
	for _, ev := range list.Items {
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("event %s ended %q: %s", ev.Name, ev.Status.ClaimStatus, ev.Status.Message)
		}
		h := ev.Status.Holder
		spans = append(spans, span{ev.Name, h.ClaimTime.Time, ev.Status.CompletionTime.Time, h.Identity})
		holders[h.Identity]++
	}
	if len(spans) != n {
		t.Fatalf("%d events finished; want %d", len(spans), n)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start.Before(spans[j].start) })
	for i := 1; i < len(spans); i++ {
		if spans[i].start.Before(spans[i-1].end) {
			t.Fatalf("%s (claimed %s by %s) overlaps %s (ended %s, %s)", spans[i].name, spans[i].start, spans[i].holder,
				spans[i-1].name, spans[i-1].end, spans[i-1].holder)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if maxClaimed > 1 {
		t.Fatalf("the watch saw %d events Claimed at once", maxClaimed)
	}
	// Each event was claimed by exactly one agent: count the claims in both logs.
	claims := map[string]int{}
	for _, a := range []*testAgent{a1, a2} {
		for _, line := range strings.Split(a.logBuf.String(), "\n") {
			if strings.Contains(line, "msg=claimed") {
				for _, f := range strings.Fields(line) {
					if strings.HasPrefix(f, "event=") {
						claims[strings.TrimPrefix(f, "event=")]++
					}
				}
			}
		}
	}
	for _, s := range spans {
		if claims[s.name] != 1 {
			t.Fatalf("event %s was claimed %d times", s.name, claims[s.name])
		}
	}
	t.Logf("holders: %v; max Claimed at once: %d", holders, maxClaimed)
}

// spec.disruption: two nodes share one slot; the second waits with
// WaitingForDisruptionBudget=True until the first ends.
func TestDisruptionBudget(t *testing.T) {
	ga := newGateDriver("budget", true, "work")
	gb := newGateDriver("budget", true, "work")
	newNode(t, "budget-a")
	newNode(t, "budget-b")
	startAgent(t, "budget-a", agentOpts{retention: time.Hour, extra: []drivers.Driver{ga}})
	startAgent(t, "budget-b", agentOpts{retention: time.Hour, extra: []drivers.Driver{gb}})
	lc := clients(t, env.AdminConfig())
	for _, n := range []string{"budget-a", "budget-b"} {
		n := n
		waitFor(t, "transitions", 30*time.Second, func() bool {
			_, err := lc.Transitions.Get(context.Background(), transitionName(n, "budget"), metav1.GetOptions{})
			return err == nil
		})
	}
	d := &v1alpha1.DisruptionBudget{Group: "rack-7", MaxConcurrent: 1}
	createEvent(t, "budget-1", "budget-a", transitionName("budget-a", "budget"), nil, d)
	waitFor(t, "budget-1 to run its disruptive step", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "budget-1", metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "work"
	})
	createEvent(t, "budget-2", "budget-b", transitionName("budget-b", "budget"), nil, d)
	waitFor(t, "budget-2 to wait for the budget", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "budget-2", metav1.GetOptions{})
		if err != nil {
			return false
		}
		c := findCond(ev.Status.Conditions, v1alpha1.ConditionWaitingForDisruptionBudget)
		return c != nil && c.Status == metav1.ConditionTrue
	})
	lease := func() *v1alpha1.LifecycleLease {
		l, err := clients(t, env.AdminConfig()).Leases(v1alpha1.SystemNamespace).Get(context.Background(), "rack-7-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if l := lease(); l.Annotations["lifecycle.x-k8s.io/event"] != "budget-1" {
		t.Fatalf("slot rack-7-0 is held for %q; want budget-1", l.Annotations["lifecycle.x-k8s.io/event"])
	}
	select {
	case s := <-gb.ran:
		t.Fatalf("budget-2 ran %s while budget-1 held the only slot", s)
	case <-time.After(3 * time.Second):
	}
	ga.open("work")
	if ev := waitEvent(t, "budget-1", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("budget-1: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	gb.open("work")
	ev := waitEvent(t, "budget-2", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("budget-2: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if c := findCond(ev.Status.Conditions, v1alpha1.ConditionWaitingForDisruptionBudget); c == nil || c.Status != metav1.ConditionFalse {
		t.Fatalf("WaitingForDisruptionBudget after the end = %+v", c)
	}
	// The slot is released right after the finalizer comes off (finish).
	var holder string
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := lease()
		if holder = ""; l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if holder == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot still held by %q 10s after both events ended", holder)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Events created all at once for one disruption group of maxConcurrent 1
// queue, Pending, and run one at a time; the slot is taken before the
// claim, so the sla clock (which starts at the claim) does not run while
// an event waits: the last one waits longer than its transition's sla and
// still Succeeds (issue 13.2).
func TestQueueDoesNotSpendSla(t *testing.T) {
	nodes := []string{"queue-a", "queue-b", "queue-c"}
	gates := map[string]*gateDriver{}
	lc := clients(t, env.AdminConfig())
	ctx := context.Background()
	const sla = 10 * time.Second
	for _, n := range nodes {
		gates[n] = newGateDriver("queue", true, "work")
		newNode(t, n)
		startAgent(t, n, agentOpts{retention: time.Hour, extra: []drivers.Driver{gates[n]}})
	}
	for _, n := range nodes {
		waitFor(t, "transitions", 30*time.Second, func() bool {
			_, err := lc.Transitions.Get(ctx, transitionName(n, "queue"), metav1.GetOptions{})
			return err == nil
		})
		// An admin's transition for the driver, with a short sla.
		pub, err := lc.Transitions.Get(ctx, transitionName(n, "queue"), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		own := &v1alpha1.LifecycleTransition{ObjectMeta: metav1.ObjectMeta{Name: transitionName(n, "queue") + "-sla"}, Spec: pub.Spec}
		own.Spec.Sla = &metav1.Duration{Duration: sla}
		if _, err := lc.Transitions.Create(ctx, own, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	d := &v1alpha1.DisruptionBudget{Group: "queue-rack", MaxConcurrent: 1}
	created := time.Now()
	for _, n := range nodes {
		createEvent(t, "q-"+n, n, transitionName(n, "queue")+"-sla", nil, d)
	}
	done := map[string]bool{}
	for round := range nodes {
		// Exactly one event runs; the others are Pending, saying they wait.
		var running string
		waitFor(t, fmt.Sprintf("round %d: one event claimed", round), 30*time.Second, func() bool {
			running = ""
			claimed := 0
			for _, n := range nodes {
				ev, err := lc.Events.Get(ctx, "q-"+n, metav1.GetOptions{})
				if err != nil {
					return false
				}
				switch ev.Status.ClaimStatus {
				case v1alpha1.LifecycleEventClaimed:
					claimed++
					running = n
				case v1alpha1.LifecycleEventPending, "":
				default:
					if !done[n] {
						t.Fatalf("q-%s ended %s while the queue ran: %s", n, ev.Status.ClaimStatus, ev.Status.Message)
					}
				}
			}
			if claimed > 1 {
				t.Fatalf("round %d: %d events Claimed at once in a group of maxConcurrent 1", round, claimed)
			}
			return claimed == 1
		})
		time.Sleep(5 * time.Second) // each runs 5 s, 5 s under its sla (a margin for a slow claim); the last waits 10 s, its sla, then runs 5 s more
		gates[running].open("work")
		ev := waitEvent(t, "q-"+running, 30*time.Second)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("round %d: q-%s ended %s: %s", round, running, ev.Status.ClaimStatus, ev.Status.Message)
		}
		done[running] = true
	}
	if waited := time.Since(created); waited < sla+3*time.Second {
		t.Fatalf("the queue took %s: not longer than the sla (%s), so the test proved nothing", waited.Round(time.Millisecond), sla)
	}
}
