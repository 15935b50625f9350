package apiclient

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// WatchNodeLabel calls notify with the value of this Node's label key ("":
// absent, or the Node gone) once the first list has been read and then at
// every change of that value, until ctx ends. One informer over this Node
// alone (fieldSelector metadata.name), on the clients without the
// client-side timeout (watchClients); notify runs on the informer's
// goroutine, one call at a time.
func (c *Client) WatchNodeLabel(ctx context.Context, key string, notify func(value string)) error {
	lw := c.thisNodeListWatch()
	var mu sync.Mutex
	last, seen := "", false
	h := func(obj any, gone bool) {
		v := ""
		if n, ok := obj.(*corev1.Node); ok && !gone {
			v = n.Labels[key]
		}
		mu.Lock()
		changed := !seen || v != last
		last, seen = v, true
		mu.Unlock()
		if changed {
			notify(v)
		}
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.Node{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { h(o, false) },
		UpdateFunc: func(_, o any) { h(o, false) },
		DeleteFunc: func(o any) { h(o, true) },
	}); err != nil {
		return fmt.Errorf("apiclient: watch node label %s: %w", key, err)
	}
	go inf.RunWithContext(ctx)
	return nil
}

// NodeChanges returns a channel that receives (without blocking: one
// pending signal at most) whenever this Node or a pod bound to it changes,
// until ctx ends: two informers, one over this Node (fieldSelector
// metadata.name), one over its pods (spec.nodeName, what the Node
// authorizer lets a node identity watch), on the clients without the
// client-side timeout. Their first lists signal too. A watch that cannot
// run (an outage, RBAC) only means no signal: the caller keeps a slower
// poll for that (drivers.Readiness). The informers' caches are this
// node's objects only, held while ctx lives.
func (c *Client) NodeChanges(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	signal := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	core := c.watchClients().CoreV1()
	onNode := fields.OneTermEqualSelector("spec.nodeName", c.Node).String()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal() },
		UpdateFunc: func(any, any) { signal() },
		DeleteFunc: func(any) { signal() },
	}
	nodes := cache.NewSharedIndexInformer(c.thisNodeListWatch(), &corev1.Node{}, 0, cache.Indexers{})
	pods := cache.NewSharedIndexInformer(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = onNode
			return core.Pods(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = onNode
			return core.Pods(metav1.NamespaceAll).Watch(ctx, o)
		},
	}, &corev1.Pod{}, 0, cache.Indexers{})
	for _, inf := range []cache.SharedIndexInformer{nodes, pods} {
		if _, err := inf.AddEventHandler(h); err == nil {
			go inf.RunWithContext(ctx)
		}
	}
	return ch
}

// thisNodeListWatch lists and watches this Node alone (fieldSelector
// metadata.name) on the clients without the client-side timeout
// (watchClients).
func (c *Client) thisNodeListWatch() *cache.ListWatch {
	core := c.watchClients().CoreV1()
	sel := fields.OneTermEqualSelector("metadata.name", c.Node).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return core.Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return core.Nodes().Watch(ctx, o)
		},
	}
}
