package main

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// runControllerStandIn is NOT kube-controller-manager. The demo and the
// sandbox start none (it is a build of its own, minutes on a cold machine,
// for the tests that need more of it), so this loop does the two things of
// it they depend on, until ctx ends:
//
//   - the serviceaccount controller's: a "default" ServiceAccount in every
//     namespace (the ServiceAccount admission plugin refuses pods without);
//   - the disruption controller's: each PodDisruptionBudget's status
//     (observedGeneration, currentHealthy, desiredHealthy, expectedPods,
//     disruptionsAllowed, the DisruptionAllowed condition) from the Ready
//     pods it selects, honouring status.disruptedPods, which the eviction
//     API writes before it deletes a pod. PDBs with minAvailable as a number
//     only (the demo's and the sandbox's): others are left alone.
//
// The eviction itself, the budget's check and its decrement, stay the real
// kube-apiserver's.
func runControllerStandIn(ctx context.Context, cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	for _, w := range []func(context.Context, metav1.ListOptions) (watch.Interface, error){
		cs.CoreV1().Namespaces().Watch,
		cs.CoreV1().Pods("").Watch,
		cs.PolicyV1().PodDisruptionBudgets("").Watch,
	} {
		go watchLoop(ctx, w, poke)
	}
	go func() {
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			reconcile(ctx, cs)
			select {
			case <-ctx.Done():
				return
			case <-kick:
			case <-t.C:
			}
		}
	}()
	return nil
}

// watchLoop calls poke on every event of watch, watching again when it ends.
func watchLoop(ctx context.Context, w func(context.Context, metav1.ListOptions) (watch.Interface, error), poke func()) {
	for ctx.Err() == nil {
		wi, err := w(ctx, metav1.ListOptions{})
		if err == nil {
			for range wi.ResultChan() {
				poke()
			}
			wi.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// disruptionTimeout is how long an entry of status.disruptedPods keeps its
// pod out of the healthy count when the pod is not deleted (as the
// disruption controller's DeletionTimeout).
const disruptionTimeout = 2 * time.Minute

func reconcile(ctx context.Context, cs kubernetes.Interface) {
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for _, ns := range nss.Items {
		if ns.DeletionTimestamp != nil {
			continue
		}
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		if _, err := cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			continue
		}
	}
	// The budget is read before its pods: an eviction between the two
	// reads changed its resourceVersion, and UpdateStatus then conflicts
	// (the next round computes again).
	pdbs, err := cs.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	for i := range pdbs.Items {
		pdb := &pdbs.Items[i]
		if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.StrVal != "" || pdb.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			continue
		}
		pods, err := cs.CoreV1().Pods(pdb.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
		if err != nil {
			continue
		}
		st := pdb.Status.DeepCopy()
		now := time.Now()
		disrupted := map[string]metav1.Time{}
		healthy := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			if t, ok := st.DisruptedPods[p.Name]; ok && now.Sub(t.Time) < disruptionTimeout {
				disrupted[p.Name] = t
				continue
			}
			if podReady(&p) {
				healthy++
			}
		}
		desired := int32(pdb.Spec.MinAvailable.IntValue())
		st.ObservedGeneration = pdb.Generation
		st.DisruptedPods = disrupted
		st.CurrentHealthy = int32(healthy)
		st.DesiredHealthy = desired
		st.ExpectedPods = int32(len(pods.Items))
		st.DisruptionsAllowed = max(0, int32(healthy)-desired)
		cond := metav1.Condition{Type: policyv1.DisruptionAllowedCondition, Status: metav1.ConditionTrue,
			Reason: policyv1.SufficientPodsReason, ObservedGeneration: pdb.Generation}
		if st.DisruptionsAllowed == 0 {
			cond.Status, cond.Reason = metav1.ConditionFalse, policyv1.InsufficientPodsReason
		}
		meta.SetStatusCondition(&st.Conditions, cond)
		if statusEqual(&pdb.Status, st) {
			continue
		}
		pdb.Status = *st
		_, _ = cs.PolicyV1().PodDisruptionBudgets(pdb.Namespace).UpdateStatus(ctx, pdb, metav1.UpdateOptions{})
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func statusEqual(a, b *policyv1.PodDisruptionBudgetStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.CurrentHealthy != b.CurrentHealthy || a.DesiredHealthy != b.DesiredHealthy ||
		a.ExpectedPods != b.ExpectedPods || a.DisruptionsAllowed != b.DisruptionsAllowed || len(a.DisruptedPods) != len(b.DisruptedPods) {
		return false
	}
	for k, v := range a.DisruptedPods {
		if w, ok := b.DisruptedPods[k]; !ok || !v.Equal(&w) {
			return false
		}
	}
	ca, cb := meta.FindStatusCondition(a.Conditions, policyv1.DisruptionAllowedCondition), meta.FindStatusCondition(b.Conditions, policyv1.DisruptionAllowedCondition)
	return ca != nil && cb != nil && ca.Status == cb.Status && ca.Reason == cb.Reason && ca.ObservedGeneration == cb.ObservedGeneration
}
