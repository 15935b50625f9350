package apiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubectl/pkg/drain"
)

// DrainOptions are the drain driver's parameters.
type DrainOptions struct {
	// GracePeriodSeconds overrides the pods' own; -1 keeps theirs.
	GracePeriodSeconds int
	DeleteEmptyDirData bool
	PodSelector        string
	// RetryDelay between evictions refused by a PodDisruptionBudget
	// (kubectl's CLI uses 5 s; the library's 0 is a hot loop).
	RetryDelay time.Duration
	// MinRetry is the first back-off after a refused eviction, doubling up
	// to RetryDelay; 0 means MinEvictRetry. A budget that allows the
	// eviction again wakes the retry sooner (evict.go).
	MinRetry time.Duration
	// Timeout bounds the evictions (kubectl's --timeout); 0: none.
	Timeout time.Duration
	// OnBlocked is called when an eviction is refused, with a message that
	// names the pod and the PodDisruptionBudget.
	OnBlocked func(msg string)
	// OnEvicted is called once per pod whose eviction was accepted.
	OnEvicted func(pod string)
}

// DrainResult says what a drain did.
type DrainResult struct {
	Evicted  []string // namespace/name, in order of acceptance
	Warnings string   // e.g. DaemonSet pods left in place
}

// Drain evicts this node's pods through the Eviction API (honouring PDBs)
// with k8s.io/kubectl/pkg/drain and waits until they are gone. DaemonSet
// pods stay; mirror pods are skipped. It returns when the node is empty or
// ctx ends (the caller sets ctx's deadline to the event's sla).
func (c *Client) Drain(ctx context.Context, o DrainOptions) (DrainResult, error) {
	if o.RetryDelay <= 0 {
		o.RetryDelay = 5 * time.Second
	}
	var res DrainResult
	var mu sync.Mutex
	var out, errOut bytes.Buffer
	h := &drain.Helper{
		Ctx:                  ctx,
		Client:               nodeScopedClient{c.Core},
		Force:                false,
		GracePeriodSeconds:   o.GracePeriodSeconds,
		IgnoreAllDaemonSets:  true,
		DeleteEmptyDirData:   o.DeleteEmptyDirData,
		PodSelector:          o.PodSelector,
		EvictErrorRetryDelay: o.RetryDelay,
		Timeout:              o.Timeout,
		Out:                  &lockedWriter{w: &out, mu: &mu},
		ErrOut:               &blockedWriter{w: &errOut, mu: &mu, c: c, on: o.OnBlocked},
		OnPodDeletionOrEvictionFinished: func(p *corev1.Pod, _ bool, err error) {
			if err != nil {
				return
			}
			mu.Lock()
			res.Evicted = append(res.Evicted, p.Namespace+"/"+p.Name)
			mu.Unlock()
			if o.OnEvicted != nil {
				o.OnEvicted(p.Namespace + "/" + p.Name)
			}
		},
	}
	// The sooner of drain.timeout and the step's deadline (the sla).
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return res, context.DeadlineExceeded
		}
		if h.Timeout == 0 || left < h.Timeout {
			h.Timeout = left
		}
	}
	list, errs := h.GetPodsForDeletion(c.Node)
	if len(errs) > 0 {
		return res, fmt.Errorf("apiclient: drain %s: %v", c.Node, joinErrs(errs))
	}
	res.Warnings = list.Warnings()
	finished := func(p *corev1.Pod) { h.OnPodDeletionOrEvictionFinished(p, true, nil) }
	if err := c.evictPods(ctx, h, list.Pods(), o, finished); err != nil {
		if ctx.Err() != nil {
			return res, fmt.Errorf("apiclient: drain %s: %w (%v)", c.Node, ctx.Err(), err)
		}
		return res, fmt.Errorf("apiclient: drain %s: %w", c.Node, err)
	}
	return res, nil
}

// PodsLeft lists the pods still on the node that a drain would evict.
func (c *Client) PodsLeft(ctx context.Context, o DrainOptions) ([]string, error) {
	h := &drain.Helper{Ctx: ctx, Client: c.Core, IgnoreAllDaemonSets: true, DeleteEmptyDirData: o.DeleteEmptyDirData,
		PodSelector: o.PodSelector, Out: io.Discard, ErrOut: io.Discard}
	list, errs := h.GetPodsForDeletion(c.Node)
	if len(errs) > 0 {
		return nil, fmt.Errorf("apiclient: list pods on %s: %v", c.Node, joinErrs(errs))
	}
	var names []string
	for _, p := range list.Pods() {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	sort.Strings(names)
	return names, nil
}

func joinErrs(errs []error) string {
	var s []string
	for _, e := range errs {
		s = append(s, e.Error())
	}
	return strings.Join(s, "; ")
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

var evictRetryLine = regexp.MustCompile(`error when evicting pods/"([^"]+)" -n "([^"]+)" \(will retry`)

// blockedWriter reads the drain library's retry lines and turns each into a
// message naming the pod and, from the recorded 429 body, the PDB.
type blockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
	c  *Client
	on func(string)
}

func (b *blockedWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	n, err := b.w.Write(p)
	b.mu.Unlock()
	if b.on != nil {
		for _, m := range evictRetryLine.FindAllSubmatch(p, -1) {
			ns, pod := string(m[2]), string(m[1])
			why := b.c.evicts.get(ns + "/" + pod)
			if why == "" {
				why = "eviction refused (429)"
			}
			b.on(fmt.Sprintf("eviction of pod %s/%s blocked: %s", ns, pod, why))
		}
	}
	return n, err
}

// evictionRecorder keeps the last refusal reason per pod, and counts
// eviction requests (for tests and benchmarks).
type evictionRecorder struct {
	mu       sync.Mutex
	blocked  map[string]string
	requests atomic.Int64
}

func (r *evictionRecorder) set(pod, why string) {
	r.mu.Lock()
	r.blocked[pod] = why
	r.mu.Unlock()
}

func (r *evictionRecorder) get(pod string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blocked[pod]
}

// EvictionRequests returns how many eviction requests this client sent.
func (c *Client) EvictionRequests() int64 { return c.evicts.requests.Load() }

var evictionPath = regexp.MustCompile(`/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$`)

// evictionTransport bounds client-go's silent retries of 429 answers to
// evictions: it removes Retry-After, so the request returns at once and the
// drain loop (with its own delay) retries; and it records the refusal's
// causes, which name the PodDisruptionBudget.
type evictionTransport struct {
	next http.RoundTripper
	rec  *evictionRecorder
}

func (t *evictionTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	m := evictionPath.FindStringSubmatch(req.URL.Path)
	if m == nil || req.Method != http.MethodPost {
		return t.next.RoundTrip(req)
	}
	t.rec.requests.Add(1)
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		return resp, err
	}
	resp.Header.Del("Retry-After")
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr == nil {
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil {
			why := st.Message
			if st.Details != nil {
				for _, c := range st.Details.Causes {
					if c.Type == "DisruptionBudget" {
						why = "PodDisruptionBudget: " + c.Message
					}
				}
			}
			t.rec.set(m[1]+"/"+m[2], why)
		}
	}
	return resp, nil
}

// WrappedRoundTripper lets client-go reach the transport below (to cancel
// requests).
func (t *evictionTransport) WrappedRoundTripper() http.RoundTripper { return t.next }
