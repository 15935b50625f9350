package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

func startWorkload(t *testing.T, ns, node, spare string, replicas, minAvailable int) *testenv.Workload {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &testenv.Workload{Namespace: ns, Name: "web", Node: node, Spare: spare, Replicas: replicas, MinAvailable: minAvailable}
	if err := w.Start(ctx, env.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, env.AdminConfig(), node, replicas); err != nil {
		t.Fatal(err)
	}
	return w
}

func stepStates(ev *v1alpha1.LifecycleEvent) string {
	var s []string
	for _, st := range ev.Status.Steps {
		s = append(s, st.Name+"="+string(st.State))
	}
	return strings.Join(s, ",")
}

func TestDrainThenUncordon(t *testing.T) {
	node, spare := "drain-node", "drain-spare"
	newNode(t, node)
	newNode(t, spare)
	w := startWorkload(t, "drain-ns", node, spare, 3, 2)
	a := startAgent(t, node, agentOpts{retention: time.Hour})

	waitFor(t, "published transitions", 30*time.Second, func() bool {
		l, err := clients(t, env.AdminConfig()).Transitions.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		return err == nil && len(l.Items) >= 2
	})
	lt, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "drain"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lt.Spec.Start != "DrainStarted" || lt.Spec.End != "DrainComplete" || lt.Spec.Driver != "lifecycle-agent.x-k8s.io/drain" ||
		len(lt.OwnerReferences) != 1 || lt.OwnerReferences[0].Kind != "Node" {
		t.Fatalf("published transition %+v %+v", lt.Spec, lt.OwnerReferences)
	}

	createEvent(t, "drain-1", node, transitionName(node, "drain"), nil, nil)
	ev := waitEvent(t, "drain-1", 2*time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("drain ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if got := stepStates(ev); got != "cordon=Done,evict=Done,wait-empty=Done" {
		t.Fatalf("steps = %s", got)
	}
	if ev.Status.Driver.Name != "lifecycle-agent.x-k8s.io/drain" || ev.Status.Holder == nil || ev.Status.Holder.Identity == "" ||
		ev.Status.Sla == nil || ev.Status.CompletionTime == nil {
		t.Fatalf("status fields missing: %+v", ev.Status)
	}
	if c := findCond(ev.Status.Conditions, v1alpha1.ConditionProgressing); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "Succeeded" {
		t.Fatalf("Progressing condition = %+v", c)
	}
	n := getNode(t, node)
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "drain-1" {
		t.Fatalf("node after drain: unschedulable=%v annotations=%v", n.Spec.Unschedulable, n.Annotations)
	}
	if c := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); c == nil || c.Status != corev1.ConditionFalse || c.Reason != "DrainComplete" ||
		c.Message != fmt.Sprintf("Lifecycle Transition '%s' (event drain-1)", transitionName(node, "drain")) {
		t.Fatalf("LifecycleTransition node condition = %+v", c)
	}
	if c := nodeCondition(n, v1alpha1.NodeConditionDrained); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("Drained node condition = %+v", c)
	}
	if c := nodeCondition(n, string(corev1.NodeReady)); c == nil || c.Status != corev1.ConditionTrue {
		t.Fatalf("the kubelet's Ready condition was touched: %+v", c)
	}
	if left := podsOn(t, node); len(left) != 0 {
		t.Fatalf("pods left on %s: %v", node, left)
	}
	if w.Replaced() != 3 {
		t.Fatalf("%d pods replaced on the spare node; want 3", w.Replaced())
	}
	// One Kubernetes Event, with the outcome, for the whole event.
	var seen string
	waitFor(t, "the outcome's Kubernetes Event", 30*time.Second, func() bool {
		l, err := kubernetes.NewForConfigOrDie(env.AdminConfig()).CoreV1().Events(metav1.NamespaceDefault).List(context.Background(),
			metav1.ListOptions{FieldSelector: "involvedObject.name=drain-1"})
		if err != nil {
			return false
		}
		seen = ""
		for _, e := range l.Items {
			seen += fmt.Sprintf("%s/%s %q; ", e.Type, e.Reason, e.Message)
		}
		return len(l.Items) == 1 && l.Items[0].Type == corev1.EventTypeNormal && l.Items[0].Reason == "DrainComplete" &&
			l.Items[0].Source.Host == node && l.Items[0].InvolvedObject.Kind == "LifecycleEvent"
	})
	time.Sleep(time.Second) // nothing else arrives later
	if l, _ := kubernetes.NewForConfigOrDie(env.AdminConfig()).CoreV1().Events(metav1.NamespaceDefault).List(context.Background(),
		metav1.ListOptions{FieldSelector: "involvedObject.name=drain-1"}); len(l.Items) != 1 {
		t.Fatalf("Kubernetes Events for drain-1: %d, want 1 (%s)", len(l.Items), seen)
	}

	createEvent(t, "uncordon-1", node, transitionName(node, "uncordon"), nil, nil)
	ev = waitEvent(t, "uncordon-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("uncordon ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	n = getNode(t, node)
	if n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
		t.Fatalf("node after uncordon: unschedulable=%v annotations=%v", n.Spec.Unschedulable, n.Annotations)
	}
	if c := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); c == nil || c.Reason != "MaintenanceComplete" {
		t.Fatalf("LifecycleTransition node condition after uncordon = %+v", c)
	}
	_ = a
}

func findCond(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

func TestUncordonRefusesForeignCordon(t *testing.T) {
	node := "foreign-node"
	newNode(t, node)
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, []byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "uncordon"), metav1.GetOptions{})
		return err == nil
	})
	createEvent(t, "foreign-1", node, transitionName(node, "uncordon"), nil, nil)
	ev := waitEvent(t, "foreign-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "force=true") {
		t.Fatalf("got %s %q; want Failed mentioning force=true", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if !getNode(t, node).Spec.Unschedulable {
		t.Fatal("a cordon that is not ours was removed")
	}
	createEvent(t, "foreign-2", node, transitionName(node, "uncordon"), map[string]string{"force": "true"}, nil)
	ev = waitEvent(t, "foreign-2", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || getNode(t, node).Spec.Unschedulable {
		t.Fatalf("force=true: got %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
}

func TestBadInputFailsWithReason(t *testing.T) {
	node := "badinput-node"
	newNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "drain"), metav1.GetOptions{})
		return err == nil
	})
	tests := []struct {
		name, transition string
		params           map[string]string
		says             string
	}{
		{name: "bad-grace", transition: transitionName(node, "drain"), params: map[string]string{"gracePeriodSeconds": "soon"}, says: "parameters.gracePeriodSeconds"},
		{name: "unknown-param", transition: transitionName(node, "drain"), params: map[string]string{"colour": "red"}, says: `unknown parameter "colour"`},
		{name: "bad-selector", transition: transitionName(node, "drain"), params: map[string]string{"podSelector": "a=(b"}, says: "parameters.podSelector"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			createEvent(t, "bad-"+tc.name, node, tc.transition, tc.params, nil)
			ev := waitEvent(t, "bad-"+tc.name, time.Minute)
			if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, tc.says) {
				t.Fatalf("got %s %q; want Failed saying %q", ev.Status.ClaimStatus, ev.Status.Message, tc.says)
			}
		})
	}
	if getNode(t, node).Spec.Unschedulable {
		t.Fatal("a refused event changed the node")
	}

	// An event whose transition does not exist (yet) is not Failed: it
	// waits, Pending, saying why, and runs once the transition appears
	// (`kubectl apply` of both in any order works).
	lc := clients(t, env.AdminConfig())
	createEvent(t, "bad-no-transition", node, "later-transition", nil, nil)
	waitFor(t, "the event Pending, naming the missing transition", 20*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "bad-no-transition", metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventPending && strings.Contains(ev.Status.Message, `LifecycleTransition "later-transition" not found`)
	})
	lt := validLT("later-transition")
	lt.Spec.NodeName = ptr(node)
	lt.Spec.Driver = "lifecycle-agent.x-k8s.io/uncordon"
	lt.Spec.Start, lt.Spec.End = "Uncordoning", "MaintenanceComplete"
	if _, err := lc.Transitions.Create(context.Background(), lt, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := waitEvent(t, "bad-no-transition", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("once its transition exists: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
}

// A PDB that allows no eviction: the status names the PDB and the pod, and
// the drain stops cleanly at the sla (SlaExpired, our cordon undone).
func TestPDBBlocksUntilSla(t *testing.T) {
	node := "pdb-node"
	newNode(t, node)
	startWorkload(t, "pdb-ns", node, "", 2, 2)
	startAgent(t, node, agentOpts{retention: time.Hour})
	short := validLT("pdb-node-drain-8s")
	short.Spec.NodeName = ptr(node)
	short.Spec.Sla = &metav1.Duration{Duration: 8 * time.Second}
	if _, err := clients(t, env.AdminConfig()).Transitions.Create(context.Background(), short, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createEvent(t, "pdb-1", node, short.Name, nil, nil)
	sawMessage := ""
	waitFor(t, "a status message naming the PDB", 30*time.Second, func() bool {
		ev, err := clients(t, env.AdminConfig()).Events.Get(context.Background(), "pdb-1", metav1.GetOptions{})
		if err == nil && strings.Contains(ev.Status.Message, "PodDisruptionBudget") {
			sawMessage = ev.Status.Message
			return true
		}
		return false
	})
	if !strings.Contains(sawMessage, "pdb-ns/web-") || !strings.Contains(sawMessage, "disruption budget web") {
		t.Fatalf("message %q should name the pod and the PDB", sawMessage)
	}
	ev := waitEvent(t, "pdb-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSlaExpired {
		t.Fatalf("got %s %q; want SlaExpired", ev.Status.ClaimStatus, ev.Status.Message)
	}
	n := getNode(t, node)
	if n.Spec.Unschedulable {
		t.Fatal("after SlaExpired our cordon should be undone")
	}
	if c := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); c == nil || c.Reason != "SlaExpired" {
		t.Fatalf("LifecycleTransition node condition = %+v", c)
	}
	if len(podsOn(t, node)) != 2 {
		t.Fatalf("pods on node = %v; the PDB allowed no eviction", podsOn(t, node))
	}
}

// Deleting a running event cancels it at the next safe point.
func TestDeleteCancels(t *testing.T) {
	node := "cancel-node"
	newNode(t, node)
	startWorkload(t, "cancel-ns", node, "", 2, 2)
	startAgent(t, node, agentOpts{retention: time.Hour})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "drain"), metav1.GetOptions{})
		return err == nil
	})
	createEvent(t, "cancel-1", node, transitionName(node, "drain"), nil, nil)
	lc := clients(t, env.AdminConfig())
	waitFor(t, "the evict step", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "cancel-1", metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "evict"
	})
	if err := lc.Events.Delete(context.Background(), "cancel-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the event to go (finalizer removed)", 30*time.Second, func() bool {
		_, err := lc.Events.Get(context.Background(), "cancel-1", metav1.GetOptions{})
		return err != nil
	})
	if getNode(t, node).Spec.Unschedulable {
		t.Fatal("the cancelled drain left the node cordoned")
	}
}

func TestRetentionZeroDeletesAtOnce(t *testing.T) {
	node := "retention-node"
	newNode(t, node)
	startAgent(t, node, agentOpts{retention: 0})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "uncordon"), metav1.GetOptions{})
		return err == nil
	})
	lc := clients(t, env.AdminConfig())
	// A watch sees every state the event passes through: it must end
	// Succeeded (visible to anyone watching) and then be deleted.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := watchEventNamed(ctx, t, lc, "ret-1")
	createEvent(t, "ret-1", node, transitionName(node, "uncordon"), nil, nil)
	sawEnd, deleted := false, false
	for ev := range w.ResultChan() {
		le, ok := ev.Object.(*v1alpha1.LifecycleEvent)
		if !ok {
			continue
		}
		if le.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded {
			sawEnd = true
		}
		if ev.Type == watch.Deleted {
			deleted = true
			break
		}
	}
	if !deleted {
		t.Fatal("the finished event was not deleted within a minute (eventRetention 0)")
	}
	if !sawEnd {
		t.Fatal("the event was deleted without ever showing Succeeded")
	}
	if _, err := lc.Events.Get(context.Background(), "ret-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the delete: %v, want NotFound", err)
	}
}
