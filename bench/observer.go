package bench

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// Observer timestamps, at this client, what the agents make visible through
// the API server: the first time each event is seen claimed (a watch on
// LifecycleEvents, as admin) and the first time a Node's LifecycleTransition
// condition names the event (a watch on Nodes). Watch delivery is part of
// every figure, as it is for anyone who waits on an agent.
type Observer struct {
	mu      sync.Mutex
	changed chan struct{}
	claimed map[string]time.Time
	cond    map[string]time.Time
	gone    map[string]time.Time
	unseen  map[string]bool   // gone, found by a re-list: its last changes were never seen
	final   map[string]string // last claimStatus and message seen
	steps   map[string]int    // len(status.steps) last seen
	nodeFn  func(n *corev1.Node, at time.Time)
}

var eventInMessage = regexp.MustCompile(`\(event ([^)]+)\)`)

// Observe starts both watches; they end with ctx. nodeFn, if not nil, sees
// every node update too.
func (e *Env) Observe(ctx context.Context, nodeFn func(n *corev1.Node, at time.Time)) (*Observer, error) {
	o := &Observer{changed: make(chan struct{}), claimed: map[string]time.Time{}, cond: map[string]time.Time{},
		gone: map[string]time.Time{}, unseen: map[string]bool{}, final: map[string]string{}, steps: map[string]int{}, nodeFn: nodeFn}
	evs, err := e.LC.Events.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	nodes, err := e.Core.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	go watchLoop(ctx, evs.ResourceVersion, func(rv string) (watch.Interface, error) {
		return e.LC.Events.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	}, func() (string, error) {
		l, err := e.LC.Events.List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		o.relisted(l.Items, time.Now())
		return l.ResourceVersion, nil
	}, o.onEvent)
	go watchLoop(ctx, nodes.ResourceVersion, func(rv string) (watch.Interface, error) {
		return e.Core.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
	}, func() (string, error) {
		l, err := e.Core.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		at := time.Now()
		for i := range l.Items {
			o.onNode(watch.Modified, &l.Items[i], at)
		}
		return l.ResourceVersion, nil
	}, o.onNode)
	return o, nil
}

// watchLoop keeps a watch open from rv, re-opening it where it ended. When
// the server no longer has rv (an ERROR event: 410 "too old resource
// version", after a compaction while the watch was closed; or the watch
// refused with 410), what happened in between is lost to the watch:
// relist lists again (reporting every object, and what is gone) and the
// watch goes on from the list's resourceVersion. Re-watching from "now"
// instead lost the deletions in between, and a wait for one could only
// time out ("not deleted within 5m0s"): the observer's watch is closed by
// the server like any slow watcher's when the harness process is saturated
// (the 1,000-agent unfiltered scale case).
func watchLoop(ctx context.Context, rv string, open func(rv string) (watch.Interface, error), relist func() (string, error), handle func(watch.EventType, runtime.Object, time.Time)) {
	pause := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
			return true
		}
	}
	for ctx.Err() == nil {
		if rv == "" {
			r, err := relist()
			if err != nil {
				if !pause() {
					return
				}
				continue
			}
			rv = r
		}
		w, err := open(rv)
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				rv = ""
			}
			if !pause() {
				return
			}
			continue
		}
		failed := false
		for ev := range w.ResultChan() {
			at := time.Now()
			if ev.Type == watch.Error {
				// Too old (or another failure): list again, then watch
				// from there. Items a relist reports are stamped with
				// its time: a claim it is the first to show counts as
				// later than it was, never earlier.
				rv, failed = "", true
				break
			}
			if m, err := metaRV(ev.Object); err == nil && m != "" {
				rv = m
			}
			if ev.Type == watch.Added || ev.Type == watch.Modified || ev.Type == watch.Deleted {
				handle(ev.Type, ev.Object, at)
			}
		}
		w.Stop()
		if failed && !pause() { // a failure that repeats does not spin
			return
		}
	}
}

// relisted records a fresh list of the events: each as a change seen at at,
// and every event seen before and missing from it as deleted at at (its
// deletion happened while no watch was open; at is an upper bound). The
// changes before that deletion were not seen either, its end state among
// them: such an event is marked unseen, and its last status seen says
// nothing about how it ended (GoneUnseen).
func (o *Observer) relisted(items []v1alpha1.LifecycleEvent, at time.Time) {
	present := make(map[string]bool, len(items))
	for i := range items {
		present[items[i].Name] = true
	}
	o.mu.Lock()
	for name := range o.final {
		if !present[name] && o.gone[name].IsZero() {
			o.gone[name] = at
			o.unseen[name] = true
		}
	}
	o.notifyLocked()
	o.mu.Unlock()
	for i := range items {
		o.onEvent(watch.Modified, &items[i], at)
	}
}

func metaRV(o runtime.Object) (string, error) {
	type rvGetter interface{ GetResourceVersion() string }
	if g, ok := o.(rvGetter); ok {
		return g.GetResourceVersion(), nil
	}
	return "", fmt.Errorf("no resourceVersion")
}

func (o *Observer) onEvent(typ watch.EventType, obj runtime.Object, at time.Time) {
	ev, ok := obj.(*v1alpha1.LifecycleEvent)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	cs := ev.Status.ClaimStatus
	o.final[ev.Name] = string(cs) + ": " + ev.Status.Message
	o.steps[ev.Name] = len(ev.Status.Steps)
	if typ == watch.Deleted {
		o.gone[ev.Name] = at
		o.notifyLocked()
		return
	}
	if cs != v1alpha1.LifecycleEventClaimed && !cs.Finished() {
		return
	}
	if _, seen := o.claimed[ev.Name]; !seen {
		o.claimed[ev.Name] = at
		o.notifyLocked()
	}
}

// Gone waits until event name was deleted and returns the last status seen
// ("<claimStatus>: <message>").
func (o *Observer) Gone(ctx context.Context, name string, timeout time.Duration) (string, error) {
	var final string
	err := o.wait(ctx, timeout, func() bool { final = o.final[name]; return !o.gone[name].IsZero() })
	if err != nil {
		return final, fmt.Errorf("bench: event %s not deleted within %s (last status %q): %w", name, timeout, final, err)
	}
	return final, nil
}

// GoneUnseen reports whether event name's deletion was found by a re-list,
// not seen by a watch: the status Gone returned for it is the last one the
// observer saw before its watch was closed, not necessarily its end state.
func (o *Observer) GoneUnseen(name string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.unseen[name]
}

// Steps returns the number of steps the event's status listed last.
func (o *Observer) Steps(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.steps[name]
}

func (o *Observer) onNode(typ watch.EventType, obj runtime.Object, at time.Time) {
	n, ok := obj.(*corev1.Node)
	if !ok || typ == watch.Deleted {
		return
	}
	if o.nodeFn != nil {
		o.nodeFn(n, at)
	}
	for _, c := range n.Status.Conditions {
		if string(c.Type) != v1alpha1.NodeConditionLifecycleTransition {
			continue
		}
		m := eventInMessage.FindStringSubmatch(c.Message)
		if m == nil {
			continue
		}
		o.mu.Lock()
		if _, seen := o.cond[m[1]]; !seen {
			o.cond[m[1]] = at
			o.notifyLocked()
		}
		o.mu.Unlock()
	}
}

func (o *Observer) notifyLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// Poke wakes waiters (for conditions outside the Observer).
func (o *Observer) Poke() {
	o.mu.Lock()
	o.notifyLocked()
	o.mu.Unlock()
}

// Wait waits until cond (called with the lock held) holds.
func (o *Observer) wait(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		o.mu.Lock()
		ok, ch := cond(), o.changed
		o.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Claimed waits until event name was seen claimed and returns when.
func (o *Observer) Claimed(ctx context.Context, name string, timeout time.Duration) (time.Time, error) {
	var t time.Time
	err := o.wait(ctx, timeout, func() bool { t = o.claimed[name]; return !t.IsZero() })
	if err != nil {
		return t, fmt.Errorf("bench: event %s not seen claimed within %s: %w", name, timeout, err)
	}
	return t, nil
}

// Condition waits until a Node's LifecycleTransition condition named the
// event and returns when.
func (o *Observer) Condition(ctx context.Context, name string, timeout time.Duration) (time.Time, error) {
	var t time.Time
	err := o.wait(ctx, timeout, func() bool { t = o.cond[name]; return !t.IsZero() })
	if err != nil {
		return t, fmt.Errorf("bench: no node condition for event %s within %s: %w", name, timeout, err)
	}
	return t, nil
}

// WaitFunc waits until f holds, re-checking it on every observed change
// (and every 50 ms).
func (o *Observer) WaitFunc(ctx context.Context, timeout time.Duration, f func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if f() {
			return nil
		}
		o.mu.Lock()
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
