package main

import (
	"context"
	"fmt"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// eventCache is an informer over the LifecycleEvents a list option
// selects (one event by name, or a rollout's by label). changed receives a
// token after every add, update or delete; the waits select on it.
type eventCache struct {
	store   cache.Store
	ctrl    cache.Controller
	changed chan struct{}
}

func startEventCache(ctx context.Context, lc *apiclient.LifecycleClients, sel metav1.ListOptions) *eventCache {
	c := &eventCache{changed: make(chan struct{}, 1)}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector, o.LabelSelector = sel.FieldSelector, sel.LabelSelector
			return lc.Events.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector, o.LabelSelector = sel.FieldSelector, sel.LabelSelector
			return lc.Events.Watch(ctx, o)
		},
	}
	poke := func() {
		select {
		case c.changed <- struct{}{}:
		default:
		}
	}
	c.store, c.ctrl = cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &v1alpha1.LifecycleEvent{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { poke() },
			UpdateFunc: func(any, any) { poke() },
			DeleteFunc: func(any) { poke() },
		},
	})
	go c.ctrl.RunWithContext(ctx)
	return c
}

// synced waits for the first list (or ctx).
func (c *eventCache) synced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.ctrl.HasSynced) {
		return fmt.Errorf("watching LifecycleEvents: %w", ctx.Err())
	}
	return nil
}

func (c *eventCache) get(name string) (*v1alpha1.LifecycleEvent, bool) {
	obj, ok, err := c.store.GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	ev, ok := obj.(*v1alpha1.LifecycleEvent)
	return ev, ok
}

// list returns the cached events by name.
func (c *eventCache) list() map[string]*v1alpha1.LifecycleEvent {
	m := map[string]*v1alpha1.LifecycleEvent{}
	for _, obj := range c.store.List() {
		if ev, ok := obj.(*v1alpha1.LifecycleEvent); ok {
			m[ev.Name] = ev
		}
	}
	return m
}

// sortEvents orders events by creation time, then name.
func sortEvents(items []v1alpha1.LifecycleEvent) {
	sort.SliceStable(items, func(i, j int) bool {
		a, b := items[i].CreationTimestamp, items[j].CreationTimestamp
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return items[i].Name < items[j].Name
	})
}
