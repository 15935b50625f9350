package apiclient

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// Lease annotations: which event a lease is held for.
const (
	AnnotationLeaseEvent    = "lifecycle.x-k8s.io/event"
	AnnotationLeaseEventUID = "lifecycle.x-k8s.io/event-uid"
)

// LabelLeaseNode names the node whose agent last took a Lease (its node
// Lease or a disruption slot): HeldLeases lists this node's by it, not the
// whole namespace.
const LabelLeaseNode = "lifecycle.x-k8s.io/node"

// ErrLeaseHeld means another live holder has the lease.
var ErrLeaseHeld = errors.New("apiclient: lease held by another agent")

// ErrNoSlot means every disruption-budget slot of a group is taken.
var ErrNoSlot = errors.New("apiclient: no free disruption-budget slot")

// LeaseHolder says who holds a lease and for which event.
type LeaseHolder struct {
	Identity string
	Event    string
	EventUID string
	Duration time.Duration
}

// NodeLeaseName is the per-node Lease held while an event is claimed.
func NodeLeaseName(node string) string { return "node-" + node }

// SlotLeaseName is the i-th disruption-budget slot of group.
func SlotLeaseName(group string, i int) string { return fmt.Sprintf("%s-%d", group, i) }

// heldBy reports whether l's holder is identity or one of
// FormerIdentities (ours under an older identity).
func (c *Client) heldBy(l *v1alpha1.LifecycleLease, identity string) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return false
	}
	h := *l.Spec.HolderIdentity
	return h == identity || slices.Contains(c.FormerIdentities, h)
}

func expired(l *v1alpha1.LifecycleLease, now time.Time) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return true
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return now.After(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second))
}

// AcquireNodeLease takes or renews this node's Lease for h. It fails with
// ErrLeaseHeld while another identity holds an unexpired lease. Updates carry
// the resourceVersion, so of two racing agents exactly one wins.
//
// The node Lease is written only by the agents of this node, so the client
// keeps the copy its own last write returned and first tries the update with
// that resourceVersion: one request instead of a read and a write. A
// conflict (someone else wrote it since) falls back to reading it.
func (c *Client) AcquireNodeLease(ctx context.Context, h LeaseHolder, now time.Time) error {
	name := NodeLeaseName(c.Node)
	if l := c.cachedNodeLease(); l != nil {
		if c.heldBy(l, h.Identity) || expired(l, now) {
			err := c.updateLease(ctx, l, h, now)
			if err == nil || !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return err
			}
			c.setNodeLease(nil)
		}
	}
	return c.acquire(ctx, name, h, now, nil)
}

// ReleaseNodeLease gives up this node's Lease if h holds it.
func (c *Client) ReleaseNodeLease(ctx context.Context, identity string) error {
	if l := c.cachedNodeLease(); l != nil && c.heldBy(l, identity) {
		err := c.releaseLease(ctx, l)
		if err == nil || !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
		c.setNodeLease(nil)
	}
	return c.release(ctx, NodeLeaseName(c.Node), identity)
}

func (c *Client) cachedNodeLease() *v1alpha1.LifecycleLease {
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	if c.nodeLease == nil {
		return nil
	}
	return c.nodeLease.DeepCopy()
}

// setNodeLease remembers l if it is this node's Lease (nil forgets).
func (c *Client) setNodeLease(l *v1alpha1.LifecycleLease) {
	if l != nil && l.Name != NodeLeaseName(c.Node) {
		return
	}
	c.leaseMu.Lock()
	defer c.leaseMu.Unlock()
	c.nodeLease = l
}

// NodeLeaseHolder returns the holder of this node's Lease ("" if free or expired).
func (c *Client) NodeLeaseHolder(ctx context.Context, now time.Time) (string, error) {
	l, err := c.LC.Leases(v1alpha1.SystemNamespace).Get(ctx, NodeLeaseName(c.Node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if expired(l, now) {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// HeldLease is a Lease in lifecycle-system held by this agent (its
// identity or a former one) and the event it was taken for.
type HeldLease struct {
	Name     string
	Node     bool // this node's Lease; otherwise a disruption slot
	Event    string
	EventUID string
}

// HeldLeases lists the Leases of lifecycle-system that identity (or one of
// FormerIdentities) holds, for the rare sweep after a start or a failed
// claim (engine releaseStaleLeases), never on a timer: the ones this node
// took last (LabelLeaseNode: one LIST of this node's, not the fleet's), and
// its node Lease read by name (one taken by an agent before the label).
func (c *Client) HeldLeases(ctx context.Context, identity string) ([]HeldLease, error) {
	leases := c.LC.Leases(v1alpha1.SystemNamespace)
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: LabelLeaseNode + "=" + c.Node})
	if err != nil {
		return nil, fmt.Errorf("apiclient: list leases: %w", err)
	}
	items := list.Items
	if !slices.ContainsFunc(items, func(l v1alpha1.LifecycleLease) bool { return l.Name == NodeLeaseName(c.Node) }) {
		l, err := leases.Get(ctx, NodeLeaseName(c.Node), metav1.GetOptions{})
		switch {
		case err == nil:
			items = append(items, *l)
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("apiclient: get lease %s: %w", NodeLeaseName(c.Node), err)
		}
	}
	var out []HeldLease
	for i := range items {
		l := &items[i]
		if !c.heldBy(l, identity) {
			continue
		}
		out = append(out, HeldLease{Name: l.Name, Node: l.Name == NodeLeaseName(c.Node),
			Event: l.Annotations[AnnotationLeaseEvent], EventUID: l.Annotations[AnnotationLeaseEventUID]})
	}
	return out, nil
}

// AcquireSlot takes one of the Leases <group>-0 … <group>-(max-1) for h, or
// renews the one h already holds. A slot is free when it does not exist, has
// no holder, or the event it was taken for has ended or is gone. An expired
// slot Lease is NOT free while its event is still unfinished: its holder may
// be down for longer than any Lease (a bare-metal reboot, POST included, or
// an API partition), and handing the slot on would put maxConcurrent+1
// nodes of the group down at once. An event that will never end (its node
// is gone for good) frees its slot when it is deleted.
func (c *Client) AcquireSlot(ctx context.Context, group string, max int, h LeaseHolder, now time.Time) (string, error) {
	leases := c.claimLane().Leases(v1alpha1.SystemNamespace)
	// Renew first, wherever we already hold one.
	for i := 0; i < max; i++ {
		name := SlotLeaseName(group, i)
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err == nil && c.heldBy(l, h.Identity) && l.Annotations[AnnotationLeaseEventUID] == h.EventUID {
			return name, c.acquire(ctx, name, h, now, nil)
		}
	}
	for i := 0; i < max; i++ {
		name := SlotLeaseName(group, i)
		err := c.acquireSlot(ctx, name, h, now)
		if err == nil {
			return name, nil
		}
		// Forbidden: the admission policy refused to hand over a live
		// slot (deploy/admission.yaml): taken, as far as we may know.
		if !errors.Is(err, ErrLeaseHeld) && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
			return "", err
		}
	}
	return "", ErrNoSlot
}

// SlotHolders describes who holds the slots of group, as "<slot>: event
// <name> (<holder>)", for a waiting event's message.
func (c *Client) SlotHolders(ctx context.Context, group string, max int) ([]string, error) {
	var out []string
	for i := 0; i < max; i++ {
		name := SlotLeaseName(group, i)
		l, err := c.LC.Leases(v1alpha1.SystemNamespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return out, err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			continue
		}
		out = append(out, fmt.Sprintf("%s: event %s (%s)", name, l.Annotations[AnnotationLeaseEvent], *l.Spec.HolderIdentity))
	}
	return out, nil
}

// ReleaseSlot gives up a slot lease if identity holds it.
func (c *Client) ReleaseSlot(ctx context.Context, name, identity string) error {
	return c.release(ctx, name, identity)
}

// slotEventEnded reports whether the event a slot was taken for has ended.
func (c *Client) slotEventEnded(ctx context.Context, l *v1alpha1.LifecycleLease) bool {
	name := l.Annotations[AnnotationLeaseEvent]
	if name == "" {
		return true
	}
	ev, err := c.LeaseEvent(ctx, name, l.Annotations[AnnotationLeaseEventUID])
	if err != nil {
		return false // fail closed: cannot tell, so the slot stays taken
	}
	return ev == nil || ev.Status.ClaimStatus.Finished()
}

// LeaseEvent reads the event a Lease was taken for, by its name and (when
// not empty) UID: nil when it is gone — not found, or the name is another
// event's now.
func (c *Client) LeaseEvent(ctx context.Context, name, uid string) (*v1alpha1.LifecycleEvent, error) {
	ev, err := c.LC.Events.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if uid != "" && string(ev.UID) != uid {
		return nil, nil // a new event with the old name
	}
	return ev, nil
}

// acquireSlot takes slot lease name unless it is held for an unfinished
// event (see AcquireSlot): expiry alone does not free it.
func (c *Client) acquireSlot(ctx context.Context, name string, h LeaseHolder, now time.Time) error {
	return c.acquireIf(ctx, name, h, now, func(ctx context.Context, l *v1alpha1.LifecycleLease) bool {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return true
		}
		return c.slotEventEnded(ctx, l)
	})
}

func (c *Client) acquire(ctx context.Context, name string, h LeaseHolder, now time.Time, stale func(context.Context, *v1alpha1.LifecycleLease) bool) error {
	return c.acquireIf(ctx, name, h, now, func(ctx context.Context, l *v1alpha1.LifecycleLease) bool {
		return expired(l, now) || stale != nil && stale(ctx, l)
	})
}

// acquireIf takes lease name for h when it does not exist, is ours, or free
// says another holder's lease may be taken.
func (c *Client) acquireIf(ctx context.Context, name string, h LeaseHolder, now time.Time, free func(context.Context, *v1alpha1.LifecycleLease) bool) error {
	leases := c.claimLane().Leases(v1alpha1.SystemNamespace)
	secs := int32(h.Duration / time.Second)
	if secs < 1 {
		secs = 40
	}
	mt := metav1.NewMicroTime(now)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &v1alpha1.LifecycleLease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: v1alpha1.SystemNamespace,
				Labels:      map[string]string{LabelLeaseNode: c.Node},
				Annotations: map[string]string{AnnotationLeaseEvent: h.Event, AnnotationLeaseEventUID: h.EventUID}},
			Spec: coordv1.LeaseSpec{HolderIdentity: &h.Identity, LeaseDurationSeconds: &secs, AcquireTime: &mt, RenewTime: &mt},
		}
		got, err := leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			if apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("%w: %s (created concurrently)", ErrLeaseHeld, name)
			}
			return fmt.Errorf("apiclient: create lease %s: %w", name, err)
		}
		c.setNodeLease(got)
		return nil
	}
	if err != nil {
		return fmt.Errorf("apiclient: get lease %s: %w", name, err)
	}
	if !c.heldBy(l, h.Identity) && !free(ctx, l) {
		return fmt.Errorf("%w: %s is held by %s", ErrLeaseHeld, name, *l.Spec.HolderIdentity)
	}
	err = c.updateLease(ctx, l, h, now)
	if apierrors.IsConflict(err) {
		return fmt.Errorf("%w: %s (lost a race)", ErrLeaseHeld, name)
	}
	return err
}

// updateLease writes l (as read, with its resourceVersion) held by h.
func (c *Client) updateLease(ctx context.Context, l *v1alpha1.LifecycleLease, h LeaseHolder, now time.Time) error {
	secs := int32(h.Duration / time.Second)
	if secs < 1 {
		secs = 40
	}
	mt := metav1.NewMicroTime(now)
	ours := c.heldBy(l, h.Identity)
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	if !ours || l.Annotations[AnnotationLeaseEventUID] != h.EventUID {
		l.Spec.AcquireTime = &mt
		if l.Spec.LeaseTransitions == nil {
			l.Spec.LeaseTransitions = new(int32)
		}
		*l.Spec.LeaseTransitions++
	}
	l.Annotations[AnnotationLeaseEvent] = h.Event
	l.Annotations[AnnotationLeaseEventUID] = h.EventUID
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelLeaseNode] = c.Node
	l.Spec.HolderIdentity = &h.Identity
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.RenewTime = &mt
	got, err := c.claimLane().Leases(v1alpha1.SystemNamespace).Update(ctx, lean(l), metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return err
		}
		return fmt.Errorf("apiclient: update lease %s: %w", l.Name, err)
	}
	c.setNodeLease(got)
	return nil
}

func (c *Client) release(ctx context.Context, name, identity string) error {
	leases := c.LC.Leases(v1alpha1.SystemNamespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("apiclient: get lease %s: %w", name, err)
	}
	c.setNodeLease(l)
	if !c.heldBy(l, identity) {
		return nil
	}
	if err := c.releaseLease(ctx, l); err != nil && !apierrors.IsConflict(err) {
		return err
	}
	return nil
}

// releaseLease writes l (as read, with its resourceVersion) without a holder.
func (c *Client) releaseLease(ctx context.Context, l *v1alpha1.LifecycleLease) error {
	empty := ""
	l.Spec.HolderIdentity = &empty
	delete(l.Annotations, AnnotationLeaseEvent)
	delete(l.Annotations, AnnotationLeaseEventUID)
	got, err := c.LC.Leases(v1alpha1.SystemNamespace).Update(ctx, lean(l), metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return err
		}
		return fmt.Errorf("apiclient: release lease %s: %w", l.Name, err)
	}
	c.setNodeLease(got)
	return nil
}
