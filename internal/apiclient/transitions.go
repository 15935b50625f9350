package apiclient

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// transitionCache is an informer over the LifecycleTransitions that name
// this node (spec.nodeName=<node>): the ones the agent publishes, and any
// an admin wrote for this node. A transition's spec is immutable, so a
// cached copy is as good as a read while the object is there, and the
// informer drops it when it goes. The claim reads the transition here
// first (GetTransition): one request less on the claim's path (section 1
// of docs/benchmarks.md). A transition for several nodes (nodeSelector,
// allNodes) is not in it and is read from the server, as is any name the
// cache does not hold (not synced yet, just created, or gone: the server
// then says NotFound).
type transitionCache struct {
	store  cache.Store
	synced func() bool
}

type transitionsHolder struct {
	mu sync.Mutex
	tc *transitionCache
}

// WatchTransitions starts the informer GetTransition reads from; it runs
// until ctx ends. Offline it retries like every informer.
func (c *Client) WatchTransitions(ctx context.Context) {
	sel := "spec.nodeName=" + c.Node
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return c.LC.Transitions.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return c.watchLC.Transitions.Watch(ctx, o)
		},
	}
	store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: &v1alpha1.LifecycleTransition{},
		Handler: cache.ResourceEventHandlerFuncs{}})
	tc := &transitionCache{store: store, synced: ctrl.HasSynced}
	c.transitions.mu.Lock()
	c.transitions.tc = tc
	c.transitions.mu.Unlock()
	go func() {
		ctrl.RunWithContext(ctx)
		c.transitions.mu.Lock()
		if c.transitions.tc == tc {
			c.transitions.tc = nil
		}
		c.transitions.mu.Unlock()
	}()
}

// cachedTransition is the informer's copy of the named transition, or nil.
func (c *Client) cachedTransition(name string) *v1alpha1.LifecycleTransition {
	c.transitions.mu.Lock()
	tc := c.transitions.tc
	c.transitions.mu.Unlock()
	if tc == nil || !tc.synced() {
		return nil
	}
	obj, ok, err := tc.store.GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	t, ok := obj.(*v1alpha1.LifecycleTransition)
	if !ok {
		return nil
	}
	return t.DeepCopy()
}
