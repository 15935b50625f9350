package apiclient

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// LabelManagedBy marks the transitions an agent publishes for its node.
const LabelManagedBy = "app.kubernetes.io/managed-by"

// ManagedByAgent is the value of LabelManagedBy on published transitions.
const ManagedByAgent = "lifecycle-agent"

// GetEvent reads one event from the server.
func (c *Client) GetEvent(ctx context.Context, name string) (*v1alpha1.LifecycleEvent, error) {
	return c.LC.Events.Get(ctx, name, metav1.GetOptions{})
}

// ListEvents reads this node's events (spec.bindingNode) from the server,
// bypassing the watch's cache.
func (c *Client) ListEvents(ctx context.Context) ([]*v1alpha1.LifecycleEvent, error) {
	l, err := c.LC.Events.List(ctx, BindingNodeSelector(c.Node))
	if err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.LifecycleEvent, 0, len(l.Items))
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out, nil
}

// UpdateEventStatus writes ev.Status with ev's resourceVersion as a
// precondition; a 409 means someone else changed the event first.
func (c *Client) UpdateEventStatus(ctx context.Context, ev *v1alpha1.LifecycleEvent) (*v1alpha1.LifecycleEvent, error) {
	return c.LC.Events.UpdateStatus(ctx, lean(ev), metav1.UpdateOptions{})
}

// ClaimEventStatus is UpdateEventStatus for the claim, on the claim lane
// (a token bucket of its own, see New).
func (c *Client) ClaimEventStatus(ctx context.Context, ev *v1alpha1.LifecycleEvent) (*v1alpha1.LifecycleEvent, error) {
	return c.claimLane().Events.UpdateStatus(ctx, lean(ev), metav1.UpdateOptions{})
}

// SetFinalizerOn adds (on=true) or removes the agent's finalizer on ev as
// the caller last saw it: one update guarded by its resourceVersion. On a
// conflict it falls back to SetFinalizer's read and retry. It returns the
// updated object when its own update went through, else nil.
func (c *Client) SetFinalizerOn(ctx context.Context, ev *v1alpha1.LifecycleEvent, on bool) (*v1alpha1.LifecycleEvent, error) {
	return c.SetFinalizerWith(ctx, ev, on, nil)
}

// SetFinalizerWith is SetFinalizerOn that also sets the annotations ann in
// the same update (and in its retries): the claim's plan goes out with
// the finalizer, at no extra write.
func (c *Client) SetFinalizerWith(ctx context.Context, ev *v1alpha1.LifecycleEvent, on bool, ann map[string]string) (*v1alpha1.LifecycleEvent, error) {
	cp := ev.DeepCopy()
	if !withMeta(cp, on, ann) {
		return nil, nil
	}
	got, err := c.LC.Events.Update(ctx, lean(cp), metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err):
		return nil, c.setFinalizer(ctx, ev.Name, string(ev.UID), on, ann)
	case apierrors.IsNotFound(err) && !on:
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("apiclient: finalizer on %s: %w", ev.Name, err)
	}
	return got, nil
}

// lean returns a shallow copy of o without its managedFields, for the body
// of an update: the server keeps the stored object's managedFields when an
// update carries none (k8s.io/apimachinery managedfields decodeLiveOrNew;
// a status update ignores the body's anyway), and records this update's
// fields under the agent's manager as before. Sent back, they were 1.0–1.3
// KiB of a 2.4–3.4 KiB event that the server decoded for nothing
// (docs/benchmarks.md, section 2).
func lean[T any, PT interface {
	*T
	metav1.Object
}](o PT) PT {
	cp := PT(new(T))
	*cp = *o
	cp.SetManagedFields(nil)
	return cp
}

// withMeta sets ev's finalizer (on) and annotations ann, and reports
// whether that changed ev.
func withMeta(ev *v1alpha1.LifecycleEvent, on bool, ann map[string]string) bool {
	fins, change := withFinalizer(ev.Finalizers, on)
	ev.Finalizers = fins
	for k, v := range ann {
		if cur, ok := ev.Annotations[k]; ok && cur == v {
			continue
		}
		if ev.Annotations == nil {
			ev.Annotations = map[string]string{}
		}
		ev.Annotations[k], change = v, true
	}
	return change
}

// withFinalizer returns fins with the agent's finalizer (on) or without it,
// and whether that differs from fins.
func withFinalizer(fins []string, on bool) ([]string, bool) {
	has := false
	var keep []string
	for _, f := range fins {
		if f == v1alpha1.Finalizer {
			has = true
			continue
		}
		keep = append(keep, f)
	}
	if has == on {
		return fins, false
	}
	if on {
		return append(keep, v1alpha1.Finalizer), true
	}
	return keep, true
}

// SetFinalizer adds (on=true) or removes the agent's finalizer, retrying
// on conflicts with a fresh read. With a uid, an event of that name but
// another UID (ours was deleted and the name reused) is left alone.
func (c *Client) SetFinalizer(ctx context.Context, name, uid string, on bool) error {
	return c.setFinalizer(ctx, name, uid, on, nil)
}

func (c *Client) setFinalizer(ctx context.Context, name, uid string, on bool, ann map[string]string) error {
	for i := 0; i < 5; i++ {
		ev, err := c.GetEvent(ctx, name)
		if apierrors.IsNotFound(err) && !on {
			return nil
		}
		if err != nil {
			return err
		}
		if uid != "" && string(ev.UID) != uid {
			if on {
				return fmt.Errorf("apiclient: finalizer on %s: the event was replaced (uid %s, want %s)", name, ev.UID, uid)
			}
			return nil
		}
		if !withMeta(ev, on, ann) {
			return nil
		}
		_, err = c.LC.Events.Update(ctx, lean(ev), metav1.UpdateOptions{})
		if err == nil || (apierrors.IsNotFound(err) && !on) {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("apiclient: finalizer on %s: %w", name, err)
		}
	}
	return fmt.Errorf("apiclient: finalizer on %s: too many conflicts", name)
}

// DeleteEvent deletes a finished event (eventRetention), guarded by its UID.
func (c *Client) DeleteEvent(ctx context.Context, ev *v1alpha1.LifecycleEvent) error {
	err := c.LC.Events.Delete(ctx, ev.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ev.UID}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// GetTransition reads a transition: this node's from the informer
// WatchTransitions keeps, others from the server.
func (c *Client) GetTransition(ctx context.Context, name string) (*v1alpha1.LifecycleTransition, error) {
	if t := c.cachedTransition(name); t != nil {
		return t, nil
	}
	return c.LC.Transitions.Get(ctx, name, metav1.GetOptions{})
}

// TransitionApplies reports whether t names this node: by nodeName, by
// nodeSelector against the Node's labels, or allNodes.
func TransitionApplies(t *v1alpha1.LifecycleTransition, node *corev1.Node) (bool, error) {
	s := t.Spec
	switch {
	case s.NodeName != nil:
		return *s.NodeName == node.Name, nil
	case s.AllNodes != nil && *s.AllNodes:
		return true, nil
	case s.NodeSelector != nil:
		sel, err := nodeaffinity.NewNodeSelector(s.NodeSelector)
		if err != nil {
			return false, fmt.Errorf("transition %s: nodeSelector: %w", t.Name, err)
		}
		return sel.Match(node), nil
	}
	return false, nil
}

// PublishTransitions makes this node's published transitions equal want:
// it creates missing ones (owned by the Node, so they go when it goes) and
// deletes published ones no longer wanted (a disabled driver).
func (c *Client) PublishTransitions(ctx context.Context, node *corev1.Node, want []v1alpha1.LifecycleTransition) error {
	have, err := c.LC.Transitions.List(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + c.Node, LabelSelector: LabelManagedBy + "=" + ManagedByAgent,
	})
	if err != nil {
		return fmt.Errorf("apiclient: list transitions of %s: %w", c.Node, err)
	}
	wanted := map[string]bool{}
	for i := range want {
		t := want[i].DeepCopy()
		wanted[t.Name] = true
		if t.Labels == nil {
			t.Labels = map[string]string{}
		}
		t.Labels[LabelManagedBy] = ManagedByAgent
		t.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		_, err := c.LC.Transitions.Create(ctx, t, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			old, gerr := c.LC.Transitions.Get(ctx, t.Name, metav1.GetOptions{})
			if gerr == nil && !equalSpec(old.Spec, t.Spec) {
				// The spec is immutable: replace the object.
				if derr := c.LC.Transitions.Delete(ctx, t.Name, metav1.DeleteOptions{}); derr == nil {
					_, err = c.LC.Transitions.Create(ctx, t, metav1.CreateOptions{})
				}
			} else {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("apiclient: publish transition %s: %w", t.Name, err)
		}
	}
	for _, t := range have.Items {
		if !wanted[t.Name] {
			if err := c.LC.Transitions.Delete(ctx, t.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("apiclient: remove transition %s: %w", t.Name, err)
			}
		}
	}
	return nil
}

// WithdrawTransitions deletes the transitions this agent published for its
// node (managed-by label, spec.nodeName), except those in keep, which it
// returns as kept.
func (c *Client) WithdrawTransitions(ctx context.Context, keep map[string]bool) (deleted, kept []string, err error) {
	have, err := c.LC.Transitions.List(ctx, metav1.ListOptions{
		FieldSelector: "spec.nodeName=" + c.Node, LabelSelector: LabelManagedBy + "=" + ManagedByAgent,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("apiclient: list transitions of %s: %w", c.Node, err)
	}
	for _, t := range have.Items {
		if keep[t.Name] {
			kept = append(kept, t.Name)
			continue
		}
		if err := c.LC.Transitions.Delete(ctx, t.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return deleted, kept, fmt.Errorf("apiclient: withdraw transition %s: %w", t.Name, err)
		}
		deleted = append(deleted, t.Name)
	}
	return deleted, kept, nil
}

func equalSpec(a, b v1alpha1.LifecycleTransitionSpec) bool {
	return a.Start == b.Start && a.End == b.End && a.Driver == b.Driver &&
		((a.Sla == nil) == (b.Sla == nil)) && (a.Sla == nil || a.Sla.Duration == b.Sla.Duration)
}
