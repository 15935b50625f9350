package apiclient

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// EventWatch is an informer over the LifecycleEvents bound to one node,
// filtered by the server (spec.bindingNode=<node>).
type EventWatch struct {
	informer cache.SharedIndexInformer

	mu        sync.Mutex
	lastError time.Time
	open      int // watches opened and not yet closed (0 or 1)
}

// WatchEvents starts an informer over this node's events and calls notify
// with the name of every event that was added, changed or deleted. notify
// must not block. Set unfiltered only for the benchmark's comparison.
func (c *Client) WatchEvents(ctx context.Context, notify func(name string), unfiltered bool) (*EventWatch, error) {
	opts := BindingNodeSelector(c.Node)
	if unfiltered {
		opts = metav1.ListOptions{}
	}
	w := &EventWatch{}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = opts.FieldSelector
			return c.LC.Events.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = opts.FieldSelector
			wi, err := c.watchLC.Events.Watch(ctx, o)
			if err != nil {
				w.noteError()
				return nil, err
			}
			return w.track(wi), nil
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &v1alpha1.LifecycleEvent{}, 0, cache.Indexers{})
	h := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if ev, ok := obj.(*v1alpha1.LifecycleEvent); ok && (unfiltered && ev.Spec.BindingNode == c.Node || !unfiltered) {
			notify(ev.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h,
		UpdateFunc: func(_, n any) { h(n) },
		DeleteFunc: h,
	}); err != nil {
		return nil, fmt.Errorf("apiclient: watch events: %w", err)
	}
	w.informer = inf
	// Every failed list or watch (a cut connection, a refused dial, one
	// closed by the HTTP/2 health check) is noted: the reflector then backs
	// off for up to 30 s before it lists again, and the engine reads this
	// node's events directly meanwhile (LastError).
	if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		w.noteError()
		cache.DefaultWatchErrorHandler(ctx, r, err)
		notify("")
	}); err != nil {
		return nil, fmt.Errorf("apiclient: watch events: %w", err)
	}
	go inf.RunWithContext(ctx)
	return w, nil
}

func (w *EventWatch) noteError() {
	w.mu.Lock()
	w.lastError = time.Now()
	w.mu.Unlock()
}

// Watching reports whether a watch is open now. The reflector tells no
// error handler when a watch it had ends with an error (a stream cut, a
// connection closed by the HTTP/2 health check) or when opening one fails
// with a retriable error: it logs, backs off for up to 30 s and tries
// again, and its cache misses everything meanwhile. Between a watch's end
// and the next one's start the cache is not to be trusted (issue 12: an
// event created while the reflector backed off went unclaimed for 15 s).
func (w *EventWatch) Watching() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.open > 0
}

// track counts wi open until its result channel closes (the reflector
// stops every watch it is done with, so the channel always closes), and
// notes an Error event as a failure.
func (w *EventWatch) track(wi watch.Interface) watch.Interface {
	w.mu.Lock()
	w.open++
	w.mu.Unlock()
	t := &trackedWatch{inner: wi, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer func() {
			w.mu.Lock()
			w.open--
			w.mu.Unlock()
			close(t.out)
		}()
		for ev := range wi.ResultChan() {
			if ev.Type == watch.Error {
				w.noteError()
			}
			select {
			case t.out <- ev:
			case <-t.stop:
				wi.Stop()
				return
			}
		}
	}()
	return t
}

// trackedWatch forwards a watch's events (see EventWatch.track).
type trackedWatch struct {
	inner watch.Interface
	out   chan watch.Event
	once  sync.Once
	stop  chan struct{}
}

func (t *trackedWatch) Stop() {
	t.once.Do(func() { close(t.stop) })
	t.inner.Stop()
}

func (t *trackedWatch) ResultChan() <-chan watch.Event { return t.out }

// LastError is when the watch last failed (zero: never).
func (w *EventWatch) LastError() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastError
}

// Synced reports whether the first list has completed.
func (w *EventWatch) Synced() bool { return w.informer.HasSynced() }

// Get returns the cached event by name.
func (w *EventWatch) Get(name string) (*v1alpha1.LifecycleEvent, bool) {
	obj, ok, err := w.informer.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	return obj.(*v1alpha1.LifecycleEvent), true
}

// List returns every cached event of this node.
func (w *EventWatch) List() []*v1alpha1.LifecycleEvent {
	var out []*v1alpha1.LifecycleEvent
	for _, o := range w.informer.GetStore().List() {
		out = append(out, o.(*v1alpha1.LifecycleEvent))
	}
	return out
}
