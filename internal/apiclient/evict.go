package apiclient

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/kubectl/pkg/drain"
)

// Budget-aware eviction. The drain library's own loop (DeleteOrEvictPods)
// retries an eviction a PodDisruptionBudget refused after a fixed
// EvictErrorRetryDelay — kubectl's 5 s — however soon the budget allows
// the next disruption. Here the library still filters the pods
// (GetPodsForDeletion) and sends each eviction (EvictPod); around it:
//
//   - a watch of the PodDisruptionBudgets wakes a refused pod's retry as
//     soon as a budget whose selector matches the pod reports
//     disruptionsAllowed > 0, at most that many waiting pods per update
//     (so a budget of 1 wakes one pod, not all of its app);
//   - a bounded back-off is the safety net (a missed or refused watch):
//     MinEvictRetry (DrainOptions.MinRetry), doubling, up to RetryDelay;
//     never a hot loop;
//   - every pod is evicted in parallel, so independent budgets never wait
//     on each other;
//   - an evicted pod is gone when a watch of the node's pods reports it
//     deleted, or a GET (every second, as the library) finds it gone.
//
// Without RBAC to watch PDBs (an older deploy/rbac.yaml) the back-off
// alone retries, no slower than the library did.

// MinEvictRetry is the first back-off after a refused eviction (or
// RetryDelay when that is shorter).
const MinEvictRetry = time.Second

// evictPods evicts pods and waits until each is gone, as drain.Helper's
// DeleteOrEvictPods does, with the budget-aware retry above.
func (c *Client) evictPods(ctx context.Context, h *drain.Helper, pods []corev1.Pod, o DrainOptions, finished func(*corev1.Pod)) error {
	if len(pods) == 0 {
		return nil
	}
	gv, err := drain.CheckEvictionSupport(h.Client)
	if err != nil {
		return err
	}
	if gv.Empty() {
		return fmt.Errorf("the API server does not support pod eviction")
	}
	timeout := h.Timeout
	if timeout == 0 {
		timeout = time.Duration(math.MaxInt64)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	bw := newBudgetWaiters()
	go c.watchBudgets(ctx, bw, o.OnBlocked)
	gone := newGoneSet()
	go c.watchGone(ctx, gone)

	errs := make(chan error, len(pods))
	for _, pod := range pods {
		go func(pod corev1.Pod) {
			errs <- c.evictOne(ctx, h, gv, pod, o, bw, gone, timeout, finished)
		}(pod)
	}
	var all []error
	for range pods {
		if err := <-errs; err != nil {
			all = append(all, err)
		}
	}
	return utilerrors.NewAggregate(all)
}

func (c *Client) evictOne(ctx context.Context, h *drain.Helper, gv schema.GroupVersion, pod corev1.Pod, o DrainOptions,
	bw *budgetWaiters, gone *goneSet, timeout time.Duration, finished func(*corev1.Pod)) error {
	first := o.MinRetry
	if first <= 0 {
		first = MinEvictRetry
	}
	backoff := min(first, o.RetryDelay)
	for {
		w := bw.add(pod) // before the attempt: a budget freed meanwhile is not missed
		err := h.EvictPod(pod, gv)
		var wait <-chan struct{}
		switch {
		case ctx.Err() != nil:
			bw.remove(w)
			return fmt.Errorf("error when evicting pods/%q -n %q: global timeout reached: %v", pod.Name, pod.Namespace, timeout)
		case err == nil:
			bw.remove(w)
			return c.waitGone(ctx, h, pod, gone, timeout, finished)
		case apierrors.IsNotFound(err):
			bw.remove(w)
			return nil
		case apierrors.IsTooManyRequests(err):
			why := c.evicts.get(pod.Namespace + "/" + pod.Name)
			if why == "" {
				why = "eviction refused (429)"
			}
			if o.OnBlocked != nil {
				o.OnBlocked(fmt.Sprintf("eviction of pod %s/%s blocked: %s", pod.Namespace, pod.Name, why))
			}
			wait = w.ch
		case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
			bw.remove(w)
			if !pod.DeletionTimestamp.IsZero() {
				// Never evictable in a terminating namespace; it is
				// being deleted: wait for that.
				return c.waitGone(ctx, h, pod, gone, timeout, finished)
			}
		default:
			bw.remove(w)
			return fmt.Errorf("error when evicting pods/%q -n %q: %v", pod.Name, pod.Namespace, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-wait: // a budget matching the pod allows a disruption
		case <-t.C:
			backoff = min(2*backoff, o.RetryDelay)
		}
		t.Stop()
		bw.remove(w)
		if fresh, err := h.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{}); err == nil {
			pod = *fresh
		}
	}
}

// waitGone waits until the evicted pod is deleted (or replaced by one of
// the same name) and reports it finished.
func (c *Client) waitGone(ctx context.Context, h *drain.Helper, pod corev1.Pod, gone *goneSet, timeout time.Duration, finished func(*corev1.Pod)) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	defer gone.forget(pod.UID)
	for {
		deleted := gone.chanFor(pod.UID)
		p, err := h.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID):
			finished(&pod)
			return nil
		case err != nil && ctx.Err() == nil:
			return fmt.Errorf("error when waiting for pod %q in namespace %q to terminate: %v", pod.Name, pod.Namespace, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("error when waiting for pod %q in namespace %q to terminate: global timeout reached: %v", pod.Name, pod.Namespace, timeout)
		case <-deleted:
		case <-tick.C:
		}
	}
}

// budgetWaiters are the pods whose eviction a budget refused, by
// namespace, in the order they began to wait.
type budgetWaiters struct {
	mu   sync.Mutex
	byNS map[string][]*budgetWaiter
}

type budgetWaiter struct {
	ns     string
	labels labels.Set
	ch     chan struct{} // closed when woken
}

func newBudgetWaiters() *budgetWaiters { return &budgetWaiters{byNS: map[string][]*budgetWaiter{}} }

func (b *budgetWaiters) add(pod corev1.Pod) *budgetWaiter {
	w := &budgetWaiter{ns: pod.Namespace, labels: labels.Set(pod.Labels), ch: make(chan struct{})}
	b.mu.Lock()
	b.byNS[w.ns] = append(b.byNS[w.ns], w)
	b.mu.Unlock()
	return w
}

func (b *budgetWaiters) remove(w *budgetWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.byNS[w.ns]
	for i, x := range l {
		if x == w {
			b.byNS[w.ns] = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	if len(b.byNS[w.ns]) == 0 {
		delete(b.byNS, w.ns)
	}
}

// wake wakes up to pdb's disruptionsAllowed waiters whose pod it selects,
// longest waiting first, and removes them.
func (b *budgetWaiters) wake(pdb *policyv1.PodDisruptionBudget) {
	n := int(pdb.Status.DisruptionsAllowed)
	if n <= 0 || pdb.Spec.Selector == nil {
		return
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var keep []*budgetWaiter
	for _, w := range b.byNS[pdb.Namespace] {
		if n > 0 && sel.Matches(w.labels) {
			close(w.ch)
			n--
			continue
		}
		keep = append(keep, w)
	}
	if len(keep) == 0 {
		delete(b.byNS, pdb.Namespace)
	} else {
		b.byNS[pdb.Namespace] = keep
	}
}

// watchBudgets feeds budget updates to bw until ctx ends, re-watching
// after the watch closes. A refused watch (no RBAC) leaves the back-off.
func (c *Client) watchBudgets(ctx context.Context, bw *budgetWaiters, note func(string)) {
	for ctx.Err() == nil {
		w, err := c.Core.PolicyV1().PodDisruptionBudgets(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{})
		if err != nil {
			if apierrors.IsForbidden(err) {
				if note != nil {
					note("cannot watch PodDisruptionBudgets (is deploy/rbac.yaml older than the agent?): refused evictions are retried on a back-off only: " + err.Error())
				}
				return
			}
			sleepCtx(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if pdb, ok := ev.Object.(*policyv1.PodDisruptionBudget); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				bw.wake(pdb)
			}
		}
		w.Stop()
	}
}

// goneSet signals the deletion of watched pods by UID.
type goneSet struct {
	mu sync.Mutex
	ch map[types.UID]chan struct{}
}

func newGoneSet() *goneSet { return &goneSet{ch: map[types.UID]chan struct{}{}} }

func (g *goneSet) chanFor(uid types.UID) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch[uid] == nil {
		g.ch[uid] = make(chan struct{})
	}
	return g.ch[uid]
}

func (g *goneSet) forget(uid types.UID) {
	g.mu.Lock()
	delete(g.ch, uid)
	g.mu.Unlock()
}

func (g *goneSet) deleted(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch := g.ch[uid]; ch != nil {
		close(ch)
		g.ch[uid] = make(chan struct{}) // a later wait blocks again (its GET decides)
	}
}

// watchGone reports pods of this node deleted, until ctx ends.
func (c *Client) watchGone(ctx context.Context, g *goneSet) {
	for ctx.Err() == nil {
		w, err := c.Core.CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.Node})
		if err != nil {
			if apierrors.IsForbidden(err) {
				return // the GETs alone decide
			}
			sleepCtx(ctx, time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted {
				g.deleted(p.UID)
			}
		}
		w.Stop()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
