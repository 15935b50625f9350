package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// Env is a running test control plane (test/testenv: real etcd,
// kube-apiserver and, optionally, kube-controller-manager) with the
// manifests installed, plus admin clients.
type Env struct {
	*testenv.Env
	Core kubernetes.Interface
	LC   *apiclient.LifecycleClients
}

// StartEnv starts the control plane and installs deploy/.
func StartEnv(ctx context.Context, log io.Writer, controllerManager bool) (*Env, error) {
	te, err := testenv.Start(ctx, testenv.Options{Log: log, ControllerManager: controllerManager})
	if err != nil {
		return nil, err
	}
	if err := te.InstallManifests(ctx); err != nil {
		te.Stop()
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(te.AdminConfig())
	if err != nil {
		te.Stop()
		return nil, err
	}
	lc, err := apiclient.NewLifecycleClients(te.AdminConfig())
	if err != nil {
		te.Stop()
		return nil, err
	}
	return &Env{Env: te, Core: cs, LC: lc}, nil
}

// AgentRestConfig is the node identity as the daemon would build it from
// the kubelet's kubeconfig: testenv's client-side QPS (200) is cleared, so
// apiclient.New applies the daemon's own default (20 QPS, burst 40).
func (e *Env) AgentRestConfig(node string) *rest.Config {
	c := rest.CopyConfig(e.NodeConfig(node))
	c.QPS, c.Burst = 0, 0
	return c
}

// CreateNodes registers Ready nodes, width at a time.
func (e *Env) CreateNodes(ctx context.Context, names []string, labels map[string]string) error {
	return parallel(ctx, len(names), 16, func(i int) error {
		return testenv.CreateNode(ctx, e.AdminConfig(), names[i], labels)
	})
}

// parallel runs f(0..n-1) with at most width at a time and returns the
// first error.
func parallel(ctx context.Context, n, width int, f func(i int) error) error {
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// CreateEvent creates a LifecycleEvent bound to node for the transition the
// node's agent published for driver short name (engine.TransitionName).
func (e *Env) CreateEvent(ctx context.Context, name, node, driver string, params map[string]string) error {
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: node + "-" + driver, BindingNode: node, Parameters: params}}
	_, err := e.LC.Events.Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// WaitTransitions waits until node's agent published its transition for
// driver (the engine publishes right after READY).
func (e *Env) WaitTransitions(ctx context.Context, node, driver string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		_, err := e.LC.Transitions.Get(ctx, node+"-"+driver, metav1.GetOptions{})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: transition %s-%s not published: %w (last: %v)", node, driver, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// WaitEventGone waits until the event is deleted (eventRetention 0).
func (e *Env) WaitEventGone(ctx context.Context, name string, timeout time.Duration) (*v1alpha1.LifecycleEvent, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *v1alpha1.LifecycleEvent
	for {
		ev, err := e.LC.Events.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return last, nil
		}
		if err == nil {
			last = ev
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return last, fmt.Errorf("bench: event %s not finished and deleted after %s: status %s %q", name, timeout, last.Status.ClaimStatus, last.Status.Message)
			}
			return nil, fmt.Errorf("bench: event %s: %w", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// EndFromEvents reads how event name ended from the Kubernetes Event the
// agent records with its outcome (one per event, internal/engine finish),
// for an event whose end state the observer's watch missed
// (Observer.GoneUnseen). It waits up to timeout for that Event: the agent
// posts it beside the end state, not before the deletion.
func (e *Env) EndFromEvents(ctx context.Context, name string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sel := "involvedObject.kind=LifecycleEvent,involvedObject.name=" + name
	for {
		l, err := e.Core.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err == nil {
			if end, ok := endFromEvents(l.Items); ok {
				return end, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("bench: no Kubernetes Event with the outcome of event %s within %s (last: %v)", name, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// endFromEvents is the outcome in an event's Kubernetes Events, as the
// observer writes a status ("<claimStatus>: <message>"): the agent's one
// outcome Event is Normal with the transition's end state as its reason
// when the event succeeded, Normal with reason Cancelled when it was
// cancelled, and a Warning (Failed, SlaExpired) otherwise; the per-step
// StepFailed warnings and a TakenOver are not outcomes.
func endFromEvents(evs []corev1.Event) (string, bool) {
	for _, k := range evs {
		if k.Source.Component != "lifecycle-agent" {
			continue
		}
		switch {
		case k.Reason == "StepFailed" || k.Reason == "TakenOver":
		case k.Reason == engine.ReasonCancelled:
			return "Cancelled: " + k.Message, true
		case k.Type == corev1.EventTypeNormal:
			return string(v1alpha1.LifecycleEventSucceeded) + ": " + k.Message, true
		default:
			return k.Reason + ": " + k.Message, true
		}
	}
	return "", false
}

// GetNode reads a node as admin.
func (e *Env) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return e.Core.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

// ---- the API server's own counters ----

// ServerCounters are counters read from kube-apiserver's /metrics.
type ServerCounters struct {
	// Requests is apiserver_request_total summed by verb (GET, LIST,
	// WATCH, POST, PUT, PATCH, DELETE, ...).
	Requests map[string]float64
	// FlowSchema is apiserver_flowcontrol_dispatched_requests_total summed
	// by flow schema. The flow schemas system-nodes and system-node-high
	// hold every request of an identity in group system:nodes, i.e. of the
	// agents (NodeRequests).
	FlowSchema map[string]float64
	// DurationSum and DurationCount are apiserver_request_duration_seconds
	// by verb (the server's own time per request, from receipt to
	// response).
	DurationSum, DurationCount map[string]float64
	// APFWaitSum and APFWaitCount are
	// apiserver_flowcontrol_request_wait_duration_seconds by priority
	// level (time queued before execution).
	APFWaitSum, APFWaitCount map[string]float64
	// Watches is apiserver_request_total{verb="WATCH"} by resource, and
	// TerminatedWatchers apiserver_terminated_watchers_total by resource:
	// the watches the server's watch cache closed because their client
	// did not take its events in time (why watches restart under load).
	Watches, TerminatedWatchers map[string]float64
	// Received is apiserver_watch_cache_events_received_total by resource:
	// the changes the watch cache took from etcd, each one offered to
	// every watcher of the resource (whose goroutine applies its selector).
	// Dispatched is apiserver_watch_cache_events_dispatched_total (on
	// kube-apiserver 1.37 exactly twice Received for every resource; kept
	// for reference, the bench uses Received). Sent is
	// apiserver_watch_events_total: the events that passed a watcher's
	// selector and went to its client.
	Received, Dispatched, Sent map[string]float64
	// CPUSeconds is the API server's own process_cpu_seconds_total.
	CPUSeconds float64
}

// MeanMs returns sum/count in milliseconds per key, for keys with a count.
func MeanMs(sum, count map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, n := range count {
		if n > 0 {
			out[k] = 1000 * sum[k] / n
		}
	}
	return out
}

// NodeRequests is what the flow schemas of group system:nodes dispatched.
func (c ServerCounters) NodeRequests() float64 {
	return c.FlowSchema["system-nodes"] + c.FlowSchema["system-node-high"]
}

// Total is the sum of Requests.
func (c ServerCounters) Total() float64 {
	t := 0.0
	for _, v := range c.Requests {
		t += v
	}
	return t
}

// Sub returns c - o.
func (c ServerCounters) Sub(o ServerCounters) ServerCounters {
	r := newServerCounters()
	sub := func(dst, a, b map[string]float64) {
		for k, v := range a {
			dst[k] = v - b[k]
		}
	}
	sub(r.Requests, c.Requests, o.Requests)
	sub(r.FlowSchema, c.FlowSchema, o.FlowSchema)
	sub(r.DurationSum, c.DurationSum, o.DurationSum)
	sub(r.DurationCount, c.DurationCount, o.DurationCount)
	sub(r.APFWaitSum, c.APFWaitSum, o.APFWaitSum)
	sub(r.APFWaitCount, c.APFWaitCount, o.APFWaitCount)
	sub(r.Watches, c.Watches, o.Watches)
	sub(r.TerminatedWatchers, c.TerminatedWatchers, o.TerminatedWatchers)
	sub(r.Received, c.Received, o.Received)
	sub(r.Dispatched, c.Dispatched, o.Dispatched)
	sub(r.Sent, c.Sent, o.Sent)
	r.CPUSeconds = c.CPUSeconds - o.CPUSeconds
	return r
}

func newServerCounters() ServerCounters {
	return ServerCounters{Requests: map[string]float64{}, FlowSchema: map[string]float64{},
		DurationSum: map[string]float64{}, DurationCount: map[string]float64{},
		APFWaitSum: map[string]float64{}, APFWaitCount: map[string]float64{},
		Watches: map[string]float64{}, TerminatedWatchers: map[string]float64{},
		Received: map[string]float64{}, Dispatched: map[string]float64{}, Sent: map[string]float64{}}
}

// Scrape reads the counters from /metrics as admin (parsed by
// prometheus/common's expfmt, the text format's reference parser). The
// scrape itself is one GET that the next scrape counts.
func (e *Env) Scrape(ctx context.Context) (ServerCounters, error) {
	c := newServerCounters()
	body, err := e.Core.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		return c, fmt.Errorf("bench: scrape /metrics: %w", err)
	}
	defer body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return c, fmt.Errorf("bench: parse /metrics: %w", err)
	}
	// sumBy adds each sample of a family to dst[its label key].
	sumBy := func(dst map[string]float64, family, key string, value func(*dto.Metric) float64) {
		f := families[family]
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == key {
					dst[l.GetValue()] += value(m)
				}
			}
		}
	}
	counter := func(m *dto.Metric) float64 { return m.GetCounter().GetValue() }
	hsum := func(m *dto.Metric) float64 { return m.GetHistogram().GetSampleSum() }
	hcount := func(m *dto.Metric) float64 { return float64(m.GetHistogram().GetSampleCount()) }
	sumBy(c.Requests, "apiserver_request_total", "verb", counter)
	sumBy(c.FlowSchema, "apiserver_flowcontrol_dispatched_requests_total", "flow_schema", counter)
	sumBy(c.DurationSum, "apiserver_request_duration_seconds", "verb", hsum)
	sumBy(c.DurationCount, "apiserver_request_duration_seconds", "verb", hcount)
	sumBy(c.APFWaitSum, "apiserver_flowcontrol_request_wait_duration_seconds", "priority_level", hsum)
	sumBy(c.APFWaitCount, "apiserver_flowcontrol_request_wait_duration_seconds", "priority_level", hcount)
	sumBy(c.TerminatedWatchers, "apiserver_terminated_watchers_total", "resource", counter)
	sumBy(c.Received, "apiserver_watch_cache_events_received_total", "resource", counter)
	sumBy(c.Dispatched, "apiserver_watch_cache_events_dispatched_total", "resource", counter)
	sumBy(c.Sent, "apiserver_watch_events_total", "resource", counter)
	if f := families["process_cpu_seconds_total"]; f != nil && len(f.GetMetric()) > 0 {
		c.CPUSeconds = f.GetMetric()[0].GetCounter().GetValue()
	}
	if f := families["apiserver_request_total"]; f != nil {
		for _, m := range f.GetMetric() {
			verb, res := "", ""
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "verb":
					verb = l.GetValue()
				case "resource":
					res = l.GetValue()
				}
			}
			if verb == "WATCH" {
				c.Watches[res] += counter(m)
			}
		}
	}
	return c, nil
}

// ---- processes ----

// ProcSample is a process's CPU time and memory from /proc.
type ProcSample struct {
	At  time.Time
	CPU time.Duration // utime + stime
	RSS int64         // VmRSS, bytes
	HWM int64         // VmHWM (peak RSS), bytes
	// RssAnon and RssFile split RSS: anonymous memory (heap, stacks) and
	// mapped files (mostly the binary's own pages).
	RssAnon, RssFile int64
	// Pss is the proportional set size (smaps_rollup): shared pages count
	// a share each; PssAnon and PssFile split it. 0 when unreadable.
	Pss, PssAnon, PssFile int64
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// ReadProc samples /proc/<pid>/stat and /proc/<pid>/status.
func ReadProc(pid int) (ProcSample, error) {
	s := ProcSample{At: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The command name (field 2) may hold spaces: split after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return s, fmt.Errorf("bench: short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	s.CPU = time.Duration(ut+st) * time.Second / clockTicks
	st2, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	kb := kbFields(st2)
	s.RSS, s.HWM, s.RssAnon, s.RssFile = kb["VmRSS"], kb["VmHWM"], kb["RssAnon"], kb["RssFile"]
	// smaps_rollup: Linux ≥ 4.14; its absence leaves the PSS figures 0.
	if r, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)); err == nil {
		kb := kbFields(r)
		s.Pss, s.PssAnon, s.PssFile = kb["Pss"], kb["Pss_Anon"], kb["Pss_File"]
	}
	return s, nil
}

// kbFields reads /proc's "Key:   123 kB" lines into bytes by key.
func kbFields(b []byte) map[string]int64 {
	out := map[string]int64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		out[k] = kb << 10
	}
	return out
}

// CPUPercent is the CPU used between two samples, in percent of one core.
func CPUPercent(a, b ProcSample) float64 {
	wall := b.At.Sub(a.At)
	if wall <= 0 {
		return 0
	}
	return 100 * float64(b.CPU-a.CPU) / float64(wall)
}

// Sampler samples a process every interval and keeps the peak RSS.
type Sampler struct {
	pid   int
	mu    sync.Mutex
	first ProcSample
	last  ProcSample
	peak  int64
	stop  chan struct{}
	done  chan struct{}
}

// StartSampler starts sampling pid.
func StartSampler(pid int, every time.Duration) (*Sampler, error) {
	s0, err := ReadProc(pid)
	if err != nil {
		return nil, err
	}
	s := &Sampler{pid: pid, first: s0, last: s0, peak: s0.RSS, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			if p, err := ReadProc(pid); err == nil {
				s.mu.Lock()
				s.last = p
				s.peak = max(s.peak, p.RSS)
				s.mu.Unlock()
			}
		}
	}()
	return s, nil
}

// Stop ends sampling and returns the first and a final sample and the
// peak RSS seen.
func (s *Sampler) Stop() (first, last ProcSample, peakRSS int64) {
	close(s.stop)
	<-s.done
	if p, err := ReadProc(s.pid); err == nil {
		s.last = p
		s.peak = max(s.peak, p.RSS)
	}
	return s.first, s.last, s.peak
}

// ---- the agent's own requests, counted at its client ----

// Counter counts HTTP requests by "VERB resource[/subresource]" (VERB is
// the HTTP method, or LIST/WATCH for collection GETs). Installed as the
// agent's rest.Config WrapTransport, it sees exactly the requests made
// with the agent's identity.
type Counter struct {
	mu    sync.Mutex
	m     map[string]int
	bytes map[string]int64 // request bodies, by the same key
}

// NewCounter returns an empty Counter.
func NewCounter() *Counter { return &Counter{m: map[string]int{}, bytes: map[string]int64{}} }

// Wrap is a rest.Config WrapTransport.
func (c *Counter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return &countingTransport{c: c, next: rt}
}

type countingTransport struct {
	c    *Counter
	next http.RoundTripper
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	k := classify(r)
	t.c.mu.Lock()
	t.c.m[k]++
	if r.ContentLength > 0 {
		t.c.bytes[k] += r.ContentLength
	}
	t.c.mu.Unlock()
	return t.next.RoundTrip(r)
}

// WrappedRoundTripper lets client-go reach the transport below (to cancel
// requests).
func (t *countingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

// Snapshot returns a copy of the counts.
func (c *Counter) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshotLocked()
}

func (c *Counter) snapshotLocked() map[string]int {
	m := make(map[string]int, len(c.m))
	for k, v := range c.m {
		m[k] = v
	}
	return m
}

// SnapshotBytes is Snapshot with a copy of the request body bytes, by the
// same key, taken together.
func (c *Counter) SnapshotBytes() (map[string]int, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := make(map[string]int64, len(c.bytes))
	for k, v := range c.bytes {
		b[k] = v
	}
	return c.snapshotLocked(), b
}

// IsWrite says whether a key of Counter is a write (POST, PUT, PATCH, DELETE).
func IsWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	switch verb {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
		return true
	}
	return false
}

// DiffCounts returns b - a, without zero entries.
func DiffCounts(a, b map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range b {
		if n := v - a[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

// classify names a request "VERB resource[/subresource]".
func classify(r *http.Request) string {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// /api/v1/... or /apis/<group>/<version>/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return r.Method + " " + r.URL.Path
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	res := ""
	named := false
	switch len(parts) {
	case 0:
	case 1:
		res = parts[0]
	case 2:
		res, named = parts[0], true
	default:
		res, named = parts[0]+"/"+parts[2], true
	}
	verb := r.Method
	if verb == http.MethodGet && !named {
		verb = "LIST"
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			verb = "WATCH"
		}
	}
	return verb + " " + res
}

// ---- statistics ----

// Dist summarizes latencies in milliseconds.
type Dist struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50Ms"`
	P90  float64 `json:"p90Ms"`
	P99  float64 `json:"p99Ms"`
	Max  float64 `json:"maxMs"`
	Mean float64 `json:"meanMs"`
}

// Summarize computes nearest-rank percentiles.
func Summarize(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	rank := func(p float64) time.Duration {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return Dist{N: len(s), P50: ms(rank(0.50)), P90: ms(rank(0.90)), P99: ms(rank(0.99)), Max: ms(s[len(s)-1]),
		Mean: ms(sum / time.Duration(len(s)))}
}

func (d Dist) String() string {
	return fmt.Sprintf("p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms (n=%d)", d.P50, d.P90, d.P99, d.Max, d.N)
}

// ---- the machine ----

// Machine describes where a benchmark ran.
type Machine struct {
	CPU       string  `json:"cpu"`
	Cores     int     `json:"cores"`
	MemoryGiB float64 `json:"memoryGiB"`
	Kernel    string  `json:"kernel"`
	Go        string  `json:"go"`
	LoadAvg   string  `json:"loadAvgAtStart"`
}

// ThisMachine reads /proc.
func ThisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "MemTotal:") {
				kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
				m.MemoryGiB = float64(int(kb/1024/1024*10)) / 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	return m
}

func (m Machine) String() string {
	return fmt.Sprintf("%d× %s, %.1f GiB, Linux %s, %s, load %s", m.Cores, m.CPU, m.MemoryGiB, m.Kernel, m.Go, m.LoadAvg)
}
