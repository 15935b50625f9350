package apiclient

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
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
	"k8s.io/kubectl/pkg/util/podutils"
)

// Budget-aware eviction. The drain library's own loop (DeleteOrEvictPods)
// retries an eviction a PodDisruptionBudget refused after a fixed
// EvictErrorRetryDelay — kubectl's 5 s — however soon the budget allows
// the next disruption, and sends an eviction for every pod at once, most of
// them refused. Here the library still filters the pods
// (GetPodsForDeletion) and sends each eviction (EvictPod); around it:
//
//   - the PodDisruptionBudgets are listed, then watched, into a cache of
//     each budget's disruptionsAllowed; a pod is sent for eviction only
//     when every budget that selects it allows a disruption, taking one
//     (so a budget of 1 lets one of its pods through, not all of them,
//     and a refused eviction is rare instead of the rule);
//   - a pod a budget holds back waits, sending nothing, until an update of
//     a budget that selects it reports disruptionsAllowed > 0 (at most that
//     many waiting pods are woken per update);
//   - a pod that is not Ready is never held back: the API server may let
//     an unhealthy pod go when its budget allows nothing
//     (unhealthyPodEvictionPolicy), which the cache cannot judge;
//   - a bounded back-off is the safety net: MinEvictRetry
//     (DrainOptions.MinRetry), doubling, up to RetryDelay; when it runs
//     out the eviction is sent whatever the cache says, and the server
//     decides; never a hot loop;
//   - every pod is evicted in parallel, so independent budgets never wait
//     on each other;
//   - an evicted pod is gone when a watch of the node's pods reports it
//     deleted, or a GET finds it gone (every second without that watch,
//     every five with it).
//
// Without RBAC to watch PDBs (an older deploy/rbac.yaml) the cache is never
// current and every retry is the back-off's, no slower than the library.

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
	bw := newBudgets()
	synced := make(chan struct{})
	go c.watchBudgets(ctx, bw, o.OnBlocked, synced)
	gone := newGoneSet()
	watching := make(chan struct{})
	go c.watchGone(ctx, gone, watching)
	// The first evictions wait for the budgets' list and the pod watch (or
	// their refusal).
	for _, ch := range []chan struct{}{synced, watching} {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}

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
	bw *budgets, gone *goneSet, timeout time.Duration, finished func(*corev1.Pod)) error {
	first := o.MinRetry
	if first <= 0 {
		first = MinEvictRetry
	}
	backoff := min(first, o.RetryDelay)
	if pod.DeletionTimestamp != nil {
		// Already terminating (an eviction or deletion before the agent
		// restarted, a power cut mid-drain): its grace period runs; an
		// eviction now would be a second one, accepted and pointless.
		return c.waitGone(ctx, h, pod, gone, timeout, finished)
	}
	send := false  // the back-off's turn: send even if the cache says no
	held := false  // told OnBlocked that a budget holds the pod back
	blocked := ""  // why the pod was last held back or refused
	lastNote := "" // the last refusal told OnBlocked
	timedOut := func() error {
		if blocked == "" {
			return fmt.Errorf("error when evicting pods/%q -n %q: global timeout reached: %v", pod.Name, pod.Namespace, timeout)
		}
		return fmt.Errorf("error when evicting pods/%q -n %q: global timeout reached: %v; blocked: %s", pod.Name, pod.Namespace, timeout, blocked)
	}
	for {
		w := bw.add(pod) // before the decision: a budget freed meanwhile is not missed
		if !bw.take(pod, send) {
			blocked = bw.why(pod)
			if !held && o.OnBlocked != nil {
				held = true
				o.OnBlocked(fmt.Sprintf("eviction of pod %s/%s blocked: %s", pod.Namespace, pod.Name, blocked))
			}
		} else {
			err := h.EvictPod(pod, gv)
			switch {
			case ctx.Err() != nil:
				bw.remove(w)
				return timedOut()
			case err == nil:
				bw.remove(w)
				return c.waitGone(ctx, h, pod, gone, timeout, finished)
			case apierrors.IsNotFound(err):
				bw.remove(w)
				return nil
			case apierrors.IsTooManyRequests(err):
				bw.refused(pod)
				why := c.evicts.get(pod.Namespace + "/" + pod.Name)
				if why == "" {
					why = "eviction refused (429)"
				}
				blocked = why
				// Said once per reason: a refusal repeated on the back-off is
				// not news, and each note is a status write.
				if msg := fmt.Sprintf("eviction of pod %s/%s blocked: %s", pod.Namespace, pod.Name, why); o.OnBlocked != nil && msg != lastNote {
					lastNote = msg
					o.OnBlocked(msg)
				}
				held = true
			case apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
				bw.remove(w)
				fresh, gerr := h.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
				if apierrors.IsNotFound(gerr) {
					finished(&pod)
					return nil
				}
				if gerr == nil && !fresh.DeletionTimestamp.IsZero() {
					// Never evictable in a terminating namespace; it is
					// being deleted: wait for that.
					return c.waitGone(ctx, h, pod, gone, timeout, finished)
				}
				w = bw.add(pod)
			default:
				bw.restore(pod)
				bw.remove(w)
				return fmt.Errorf("error when evicting pods/%q -n %q: %v", pod.Name, pod.Namespace, err)
			}
		}
		t := time.NewTimer(backoff)
		send = false
		select {
		case <-ctx.Done():
		case <-w.ch: // a budget selecting the pod allows a disruption
		case <-t.C:
			send = true
			backoff = min(2*backoff, o.RetryDelay)
		}
		t.Stop()
		bw.remove(w)
		if ctx.Err() != nil {
			return timedOut()
		}
	}
}

// waitGone waits until the evicted pod is deleted (or replaced by one of
// the same name) and reports it finished: told by the node's pod watch,
// or found by a GET — at once and every second without the watch, every
// five seconds with it (a safety net).
func (c *Client) waitGone(ctx context.Context, h *drain.Helper, pod corev1.Pod, gone *goneSet, timeout time.Duration, finished func(*corev1.Pod)) error {
	check := !gone.isCurrent()
	for {
		if check {
			p, err := h.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) || (err == nil && p.UID != pod.UID):
				finished(&pod)
				return nil
			case err != nil && ctx.Err() == nil:
				return fmt.Errorf("error when waiting for pod %q in namespace %q to terminate: %v", pod.Name, pod.Namespace, err)
			}
		}
		every := time.Second
		if gone.isCurrent() {
			every = 5 * time.Second
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("error when waiting for pod %q in namespace %q to terminate: global timeout reached: %v", pod.Name, pod.Namespace, timeout)
		case <-gone.chanFor(pod.UID):
			t.Stop()
			finished(&pod)
			return nil
		case <-t.C:
			check = true
		}
	}
}

// budgets is the drain's view of the PodDisruptionBudgets: each budget's
// disruptionsAllowed (less what this drain took since the last update),
// and the pods waiting for one.
type budgets struct {
	mu      sync.Mutex
	current bool // listed and watched: the cache can say no
	pdbs    map[types.NamespacedName]*budget
	waiters map[string][]*budgetWaiter // by namespace, longest waiting first
}

type budget struct {
	sel              labels.Selector
	allowed          int32
	desired, healthy int32 // the status's desiredHealthy and currentHealthy
}

type budgetWaiter struct {
	ns     string
	labels labels.Set
	ch     chan struct{} // closed when woken
}

func newBudgets() *budgets {
	return &budgets{pdbs: map[types.NamespacedName]*budget{}, waiters: map[string][]*budgetWaiter{}}
}

// selecting returns the budgets of pod's namespace whose selector matches
// it. Under b.mu.
func (b *budgets) selecting(pod corev1.Pod) []*budget {
	var out []*budget
	for k, p := range b.pdbs {
		if k.Namespace == pod.Namespace && p.sel.Matches(labels.Set(pod.Labels)) {
			out = append(out, p)
		}
	}
	return out
}

// PodReady reports whether pod's Ready condition is True, judged by
// kubectl's podutils (the package that may import k8s.io/kubectl is this
// one; internal/readiness asks here).
func PodReady(pod *corev1.Pod) bool { return podutils.IsPodReady(pod) }

// take reports whether to send pod's eviction now: when the cache is not
// current, when force, when the pod is not Ready (the server judges an
// unhealthy pod by the budget's unhealthyPodEvictionPolicy), or when
// every budget selecting the pod allows a disruption — one of which it
// then takes from each.
func (b *budgets) take(pod corev1.Pod, force bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	sel := b.selecting(pod)
	// A Ready pod is what the disruption controller counts healthy.
	if b.current && !force && PodReady(&pod) {
		for _, p := range sel {
			if p.allowed <= 0 {
				return false
			}
		}
	}
	for _, p := range sel {
		if p.allowed > 0 {
			p.allowed--
		}
	}
	return true
}

// restore gives back what take took (the eviction failed for another
// reason than the budget).
func (b *budgets) restore(pod corev1.Pod) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.selecting(pod) {
		p.allowed++
	}
}

// refused records the server's 429: the budgets selecting pod allow
// nothing until their next update.
func (b *budgets) refused(pod corev1.Pod) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.selecting(pod) {
		p.allowed = 0
	}
}

// why says which budgets hold pod back, in the API server's words for a
// refused eviction ("The disruption budget web needs 3 healthy pods and
// has 3 currently"), from their last status.
func (b *budgets) why(pod corev1.Pod) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var parts []string
	for k, p := range b.pdbs {
		if k.Namespace == pod.Namespace && p.allowed <= 0 && p.sel.Matches(labels.Set(pod.Labels)) {
			parts = append(parts, fmt.Sprintf("PodDisruptionBudget: The disruption budget %s needs %d healthy pods and has %d currently", k.Name, p.desired, p.healthy))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

func (b *budgets) add(pod corev1.Pod) *budgetWaiter {
	w := &budgetWaiter{ns: pod.Namespace, labels: labels.Set(pod.Labels), ch: make(chan struct{})}
	b.mu.Lock()
	b.waiters[w.ns] = append(b.waiters[w.ns], w)
	b.mu.Unlock()
	return w
}

func (b *budgets) remove(w *budgetWaiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.waiters[w.ns]
	for i, x := range l {
		if x == w {
			b.waiters[w.ns] = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	if len(b.waiters[w.ns]) == 0 {
		delete(b.waiters, w.ns)
	}
}

// update records pdb as the server has it and wakes up to its
// disruptionsAllowed waiters whose pod it selects, longest waiting first.
func (b *budgets) update(pdb *policyv1.PodDisruptionBudget) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := types.NamespacedName{Namespace: pdb.Namespace, Name: pdb.Name}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || pdb.Spec.Selector == nil {
		delete(b.pdbs, key) // selects nothing (policy/v1: a nil selector)
		return
	}
	st := pdb.Status
	b.pdbs[key] = &budget{sel: sel, allowed: st.DisruptionsAllowed, desired: st.DesiredHealthy, healthy: st.CurrentHealthy}
	b.wakeLocked(pdb.Namespace, sel, int(pdb.Status.DisruptionsAllowed))
}

// deleted forgets a budget and wakes the pods it selected.
func (b *budgets) deleted(pdb *policyv1.PodDisruptionBudget) {
	b.mu.Lock()
	defer b.mu.Unlock()
	key := types.NamespacedName{Namespace: pdb.Namespace, Name: pdb.Name}
	if p := b.pdbs[key]; p != nil {
		delete(b.pdbs, key)
		b.wakeLocked(pdb.Namespace, p.sel, math.MaxInt)
	}
}

func (b *budgets) wakeLocked(ns string, sel labels.Selector, n int) {
	var keep []*budgetWaiter
	for _, w := range b.waiters[ns] {
		if n > 0 && sel.Matches(w.labels) {
			close(w.ch)
			n--
			continue
		}
		keep = append(keep, w)
	}
	if len(keep) == 0 {
		delete(b.waiters, ns)
	} else {
		b.waiters[ns] = keep
	}
}

// setCurrent marks the cache current (listed, watch running) or not, and
// when it stops being current wakes every waiter: the back-off decides.
// setCurrent marks the cache current (its watch runs) or not. A watch
// that ends wakes no one: each held pod already has its back-off timer,
// and the list that starts the next watch wakes the pods whose budgets it
// finds free (update). Waking them all at every restart sent an eviction
// per held pod at once, each refused, each a status write.
func (b *budgets) setCurrent(on bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.current = on
}

// watchTimeout is what a drain's watches ask the server for, as client-go's
// reflector does: 5 to 10 minutes, spread so that many agents' watches do
// not end together.
func watchTimeout() *int64 {
	s := int64(300 + rand.IntN(300))
	return &s
}

// rewatchBackoff paces the list and watch that follow a watch's end: at
// once after a watch that ran a while (the server's timeout), then 1 s
// doubling to 30 s while watches keep ending early (a flapping connection
// or server), so a restart never costs a burst and never a hot loop.
type rewatchBackoff struct{ next time.Duration }

func (r *rewatchBackoff) wait(ctx context.Context, ran time.Duration) {
	if ran >= 30*time.Second {
		r.next = 0
		return
	}
	r.next = min(max(2*r.next, time.Second), 30*time.Second)
	sleepCtx(ctx, r.next)
}

// watchBudgets lists the budgets into b, then watches them from the list's
// resourceVersion until ctx ends, listing again whenever the watch ends.
// synced is closed after the first list, or when budgets cannot be listed
// (no RBAC: the back-off alone retries).
func (c *Client) watchBudgets(ctx context.Context, b *budgets, note func(string), synced chan struct{}) {
	once := sync.OnceFunc(func() { close(synced) })
	defer once()
	api := c.watchClients().PolicyV1().PodDisruptionBudgets(metav1.NamespaceAll)
	var back rewatchBackoff
	for ctx.Err() == nil {
		l, err := api.List(ctx, metav1.ListOptions{})
		if err != nil {
			if apierrors.IsForbidden(err) {
				if note != nil {
					note("cannot list PodDisruptionBudgets (is deploy/rbac.yaml older than the agent?): refused evictions are retried on a back-off only: " + err.Error())
				}
				return
			}
			once()
			sleepCtx(ctx, time.Second)
			continue
		}
		for i := range l.Items {
			b.update(&l.Items[i])
		}
		w, err := api.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion, TimeoutSeconds: watchTimeout()})
		if err != nil {
			once()
			sleepCtx(ctx, time.Second)
			continue
		}
		b.setCurrent(true)
		once()
		began := time.Now()
		for ev := range w.ResultChan() {
			pdb, ok := ev.Object.(*policyv1.PodDisruptionBudget)
			if !ok {
				break // an error (e.g. 410 Gone): list again
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				b.update(pdb)
			case watch.Deleted:
				b.deleted(pdb)
			}
		}
		w.Stop()
		b.setCurrent(false)
		back.wait(ctx, time.Since(began))
	}
}

// goneSet is what the node's pod watch saw deleted during the drain, by
// UID, and a channel per pod waited for.
type goneSet struct {
	mu      sync.Mutex
	current bool // the watch runs
	dead    map[types.UID]bool
	ch      map[types.UID]chan struct{}
}

func newGoneSet() *goneSet {
	return &goneSet{dead: map[types.UID]bool{}, ch: map[types.UID]chan struct{}{}}
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// chanFor is closed once the pod of uid is deleted (at once if it was).
func (g *goneSet) chanFor(uid types.UID) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead[uid] {
		return closedChan
	}
	if g.ch[uid] == nil {
		g.ch[uid] = make(chan struct{})
	}
	return g.ch[uid]
}

func (g *goneSet) deleted(uid types.UID) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dead[uid] = true
	if ch := g.ch[uid]; ch != nil {
		close(ch)
		delete(g.ch, uid)
	}
}

func (g *goneSet) isCurrent() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.current
}

func (g *goneSet) setCurrent(on bool) {
	g.mu.Lock()
	g.current = on
	g.mu.Unlock()
}

// watchGone records the node's pods deleted, until ctx ends. Deletions
// while no watch runs are found by waitGone's GETs.
func (c *Client) watchGone(ctx context.Context, g *goneSet, started chan struct{}) {
	once := sync.OnceFunc(func() { close(started) })
	defer once()
	var back rewatchBackoff
	for ctx.Err() == nil {
		w, err := c.watchClients().CoreV1().Pods(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.Node, TimeoutSeconds: watchTimeout()})
		if err != nil {
			once()
			if apierrors.IsForbidden(err) {
				return // the GETs alone decide
			}
			sleepCtx(ctx, time.Second)
			continue
		}
		g.setCurrent(true)
		once()
		began := time.Now()
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted {
				g.deleted(p.UID)
			}
		}
		w.Stop()
		g.setCurrent(false)
		back.wait(ctx, time.Since(began))
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
