package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

func clients(t *testing.T, cfg *rest.Config) *apiclient.LifecycleClients {
	t.Helper()
	c, err := apiclient.NewLifecycleClients(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// watchEventNamed watches the one LifecycleEvent called name (which need
// not exist yet) until ctx ends; the watch stops when the test ends.
func watchEventNamed(ctx context.Context, t *testing.T, lc *apiclient.LifecycleClients, name string) watch.Interface {
	t.Helper()
	w, err := lc.Events.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

func ptr[T any](v T) *T { return &v }

func validLT(name string) *v1alpha1.LifecycleTransition {
	return &v1alpha1.LifecycleTransition{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LifecycleTransitionSpec{
			Start: "DrainStarted", End: "DrainComplete", NodeName: ptr("node-a"),
			Sla: &metav1.Duration{Duration: time.Hour}, Driver: "lifecycle-agent.x-k8s.io/drain",
		},
	}
}

func validLE(name, node string) *v1alpha1.LifecycleEvent {
	return &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LifecycleEventSpec{
			TransitionName: "node-a-drain", BindingNode: node,
			Parameters: map[string]string{"gracePeriodSeconds": "30"},
			Disruption: &v1alpha1.DisruptionBudget{Group: "rack-12", MaxConcurrent: 2},
		},
	}
}

func TestInvalidObjectsRefusedNamingTheField(t *testing.T) {
	ctx := context.Background()
	admin := clients(t, env.AdminConfig())
	many := map[string]string{}
	for i := 0; i < 33; i++ {
		many[fmt.Sprintf("p%d", i)] = "v"
	}
	lt := func(f func(*v1alpha1.LifecycleTransitionSpec)) *v1alpha1.LifecycleTransition {
		o := validLT("")
		f(&o.Spec)
		return o
	}
	le := func(f func(*v1alpha1.LifecycleEventSpec)) *v1alpha1.LifecycleEvent {
		o := validLE("", "node-a")
		f(&o.Spec)
		return o
	}
	tests := []struct {
		name  string
		lt    *v1alpha1.LifecycleTransition
		le    *v1alpha1.LifecycleEvent
		field string // must appear in the error
		says  string // and so must this
	}{
		{name: "transition without start", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Start = "" }), field: "spec.start", says: "should be at least 1 chars long"},
		{name: "transition without end", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.End = "" }), field: "spec.end", says: "should be at least 1 chars long"},
		{name: "start equals end", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.End = s.Start }), field: "spec.end", says: "start and end must differ"},
		{name: "start not CamelCase", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Start = "drainStarted" }), field: "spec.start", says: "should match"},
		{name: "start too long", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Start = v1alpha1.StateName("A" + strings.Repeat("b", 63)) }), field: "spec.start", says: "Too long"},
		{name: "end with a space", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.End = "Drain Complete" }), field: "spec.end", says: "should match"},
		{name: "transition without driver", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Driver = "" }), field: "spec.driver", says: "should be at least 3 chars long"},
		{name: "driver without domain", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Driver = "drain" }), field: "spec.driver", says: "should match"},
		{name: "driver with bad domain", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Driver = "Lifecycle_Agent/drain" }), field: "spec.driver", says: "should match"},
		{name: "driver name too long", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Driver = "example.com/" + strings.Repeat("a", 64) }), field: "spec.driver", says: "at most 63"},
		{name: "no node scope", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.NodeName = nil }), field: "spec", says: "exactly one of nodeName, nodeSelector or allNodes"},
		{name: "nodeName and allNodes", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.AllNodes = ptr(true) }), field: "spec", says: "exactly one of nodeName, nodeSelector or allNodes"},
		{name: "allNodes false alone", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.NodeName = nil; s.AllNodes = ptr(false) }), field: "spec", says: "exactly one of nodeName, nodeSelector or allNodes"},
		{name: "nodeName and nodeSelector", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) {
			s.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}
		}), field: "spec", says: "exactly one of nodeName, nodeSelector or allNodes"},
		{name: "nodeName not a DNS subdomain", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.NodeName = ptr("Node_A") }), field: "spec.nodeName", says: "should match"},
		{name: "sla zero", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Sla = &metav1.Duration{} }), field: "spec.sla", says: "sla must be positive"},
		{name: "sla negative", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Sla = &metav1.Duration{Duration: -5 * time.Minute} }), field: "spec.sla", says: "sla must be positive"},
		{name: "sla over 30 days", lt: lt(func(s *v1alpha1.LifecycleTransitionSpec) { s.Sla = &metav1.Duration{Duration: 721 * time.Hour} }), field: "spec.sla", says: "at most 720h"},
		{name: "event without transitionName", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.TransitionName = "" }), field: "spec.transitionName", says: "should be at least 1 chars long"},
		{name: "transitionName with a space", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.TransitionName = "drain now" }), field: "spec.transitionName", says: "should match"},
		{name: "event without bindingNode", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.BindingNode = "" }), field: "spec.bindingNode", says: "should be at least 1 chars long"},
		{name: "bindingNode upper case", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.BindingNode = "Node-A" }), field: "spec.bindingNode", says: "should match"},
		{name: "bindingNode too long", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.BindingNode = strings.Repeat("a", 254) }), field: "spec.bindingNode", says: "Too long"},
		{name: "33 parameters", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Parameters = many }), field: "spec.parameters", says: "Too many"},
		{name: "parameter name with a space", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Parameters = map[string]string{"bad key": "v"} }), field: "spec.parameters", says: "parameter names must be"},
		{name: "parameter name too long", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Parameters = map[string]string{strings.Repeat("k", 64): "v"} }), field: "spec.parameters", says: "parameter names must be"},
		{name: "parameter value too long", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Parameters = map[string]string{"k": strings.Repeat("v", 1025)} }), field: "spec.parameters", says: "at most 1024"},
		{name: "disruption maxConcurrent zero", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Disruption.MaxConcurrent = 0 }), field: "spec.disruption.maxConcurrent", says: "should be greater than or equal to 1"},
		{name: "disruption group with a space", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Disruption.Group = "rack 12" }), field: "spec.disruption.group", says: "should match"},
		{name: "disruption without group", le: le(func(s *v1alpha1.LifecycleEventSpec) { s.Disruption.Group = "" }), field: "spec.disruption.group", says: "should be at least 1 chars long"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.lt != nil {
				tc.lt.Name = fmt.Sprintf("invalid-lt-%d", i)
				_, err = admin.Transitions.Create(ctx, tc.lt, metav1.CreateOptions{})
			} else {
				tc.le.Name = fmt.Sprintf("invalid-le-%d", i)
				_, err = admin.Events.Create(ctx, tc.le, metav1.CreateOptions{})
			}
			if err == nil {
				t.Fatalf("created; want refusal naming %s", tc.field)
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("got %v; want 422 Invalid", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.field+":") || !strings.Contains(msg, tc.says) {
				t.Fatalf("error %q\nshould name %q and say %q", msg, tc.field, tc.says)
			}
		})
	}
	if len(tests) < 25 {
		t.Fatalf("only %d invalid objects; the contract asks for at least 25", len(tests))
	}
}

func TestValidObjectsAndImmutableSpec(t *testing.T) {
	ctx := context.Background()
	admin := clients(t, env.AdminConfig())
	lt := validLT("valid-lt")
	if _, err := admin.Transitions.Create(ctx, lt, metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid transition refused: %v", err)
	}
	sel := validLT("valid-lt-selector")
	sel.Spec.NodeName = nil
	sel.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}}}}
	if _, err := admin.Transitions.Create(ctx, sel, metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid selector transition refused: %v", err)
	}
	all := validLT("valid-lt-all")
	all.Spec.NodeName, all.Spec.AllNodes, all.Spec.Sla = nil, ptr(true), nil
	if _, err := admin.Transitions.Create(ctx, all, metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid allNodes transition refused: %v", err)
	}
	ev, err := admin.Events.Create(ctx, validLE("valid-le", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("valid event refused: %v", err)
	}
	ev.Spec.BindingNode = "node-b"
	_, err = admin.Events.Update(ctx, ev, metav1.UpdateOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec: Invalid value") || !strings.Contains(err.Error(), "spec is immutable") {
		t.Fatalf("spec update: got %v; want 'spec is immutable'", err)
	}
	got, _ := admin.Transitions.Get(ctx, "valid-lt", metav1.GetOptions{})
	got.Spec.End = "Drained"
	if _, err := admin.Transitions.Update(ctx, got, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "spec is immutable") {
		t.Fatalf("transition spec update: got %v; want 'spec is immutable'", err)
	}
	// A bad claimStatus is refused on the status subresource too.
	ev, _ = admin.Events.Get(ctx, "valid-le", metav1.GetOptions{})
	ev.Status.ClaimStatus = "Done"
	if _, err := admin.Events.UpdateStatus(ctx, ev, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "status.claimStatus") {
		t.Fatalf("bad claimStatus: got %v; want refusal naming status.claimStatus", err)
	}
}

func TestFieldSelectorOnBindingNode(t *testing.T) {
	ctx := context.Background()
	admin := clients(t, env.AdminConfig())
	for _, n := range []struct{ name, node string }{{"sel-a1", "sel-node-a"}, {"sel-a2", "sel-node-a"}, {"sel-b1", "sel-node-b"}} {
		if _, err := admin.Events.Create(ctx, validLE(n.name, n.node), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := admin.Events.List(ctx, apiclient.BindingNodeSelector("sel-node-a"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range list.Items {
		names = append(names, e.Name)
	}
	if strings.Join(names, ",") != "sel-a1,sel-a2" {
		t.Fatalf("field selector spec.bindingNode=sel-node-a returned %v; want [sel-a1 sel-a2]", names)
	}
	// claimStatus is selectable too.
	if _, err := admin.Events.List(ctx, metav1.ListOptions{FieldSelector: "status.claimStatus=Pending"}); err != nil {
		t.Fatalf("status.claimStatus must be a selectable field: %v", err)
	}
	if _, err := admin.Events.List(ctx, metav1.ListOptions{FieldSelector: "spec.transitionName=x"}); err == nil {
		t.Fatal("spec.transitionName is not selectable; the server should say so")
	}
}

func TestNodeScoping(t *testing.T) {
	ctx := context.Background()
	admin := clients(t, env.AdminConfig())
	nodeA := clients(t, env.NodeConfig("node-a"))
	core := kubernetes.NewForConfigOrDie(env.AdminConfig())
	for _, n := range []string{"node-a", "node-b"} {
		_, err := core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, n := range []struct{ name, node string }{{"scope-a", "node-a"}, {"scope-b", "node-b"}} {
		if _, err := admin.Events.Create(ctx, validLE(n.name, n.node), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(c *apiclient.LifecycleClients, name string) error {
		ev, err := c.Events.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ev.Status.ClaimStatus = v1alpha1.LifecycleEventClaimed
		_, err = c.Events.UpdateStatus(ctx, ev, metav1.UpdateOptions{})
		return err
	}
	t.Run("node-a claims its own event", func(t *testing.T) {
		if err := claim(nodeA, "scope-a"); err != nil {
			t.Fatalf("node-a claiming an event bound to node-a: %v", err)
		}
	})
	t.Run("node-a cannot claim node-b's event", func(t *testing.T) {
		err := claim(nodeA, "scope-b")
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "node node-a may only claim or update LifecycleEvents bound to itself") {
			t.Fatalf("got %v; want Forbidden by the admission policy", err)
		}
	})
	t.Run("node-a cannot create an event for node-b", func(t *testing.T) {
		_, err := nodeA.Events.Create(ctx, validLE("scope-a-for-b", "node-b"), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "spec.bindingNode=node-b") {
			t.Fatalf("got %v; want Forbidden naming spec.bindingNode=node-b", err)
		}
	})
	t.Run("node-a cannot delete node-b's event", func(t *testing.T) {
		err := nodeA.Events.Delete(ctx, "scope-b", metav1.DeleteOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("got %v; want Forbidden", err)
		}
	})
	t.Run("node-a publishes its own transition", func(t *testing.T) {
		lt := validLT("node-a-drain-scope")
		if _, err := nodeA.Transitions.Create(ctx, lt, metav1.CreateOptions{}); err != nil {
			t.Fatalf("node-a creating a transition for itself: %v", err)
		}
	})
	t.Run("node-a cannot publish a transition for node-b", func(t *testing.T) {
		lt := validLT("node-b-drain-by-a")
		lt.Spec.NodeName = ptr("node-b")
		_, err := nodeA.Transitions.Create(ctx, lt, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "spec.nodeName=node-b") {
			t.Fatalf("got %v; want Forbidden naming spec.nodeName=node-b", err)
		}
	})
	t.Run("node-a cannot publish an allNodes transition", func(t *testing.T) {
		lt := validLT("all-by-a")
		lt.Spec.NodeName, lt.Spec.AllNodes = nil, ptr(true)
		_, err := nodeA.Transitions.Create(ctx, lt, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("got %v; want Forbidden", err)
		}
	})
	t.Run("node-a cannot patch node-b's status", func(t *testing.T) {
		nc := kubernetes.NewForConfigOrDie(env.NodeConfig("node-a"))
		patch := []byte(`{"status":{"conditions":[{"type":"LifecycleTransition","status":"True","reason":"DrainStarted"}]}}`)
		_, err := nc.CoreV1().Nodes().Patch(ctx, "node-b", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		if !apierrors.IsForbidden(err) {
			t.Fatalf("got %v; want Forbidden", err)
		}
		if _, err := nc.CoreV1().Nodes().Patch(ctx, "node-a", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("node-a patching its own status: %v", err)
		}
	})
	t.Run("a plain user without RBAC is refused", func(t *testing.T) {
		alice := clients(t, env.UserConfig("alice"))
		if _, err := alice.Events.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("list: got %v; want Forbidden", err)
		}
		if err := claim(alice, "scope-a"); !apierrors.IsForbidden(err) {
			t.Fatalf("claim: got %v; want Forbidden", err)
		}
	})
}

func TestConcurrentClaimsOneWins(t *testing.T) {
	ctx := context.Background()
	admin := clients(t, env.AdminConfig())
	if _, err := admin.Events.Create(ctx, validLE("race-1", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := clients(t, env.NodeConfig("node-a"))
	ev1, err := a.Events.Get(ctx, "race-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ev2 := ev1.DeepCopy()
	ev1.Status.ClaimStatus = v1alpha1.LifecycleEventClaimed
	ev1.Status.Holder = &v1alpha1.Holder{Identity: "agent-1"}
	ev2.Status.ClaimStatus = v1alpha1.LifecycleEventClaimed
	ev2.Status.Holder = &v1alpha1.Holder{Identity: "agent-2"}
	_, err1 := a.Events.UpdateStatus(ctx, ev1, metav1.UpdateOptions{})
	_, err2 := a.Events.UpdateStatus(ctx, ev2, metav1.UpdateOptions{})
	if err1 != nil {
		t.Fatalf("first claim: %v", err1)
	}
	if !apierrors.IsConflict(err2) {
		t.Fatalf("second claim with the same resourceVersion: got %v; want 409 Conflict", err2)
	}
	got, _ := a.Events.Get(ctx, "race-1", metav1.GetOptions{})
	if got.Status.Holder == nil || got.Status.Holder.Identity != "agent-1" {
		t.Fatalf("holder = %+v; want agent-1", got.Status.Holder)
	}
}

// The admission policy closes the Lease hole: with node-b's credentials, on
// the real apiserver, node-b cannot create or update node-a's node Lease,
// take or clear a slot node-a holds while it is live, or delete a Lease it
// does not hold; it may take an expired slot, and delete a Lease it holds.
func TestLeaseAdmission(t *testing.T) {
	ctx := context.Background()
	core := kubernetes.NewForConfigOrDie(env.AdminConfig())
	for _, n := range []string{"lease-a", "lease-b"} {
		if _, err := core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	a := clients(t, env.NodeConfig("lease-a")).Leases(v1alpha1.SystemNamespace)
	b := clients(t, env.NodeConfig("lease-b")).Leases(v1alpha1.SystemNamespace)
	lease := func(name, holder string, renewed time.Time) *v1alpha1.LifecycleLease {
		secs, rt := int32(40), metav1.NewMicroTime(renewed)
		return &v1alpha1.LifecycleLease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.SystemNamespace},
			Spec: coordv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &rt, RenewTime: &rt}}
	}
	forbidden := func(t *testing.T, err error, says string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), says) {
			t.Fatalf("got %v; want Forbidden saying %q", err, says)
		}
	}
	now := time.Now()
	if _, err := a.Create(ctx, lease("node-lease-a", "lease-a/1", now), metav1.CreateOptions{}); err != nil {
		t.Fatalf("lease-a creating its own node Lease: %v", err)
	}
	live, err := a.Create(ctx, lease("leasegrp-0", "lease-a/1", now), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("lease-a taking a free slot: %v", err)
	}
	t.Run("node-b cannot create node-a's node Lease", func(t *testing.T) {
		_, err := b.Create(ctx, lease("node-lease-c", "lease-b/1", now), metav1.CreateOptions{})
		forbidden(t, err, "may only write its own node Lease node-lease-b")
	})
	t.Run("node-b cannot take node-a's node Lease", func(t *testing.T) {
		l, err := b.Get(ctx, "node-lease-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		h := "lease-b/1"
		l.Spec.HolderIdentity = &h
		_, err = b.Update(ctx, l, metav1.UpdateOptions{})
		forbidden(t, err, "may only write its own node Lease")
	})
	t.Run("node-b cannot take a live slot", func(t *testing.T) {
		l := live.DeepCopy()
		h, rt := "lease-b/1", metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.RenewTime = &h, &rt
		_, err := b.Update(ctx, l, metav1.UpdateOptions{})
		forbidden(t, err, "leasegrp-0 is held by lease-a/1")
	})
	t.Run("node-b cannot clear a live slot", func(t *testing.T) {
		l := live.DeepCopy()
		empty := ""
		l.Spec.HolderIdentity = &empty
		_, err := b.Update(ctx, l, metav1.UpdateOptions{})
		forbidden(t, err, "only when it is free or expired")
	})
	t.Run("node-b cannot delete a Lease it does not hold", func(t *testing.T) {
		forbidden(t, b.Delete(ctx, "leasegrp-0", metav1.DeleteOptions{}), "may only delete a LifecycleLease it holds")
	})
	t.Run("node-b may take an expired slot and delete what it holds", func(t *testing.T) {
		old, err := a.Create(ctx, lease("leasegrp-1", "lease-a/1", now.Add(-5*time.Minute)), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		h, rt := "lease-b/1", metav1.NewMicroTime(time.Now())
		old.Spec.HolderIdentity, old.Spec.RenewTime = &h, &rt
		if _, err := b.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("node-b taking an expired slot: %v", err)
		}
		if err := b.Delete(ctx, "leasegrp-1", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("node-b deleting a slot it holds: %v", err)
		}
	})
}

// A group's circuit breaker on the real apiserver: a node identity creates
// it and adds failures (RecordBreakerFailure, idempotent), and the
// admission policy keeps it growing: a node cannot remove a failure, hold
// the breaker (to delete it), or delete it; an admin can delete it.
func TestBreakerAdmission(t *testing.T) {
	ctx := context.Background()
	core := kubernetes.NewForConfigOrDie(env.AdminConfig())
	for _, n := range []string{"breaker-a", "breaker-b"} {
		if _, err := core.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	nodeClient := func(node string) *apiclient.Client {
		c, err := apiclient.New(env.NodeConfig(node), node, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := nodeClient("breaker-a"), nodeClient("breaker-b")
	if got, err := a.BreakerFailures(ctx, "brk"); err != nil || len(got) != 0 {
		t.Fatalf("no breaker yet: %v, %v; want none", got, err)
	}
	if got, err := a.RecordBreakerFailure(ctx, "brk", "breaker-a-reboot-1"); err != nil || !slices.Equal(got, []string{"breaker-a-reboot-1"}) {
		t.Fatalf("node breaker-a creating the breaker: %v, %v", got, err)
	}
	if _, err := b.RecordBreakerFailure(ctx, "brk", "breaker-b-reboot-1"); err != nil {
		t.Fatalf("node breaker-b adding a failure: %v", err)
	}
	if got, err := b.RecordBreakerFailure(ctx, "brk", "breaker-b-reboot-1"); err != nil || len(got) != 2 {
		t.Fatalf("the same failure again: %v, %v; want the two, once each", got, err)
	}
	leases := clients(t, env.NodeConfig("breaker-b")).Leases(v1alpha1.SystemNamespace)
	l, err := leases.Get(ctx, apiclient.BreakerLeaseName("brk"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	forbidden := func(t *testing.T, err error, says string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), says) {
			t.Fatalf("got %v; want Forbidden saying %q", err, says)
		}
	}
	t.Run("a node cannot remove a failure", func(t *testing.T) {
		l := l.DeepCopy()
		l.Annotations[apiclient.AnnotationBreakerFailures] = "breaker-b-reboot-1"
		_, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		forbidden(t, err, "may only add failures to the circuit breaker brk-breaker")
	})
	t.Run("a node cannot hold the breaker", func(t *testing.T) {
		l := l.DeepCopy()
		h, secs, rt := "breaker-b/1", int32(40), metav1.NewMicroTime(time.Now())
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &h, &secs, &rt
		_, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		forbidden(t, err, "may not hold the circuit breaker brk-breaker")
	})
	t.Run("a node cannot delete the breaker", func(t *testing.T) {
		forbidden(t, leases.Delete(ctx, apiclient.BreakerLeaseName("brk"), metav1.DeleteOptions{}), "may only delete a LifecycleLease it holds")
	})
	t.Run("an admin resets it by deleting the Lease", func(t *testing.T) {
		admin := clients(t, env.AdminConfig()).Leases(v1alpha1.SystemNamespace)
		if err := admin.Delete(ctx, apiclient.BreakerLeaseName("brk"), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if got, err := a.BreakerFailures(ctx, "brk"); err != nil || len(got) != 0 {
			t.Fatalf("after the reset: %v, %v; want none", got, err)
		}
	})
}

// TestUpdatesCarryNoManagedFields: the agent's updates (the claim, the
// finalizer, a status, the node Lease renewed and given back) send no
// managedFields, and the server keeps the stored ones: the admin's entry
// from the create stays, and the agent's own updates are recorded beside
// it. Sent back, they were about a third of an event's body, decoded by
// the server for nothing (docs/benchmarks.md, section 2).
func TestUpdatesCarryNoManagedFields(t *testing.T) {
	ctx := context.Background()
	const node = "lean-node"
	// Each client its own field manager (the server names it after the
	// user agent): with the same one, the agent's updates would write the
	// create's entry again, and its survival would prove nothing.
	acfg := rest.CopyConfig(env.AdminConfig())
	acfg.UserAgent = "lean-admin"
	admin := clients(t, acfg)
	created, err := admin.Events.Create(ctx, validLE("lean-1", node), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.ManagedFields) != 1 || created.ManagedFields[0].Manager != "lean-admin" {
		t.Fatalf("the admin's create recorded managedFields %+v; want one entry, lean-admin's", created.ManagedFields)
	}
	var mu sync.Mutex
	var puts []string
	cfg := rest.CopyConfig(env.NodeConfig(node))
	cfg.UserAgent = "lean-agent"
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && r.GetBody != nil {
				body, err := r.GetBody()
				if err != nil {
					return nil, err
				}
				b, err := io.ReadAll(body)
				if err != nil {
					return nil, err
				}
				mu.Lock()
				puts = append(puts, r.URL.Path+" "+string(b))
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	c, err := apiclient.New(cfg, node, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := c.GetEvent(ctx, "lean-1")
	if err != nil {
		t.Fatal(err)
	}
	h := apiclient.LeaseHolder{Identity: node + "/lean", Event: ev.Name, EventUID: string(ev.UID), Duration: time.Minute}
	// Taken (a create), then renewed: an update.
	for i := 0; i < 2; i++ {
		if err := c.AcquireNodeLease(ctx, h, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	ev.Status.ClaimStatus = v1alpha1.LifecycleEventClaimed
	ev.Status.Holder = &v1alpha1.Holder{Identity: h.Identity}
	claimed, err := c.ClaimEventStatus(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	fin, err := c.SetFinalizerOn(ctx, claimed, true)
	if err != nil || fin == nil {
		t.Fatalf("finalizer: %v (updated: %v)", err, fin != nil)
	}
	fin.Status.Message = "working"
	if _, err := c.UpdateEventStatus(ctx, fin); err != nil {
		t.Fatal(err)
	}
	if err := c.ReleaseNodeLease(ctx, h.Identity); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	paths := map[string]int{}
	for _, p := range puts {
		path, body, _ := strings.Cut(p, " ")
		paths[path[strings.LastIndex(path, "/lifecycle"):]]++
		if strings.Contains(body, `"managedFields"`) {
			t.Errorf("an update sent managedFields back: %.300s", p)
		}
	}
	want := map[string]int{"/lifecycleleases/node-lean-node": 2, "/lifecycleevents/lean-1/status": 2, "/lifecycleevents/lean-1": 1}
	if fmt.Sprint(paths) != fmt.Sprint(want) {
		t.Fatalf("PUTs %v; want the Lease renewed and given back, the claim, the finalizer and the status: %v", paths, want)
	}
	got, err := admin.Events.Get(ctx, "lean-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	managers := map[string]string{}
	for _, m := range got.ManagedFields {
		fields := ""
		if m.FieldsV1 != nil {
			fields = string(m.FieldsV1.Raw)
		}
		managers[m.Manager+"/"+string(m.Operation)+"/"+m.Subresource] = fields
	}
	// The admin's entry, from the create, still owns the spec; the
	// agent's updates are recorded beside it, the status's apart.
	if f, ok := managers["lean-admin/Update/"]; !ok || !strings.Contains(f, `"f:spec"`) {
		t.Errorf("the create's managedFields entry is gone or lost the spec: %q", managers)
	}
	if f := managers["lean-agent/Update/"]; !strings.Contains(f, `"f:finalizers"`) {
		t.Errorf("no managedFields entry for the agent's finalizer: %q", managers)
	}
	if f := managers["lean-agent/Update/status"]; !strings.Contains(f, `"f:status"`) {
		t.Errorf("no managedFields entry for the agent's status updates: %q", managers)
	}
	if !slices.Contains(got.Finalizers, v1alpha1.Finalizer) || got.Status.Message != "working" {
		t.Errorf("the updates did not land: finalizers %v, message %q", got.Finalizers, got.Status.Message)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
