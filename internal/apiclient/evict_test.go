package apiclient

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func woken(w *budgetWaiter) bool {
	select {
	case <-w.ch:
		return true
	default:
		return false
	}
}

func testPod(ns, app string) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Labels: map[string]string{"app": app}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
}

func testPDB(ns, name, app string, allowed int32) *policyv1.PodDisruptionBudget {
	p := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed}}
	if app != "" {
		p.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
	}
	return p
}

// TestBudgetWake: a budget update wakes at most disruptionsAllowed of the
// pods it selects, longest waiting first, in its own namespace only; a
// budget that allows nothing, selects nothing or another app wakes none;
// a deleted budget wakes all it selected; a watch that stops wakes none
// (the list after it does, where a budget is free).
func TestBudgetWake(t *testing.T) {
	b := newBudgets()
	web1, web2, web3 := b.add(testPod("a", "web")), b.add(testPod("a", "web")), b.add(testPod("a", "web"))
	db := b.add(testPod("a", "db"))
	other := b.add(testPod("b", "web"))

	b.update(testPDB("a", "web", "web", 0))
	b.update(testPDB("a", "all", "", 5))
	b.update(testPDB("a", "cache", "cache", 5))
	for _, w := range []*budgetWaiter{web1, web2, web3, db, other} {
		if woken(w) {
			t.Fatal("woken by a budget that allows nothing, selects nothing or another app")
		}
	}
	b.update(testPDB("a", "web", "web", 1))
	if !woken(web1) || woken(web2) || woken(web3) || woken(db) || woken(other) {
		t.Fatal("a budget allowing one disruption must wake exactly the longest-waiting pod it selects")
	}
	b.update(testPDB("a", "web", "web", 5))
	if !woken(web2) || !woken(web3) || woken(db) || woken(other) {
		t.Fatal("a budget allowing five must wake the two web pods left, in namespace a only")
	}
	b.update(testPDB("a", "db", "db", 0))
	b.deleted(testPDB("a", "db", "db", 0))
	if !woken(db) {
		t.Fatal("a deleted budget must wake the pods it held back")
	}
	b.setCurrent(true)
	b.setCurrent(false)
	if woken(other) {
		t.Fatal("a watch that stops woke a held pod: every restart would send an eviction per held pod at once")
	}
	b.update(testPDB("b", "web", "web", 1)) // the next list finds it free
	if !woken(other) {
		t.Fatal("the list after a restart must wake the pods its budgets allow")
	}
	if len(b.waiters) != 0 {
		t.Fatalf("waiters left: %v", b.waiters)
	}
}

// TestBudgetTake: with a current cache a Ready pod is sent only when every
// budget selecting it allows a disruption, taking one from each; a refusal
// empties them; restore gives back; a forced attempt (the back-off), a pod
// that is not Ready and a cache that is not current always send.
func TestBudgetTake(t *testing.T) {
	b := newBudgets()
	web := testPod("a", "web")
	if !b.take(web, false) {
		t.Fatal("no budgets known and the cache not current: must send")
	}
	b.update(testPDB("a", "web", "web", 2))
	b.update(testPDB("a", "all-web", "web", 1))
	b.setCurrent(true)
	if !b.take(web, false) {
		t.Fatal("both budgets allow one: must send")
	}
	if b.take(web, false) {
		t.Fatal("all-web allowed one and gave it: must hold back")
	}
	if got := b.why(web); got != "PodDisruptionBudget: The disruption budget all-web needs 0 healthy pods and has 0 currently" {
		t.Fatalf("why = %q", got)
	}
	b.restore(web) // that eviction failed otherwise
	if !b.take(web, false) {
		t.Fatal("restored: must send")
	}
	b.refused(web)
	if b.take(web, false) {
		t.Fatal("after a 429 both allow nothing")
	}
	if !b.take(web, true) {
		t.Fatal("the back-off's turn must send whatever the cache says")
	}
	if !b.take(testPod("a", "db"), false) {
		t.Fatal("a pod no budget selects must be sent")
	}
	crashing := testPod("a", "web")
	crashing.Status.Conditions[0].Status = corev1.ConditionFalse
	if !b.take(crashing, false) {
		t.Fatal("a pod that is not Ready must be sent: the server may evict it under unhealthyPodEvictionPolicy")
	}
	b.setCurrent(false)
	if !b.take(web, false) {
		t.Fatal("a cache that is not current must not hold pods back")
	}
}
