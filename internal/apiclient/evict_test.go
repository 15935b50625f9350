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

// TestBudgetWake: a budget update wakes at most disruptionsAllowed of the
// pods it selects, longest waiting first, in its own namespace only; a
// budget that allows nothing, selects nothing or another app wakes none.
func TestBudgetWake(t *testing.T) {
	b := newBudgetWaiters()
	pod := func(ns, app string) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Labels: map[string]string{"app": app}}}
	}
	pdb := func(ns, app string, allowed int32) *policyv1.PodDisruptionBudget {
		p := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns}, Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: allowed}}
		if app != "" {
			p.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}
		}
		return p
	}
	web1, web2, web3 := b.add(pod("a", "web")), b.add(pod("a", "web")), b.add(pod("a", "web"))
	db := b.add(pod("a", "db"))
	other := b.add(pod("b", "web"))

	b.wake(pdb("a", "web", 0))
	b.wake(pdb("a", "", 5))
	b.wake(pdb("a", "cache", 5))
	for _, w := range []*budgetWaiter{web1, web2, web3, db, other} {
		if woken(w) {
			t.Fatal("woken by a budget that allows nothing, selects nothing or another app")
		}
	}
	b.wake(pdb("a", "web", 1))
	if !woken(web1) || woken(web2) || woken(web3) || woken(db) || woken(other) {
		t.Fatal("a budget allowing one disruption must wake exactly the longest-waiting pod it selects")
	}
	b.wake(pdb("a", "web", 5))
	if !woken(web2) || !woken(web3) || woken(db) || woken(other) {
		t.Fatal("a budget allowing five must wake the two web pods left, in namespace a only")
	}
	b.remove(db)
	b.remove(other)
	b.remove(web1) // already woken and removed: a no-op
	if len(b.byNS) != 0 {
		t.Fatalf("waiters left: %v", b.byNS)
	}
}
