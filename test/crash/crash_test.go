package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

const (
	spareNode = "crash-spare"
	replicas  = 3
	// minFiredPercent of the failpoints must fire during a drain.
	minFiredPercent = 80
	defaultKills    = 10
	// maxKillDelay bounds the random SIGKILL delay after the event is
	// created; a drain of three pods behind the PDB takes about 2-3 s here.
	maxKillDelay = 3 * time.Second
	// killParallel kill cases run at once (see TestCrashSafety).
	killParallel = 10
	// finishTimeout is how long the restarted agent gets to finish the
	// drain. A SIGKILL in the middle of an eviction request can leave the
	// pod in the PodDisruptionBudget's status.disruptedPods without
	// deleting it (the apiserver updates the PDB, then deletes the pod, and
	// the client's disconnect cancels the second half): the budget stays
	// spent until kube-controller-manager drops the entry, 2 minutes later.
	finishTimeout = 200 * time.Second
)

// crashCase is one drain on its own node, namespace, journal and event.
type crashCase struct {
	node, event string
	hostMode    string   // "" means simulate
	extraEnv    []string // added to the agent's environment
	gofailHTTP  bool     // serve gofail's HTTP endpoint (agentProc.gofail)
	dir         string   // journal, config, agent logs
	sockDir     string   // short: a unix socket path is at most 107 bytes
	kubeconfig  string
	kubelet     *testenv.KubeletStandIn
	runs        int
	logs        []string
}

func (c *crashCase) journal() string { return filepath.Join(c.dir, "journal.db") }
func (c *crashCase) config() string  { return filepath.Join(c.dir, "config.yaml") }
func (c *crashCase) socket() string  { return filepath.Join(c.sockDir, "agent.sock") }

// result is what one case found.
type result struct {
	name       string
	fired      bool   // failpoint: the agent died at it
	firstExit  string // how the first agent ended
	killAfter  time.Duration
	midDrain   bool // kill: the event was not finished when the agent died
	stepsAtEnd string
	attempts   string // status attempts per step, e.g. cordon=1,evict=2,wait-empty=1
	accepted   int    // eviction requests answered 201
	refused    int    // answered 429
	cut        int    // cut by the kill (504 or another answer)
	took       time.Duration
}

// TestCrashSafety crashes the real agent at every engine and journal
// failpoint, and at random times, in the middle of a drain, restarts it on
// the same journal and asserts the outcome (see doc.go).
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("crash: builds the agent with failpoints and runs ~30 drains against a real control plane (minutes); skipped under -short")
	}
	t0 := time.Now()
	fps := agentFP.Failpoints
	if len(fps) < 15 {
		t.Fatalf("found %d engine/journal failpoints (`// gofail: var NAME` in %v), want at least 15: %v", len(fps), failpointDirs, fps)
	}
	t.Logf("failpoint binary %s (hash %s, cached %v, %s); %d failpoints: %s",
		agentFP.Path, agentFP.Hash, agentFP.Cached, agentFP.Took.Round(time.Millisecond), len(fps), strings.Join(fps, " "))

	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CRASH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CRASH_SEED=%q: %v", s, err)
		}
		seed = v
	}
	kills := defaultKills
	if s := os.Getenv("CRASH_KILLS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 0 {
			t.Fatalf("CRASH_KILLS=%q: want a count", s)
		}
		kills = v
	}
	t.Logf("random kills: %d, seed %d (CRASH_SEED=%d replays the delays)", kills, seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x6c61))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cases := prepare(t, ctx, len(fps)+kills)
	t.Logf("prepared %d nodes with %d pods each behind a PodDisruptionBudget in %s", len(cases), replicas, time.Since(t0).Round(time.Millisecond))

	var (
		mu      sync.Mutex
		results []result
	)
	add := func(r result) { mu.Lock(); results = append(results, r); mu.Unlock() }
	// One failpoint at a time.
	for i, fp := range fps {
		c := cases[i]
		t.Run("failpoint/"+fp, func(t *testing.T) {
			r := &result{name: fp}
			defer func() { add(*r) }() // also after t.Fatal
			runCase(t, c, fp, 0, r)
		})
	}
	// The kills, killParallel at a time: a kill that cuts an eviction
	// request in half can stall its drain for 2 minutes (finishTimeout),
	// and it then stalls only its own batch.
	delays := make([]time.Duration, kills)
	for k := range delays {
		delays[k] = time.Millisecond + time.Duration(rng.Int64N(int64(maxKillDelay)))
	}
	sem := make(chan struct{}, killParallel)
	t.Run("kill", func(t *testing.T) {
		for k, delay := range delays {
			c := cases[len(fps)+k]
			name := fmt.Sprintf("%02d-after-%dms", k, delay.Milliseconds())
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				r := &result{name: "kill/" + name}
				defer func() { add(*r) }()
				runCase(t, c, "", delay, r)
			})
		}
	})
	slices.SortStableFunc(results, func(a, b result) int {
		if (a.killAfter > 0) != (b.killAfter > 0) {
			if a.killAfter > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(a.name, b.name)
	})

	// Summary.
	var fired, notFired []string
	midDrain := 0
	var b strings.Builder
	fmt.Fprintf(&b, "%-34s %-6s %-16s %-42s %-30s %s\n", "case", "fired", "first agent", "status.steps", "attempts", "evictions 201/429/cut, time")
	for _, r := range results {
		f := ""
		switch {
		case r.killAfter > 0 && r.midDrain:
			f, midDrain = "kill", midDrain+1
		case r.killAfter > 0:
			f = "late"
		case r.fired:
			f, fired = "yes", append(fired, r.name)
		default:
			f, notFired = "NO", append(notFired, r.name)
		}
		fmt.Fprintf(&b, "%-34s %-6s %-16s %-42s %-30s %d/%d/%d, %s\n", r.name, f, r.firstExit, r.stepsAtEnd, r.attempts, r.accepted, r.refused, r.cut, r.took.Round(10*time.Millisecond))
	}
	for _, fp := range fps {
		if !slices.ContainsFunc(results, func(r result) bool { return r.name == fp }) {
			notFired = append(notFired, fp)
		}
	}
	fmt.Fprintf(&b, "failpoints fired: %d/%d", len(fired), len(fps))
	if len(notFired) > 0 {
		fmt.Fprintf(&b, " (not reached: %s)", strings.Join(notFired, ", "))
	}
	fmt.Fprintf(&b, "\nrandom kills: %d (%d in the middle of the drain, the others after it ended), seed %d\n", kills, midDrain, seed)
	fmt.Fprintf(&b, "time: %s in the tests, %s with the build and the control plane", time.Since(t0).Round(time.Second), (time.Since(t0) + startup).Round(time.Second))
	t.Logf("summary\n%s", b.String())
	if len(fired)*100 < len(fps)*minFiredPercent {
		t.Errorf("only %d of %d failpoints fired during a drain (want at least %d%%); not reached: %v", len(fired), len(fps), minFiredPercent, notFired)
	}
}

// prepare registers n nodes, each with a kubelet stand-in and a workload of
// three pods behind a PodDisruptionBudget (minAvailable 2) whose
// replacements go to one shared spare node.
func prepare(t *testing.T, ctx context.Context, n int) []*crashCase {
	t.Helper()
	admin := env.AdminConfig()
	if err := testenv.CreateNode(ctx, admin, spareNode, map[string]string{"crash": "spare"}); err != nil {
		t.Fatal(err)
	}
	if _, err := testenv.RunKubeletStandIn(ctx, admin, spareNode); err != nil {
		t.Fatal(err)
	}
	cases := make([]*crashCase, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range cases {
		sockDir, err := os.MkdirTemp("", "lacr")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(sockDir) })
		c := &crashCase{node: fmt.Sprintf("crash-%02d", i), dir: t.TempDir(), sockDir: sockDir}
		c.event = "drain-" + c.node
		cases[i] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = c.setUp(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("prepare %s: %v", cases[i].node, err)
		}
	}
	return cases
}

func (c *crashCase) setUp(ctx context.Context) error {
	admin := env.AdminConfig()
	if err := testenv.CreateNode(ctx, admin, c.node, map[string]string{"crash": "true"}); err != nil {
		return err
	}
	k, err := testenv.RunKubeletStandIn(ctx, admin, c.node)
	if err != nil {
		return err
	}
	c.kubelet = k
	w := &testenv.Workload{Namespace: c.node, Name: "web", Node: c.node, Spare: spareNode, Replicas: replicas, MinAvailable: 2}
	if err := w.Start(ctx, admin); err != nil {
		return err
	}
	if err := testenv.WaitPodsRunning(ctx, admin, c.node, replicas); err != nil {
		return fmt.Errorf("pods not running: %w", err)
	}
	if c.kubeconfig, err = env.WriteKubeconfigFor("node:" + c.node); err != nil {
		return err
	}
	return os.WriteFile(c.config(), []byte(agentConfig), 0o600)
}

// runCase drains c's node with an agent that dies — at failpoint fp (with
// GOFAIL_FAILPOINTS=fp=1*panic), or by SIGKILL killAfter after the event
// was created — restarts the agent without failpoints and checks the end.
func runCase(t *testing.T, c *crashCase, fp string, killAfter time.Duration, r *result) {
	start := time.Now()
	defer func() { r.took = time.Since(start) }()
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range c.logs {
				t.Logf("---- %s (last 60 lines)\n%s", filepath.Base(l), tail(l, 60))
			}
		}
	})
	ctx := context.Background()
	admin := env.AdminConfig()
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	r.killAfter = killAfter

	terms := ""
	if fp != "" {
		// Fire once, with a message naming the failpoint (a failpoint of
		// type struct{} panics with "failpoint panic: {}" otherwise).
		terms = fmt.Sprintf(`%s=1*panic("crash at %s")`, fp, fp)
	}
	a1 := c.start(t, terms)
	// The agent publishes its transitions before it watches events.
	waitFor(t, "transition "+c.node+"-drain published", 60*time.Second, a1, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-drain", metav1.GetOptions{})
		return err == nil
	})
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: c.node + "-drain", BindingNode: c.node}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	finished := func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus.Finished() && len(ev.Finalizers) == 0
	}

	if fp != "" {
		// Wait for the crash; a failpoint the drain does not reach shows as
		// a finished event with the agent still running.
		var doneAt time.Time
		deadline := time.Now().Add(90 * time.Second)
		for !a1.exited() {
			if time.Now().After(deadline) {
				t.Fatalf("the agent neither crashed at %s nor finished the drain within 90s", fp)
			}
			if doneAt.IsZero() && finished() {
				doneAt = time.Now()
			}
			if !doneAt.IsZero() && time.Since(doneAt) > 3*time.Second {
				break
			}
			select {
			case <-a1.done:
			case <-time.After(100 * time.Millisecond):
			}
		}
		if a1.exited() {
			r.firstExit = a1.exit()
			r.fired = a1.exitCode() == 2 && strings.Contains(a1.logText(), "panic: failpoint panic: crash at "+fp)
			if !r.fired {
				t.Errorf("the agent died, but not at failpoint %s: %s", fp, a1.exit())
			}
		} else {
			r.firstExit = "not reached"
			t.Logf("failpoint %s was not reached: the drain finished without it", fp)
			if err := a1.stop(20 * time.Second); err != nil {
				t.Error(err)
			}
		}
	} else {
		select {
		case <-a1.done:
			t.Fatalf("the agent died by itself before the kill: %s", a1.exit())
		case <-time.After(time.Until(created.Add(killAfter))):
		}
		r.midDrain = !finished()
		a1.kill()
		r.firstExit = a1.exit()
	}

	// Restart without failpoints on the same journal.
	a2 := c.start(t, "")
	var final *v1alpha1.LifecycleEvent
	waitFor(t, "event "+c.event+" to finish after the restart", finishTimeout, a2, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if err == nil && ev.Status.ClaimStatus.Finished() && len(ev.Finalizers) == 0 {
			final = ev
			return true
		}
		return false
	})
	// The agent is idle, its outbox delivered and the event in its history:
	// only then is the journal final.
	waitFor(t, "the restarted agent to settle", 30*time.Second, a2, func() bool {
		s, err := statusFromSocket(ctx, c.socket())
		return err == nil && s.Event == nil && s.Outbox == 0 &&
			slices.ContainsFunc(s.History, func(h historyItem) bool { return h.Name == c.event })
	})
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}

	// 1. The event succeeded, every step done.
	r.stepsAtEnd = stepStates(final)
	var att []string
	for _, s := range final.Status.Steps {
		att = append(att, fmt.Sprintf("%s=%d", s.Name, s.Attempt))
	}
	r.attempts = strings.Join(att, ",")
	if final.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Errorf("event ended %s: %s", final.Status.ClaimStatus, final.Status.Message)
	}
	if r.stepsAtEnd != "cordon=Done,evict=Done,wait-empty=Done" {
		t.Errorf("status.steps = %s, want cordon=Done,evict=Done,wait-empty=Done", r.stepsAtEnd)
	}

	// 2. The node is cordoned, by this event, and reports the drain done.
	n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != c.event {
		t.Errorf("node: unschedulable=%v, %s=%q; want true and %q", n.Spec.Unschedulable, v1alpha1.AnnotationCordonedBy, n.Annotations[v1alpha1.AnnotationCordonedBy], c.event)
	}
	if cond := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != "DrainComplete" {
		t.Errorf("node condition %s = %+v, want False/DrainComplete", v1alpha1.NodeConditionLifecycleTransition, cond)
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.node})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Errorf("%d pods left on %s", len(pods.Items), c.node)
	}

	// 3. Each pod was evicted at most once (and all are gone, above), by
	// the agent: at most one eviction request per pod answered 201. A
	// request cut by the kill (504) is counted apart; the kubelet stand-in
	// finishing each pod at most once says it was not deleted twice.
	evs, err := auditEvictions(c.node)
	if err != nil {
		t.Fatal(err)
	}
	r.refused, r.cut = evs.refused, len(evs.other)
	for pod, n := range evs.accepted {
		r.accepted += n
		if n > 1 {
			t.Errorf("pod %s/%s evicted %d times (eviction requests answered 201)", c.node, pod, n)
		}
		if !strings.HasPrefix(pod, "web-") {
			t.Errorf("pod %s/%s evicted: not one of the node's pods", c.node, pod)
		}
	}
	if r.accepted == 0 {
		t.Errorf("no eviction of the namespace %s in the audit log %s", c.node, env.AuditLogPath())
	}
	if len(evs.other) > 0 {
		t.Logf("eviction requests cut short (the agent died during them): %v", evs.other)
	}
	for u := range evs.users {
		if u != "system:node:"+c.node {
			t.Errorf("eviction requests by %q; want only system:node:%s", u, c.node)
		}
	}
	for pod, n := range c.kubelet.Finished() {
		if n > 1 {
			t.Errorf("the kubelet stand-in finished pod %s %d times", pod, n)
		}
	}

	// 4. status.steps agree with the journal's history.
	doc, err := c.exportJournal()
	if err != nil {
		t.Fatal(err)
	}
	checkJournal(t, doc, final, c.node)
}

// checkJournal compares the exported journal of a stopped agent with the
// event's final status.
func checkJournal(t *testing.T, doc *journal.ExportDoc, ev *v1alpha1.LifecycleEvent, node string) {
	t.Helper()
	if len(doc.Events) != 0 {
		var names []string
		for _, e := range doc.Events {
			names = append(names, fmt.Sprintf("%s(%s)", e.Name, e.State))
		}
		t.Errorf("journal still holds unfinished events: %v", names)
	}
	if len(doc.Outbox) != 0 {
		t.Errorf("journal outbox not empty: %d entries", len(doc.Outbox))
	}
	var hist []journal.HistoryRecord
	for _, h := range doc.History {
		if h.Event.UID == string(ev.UID) {
			hist = append(hist, h)
		}
	}
	if len(hist) != 1 {
		t.Errorf("journal history holds %d records of event %s (uid %s), want 1", len(hist), ev.Name, ev.UID)
		return
	}
	h := hist[0]
	if h.Outcome != journal.OutcomeSucceeded {
		t.Errorf("journal history: outcome %s, want Succeeded (%s)", h.Outcome, h.Message)
	}
	owned := slices.ContainsFunc(doc.Owned, func(ch journal.Change) bool {
		return ch.Kind == journal.ChangeCordon && ch.Node == node && ch.EventUID == string(ev.UID)
	})
	if !owned {
		t.Errorf("journal does not own the cordon of %s for event %s: owned %+v", node, ev.Name, doc.Owned)
	}

	// The step log: one done record per step, in plan order, attempts
	// numbered 1..n, and the status agrees.
	var order []string
	intents := map[string][]int{}
	dones := map[string]int{}
	last := map[string]journal.StepRecord{}
	for _, s := range h.Steps {
		if !slices.Contains(order, s.Step) {
			order = append(order, s.Step)
		}
		last[s.Step] = s
		switch {
		case s.Phase == journal.PhaseIntent:
			intents[s.Step] = append(intents[s.Step], s.Attempt)
		case s.Phase == journal.PhaseDone && s.State == journal.StepDone:
			dones[s.Step]++
		default:
			t.Errorf("journal step record %s: phase %s state %s (%s)", s.Step, s.Phase, s.State, s.Message)
		}
	}
	var names []string
	for _, s := range ev.Status.Steps {
		names = append(names, s.Name)
	}
	if !slices.Equal(order, names) {
		t.Errorf("journal steps %v, status.steps %v", order, names)
	}
	for _, s := range ev.Status.Steps {
		if dones[s.Name] != 1 {
			t.Errorf("step %s: %d done records in the journal, want 1", s.Name, dones[s.Name])
		}
		if l := last[s.Name]; l.Phase != journal.PhaseDone || l.State != journal.StepDone || s.State != v1alpha1.StepDone {
			t.Errorf("step %s: journal ends %s/%s, status %s", s.Name, l.Phase, l.State, s.State)
		}
		a := intents[s.Name]
		for i, n := range a {
			if n != i+1 {
				t.Errorf("step %s: intent attempts %v, want 1..%d", s.Name, a, len(a))
				break
			}
		}
		if len(a) == 0 || int(s.Attempt) != a[len(a)-1] {
			t.Errorf("step %s: status attempt %d, journal intents %v", s.Name, s.Attempt, a)
		}
	}
}

// waitFor polls f until it is true; it fails at once if the agent exits.
// waitFor polls f until it holds; seen, when given, says what the wait last
// saw, for the failure message.
func waitFor(t *testing.T, what string, timeout time.Duration, a *agentProc, f func() bool, seen ...func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if f() {
			return
		}
		if a.exited() {
			t.Fatalf("waiting for %s: the agent exited (%s)", what, a.exit())
		}
		if time.Now().After(deadline) {
			if len(seen) > 0 {
				t.Fatalf("waiting for %s: %v after %s; last seen: %s", what, errTimeout, timeout, seen[0]())
			}
			t.Fatalf("waiting for %s: %v after %s", what, errTimeout, timeout)
		}
		select {
		case <-a.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func stepStates(ev *v1alpha1.LifecycleEvent) string {
	var s []string
	for _, st := range ev.Status.Steps {
		s = append(s, st.Name+"="+string(st.State))
	}
	return strings.Join(s, ",")
}

func nodeCondition(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
