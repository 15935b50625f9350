package crash

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// The randomized fault schedule (docs/reliability.md#fault-schedules): the
// real agent binary (simulate host mode) on the real control plane, behind
// a TCP proxy the test cuts, with a kubelet stand-in and pods. Each
// schedule picks a driver and a random sequence of faults at random
// moments after the event's creation — SIGKILL (restarted after a random
// time, sometimes with the event deleted while the agent is down), an API
// outage (connections reset, or left half-open) of random length
// (sometimes with the event deleted during it), a cancel while the agent
// runs — and then checks the invariants. CHAOS_SEED=n replays a batch,
// CHAOS_SCHEDULES=n sets its size, CHAOS_PDB=1 puts the pods behind a
// PodDisruptionBudget (make chaos does both).

type faultKind string

const (
	faultKill    faultKind = "kill"     // SIGKILL, down for dur, then restarted
	faultOutage  faultKind = "outage"   // connections reset and refused for dur
	faultHalf    faultKind = "halfopen" // connections left half-open for dur
	faultCancel  faultKind = "cancel"   // the event deleted while the agent runs
	settleBound            = 200 * time.Second
	chaosDrivers           = "drain,uncordon,reboot"
)

type fault struct {
	kind   faultKind
	at     time.Duration // after the event's creation
	dur    time.Duration
	cancel bool // kill, outage, halfopen: delete the event meanwhile
}

func (f fault) String() string {
	s := fmt.Sprintf("%s@%dms", f.kind, f.at.Milliseconds())
	if f.dur > 0 {
		s += fmt.Sprintf("+%dms", f.dur.Milliseconds())
	}
	if f.cancel {
		s += "+cancel"
	}
	return s
}

type schedule struct {
	i      int
	driver string
	faults []fault
}

func (s schedule) String() string {
	var f []string
	for _, x := range s.faults {
		f = append(f, x.String())
	}
	return fmt.Sprintf("%02d-%s[%s]", s.i, s.driver, strings.Join(f, ","))
}

func newSchedule(rng *rand.Rand, i int) schedule {
	drv := strings.Split(chaosDrivers, ",")
	s := schedule{i: i, driver: drv[rng.IntN(len(drv))]}
	n := 1 + rng.IntN(3)
	kinds := []faultKind{faultKill, faultOutage, faultHalf, faultCancel}
	at := time.Duration(0)
	for range n {
		k := kinds[rng.IntN(len(kinds))]
		at += time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
		f := fault{kind: k, at: at}
		if k != faultCancel {
			f.dur = 300*time.Millisecond + time.Duration(rng.Int64N(int64(3*time.Second)))
			f.cancel = rng.IntN(4) == 0
		}
		s.faults = append(s.faults, f)
		at += f.dur
		if k == faultCancel || f.cancel {
			break // nothing after the cancel but the end
		}
	}
	return s
}

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: runs the real agent through random fault schedules against a real control plane (minutes); skipped under -short")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	n := 12
	if s := os.Getenv("CHAOS_SCHEDULES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("CHAOS_SCHEDULES=%q: want a count", s)
		}
		n = v
	}
	pdb := os.Getenv("CHAOS_PDB") == "1"
	t.Logf("chaos: %d schedules, seed %d (CHAOS_SEED=%d replays them), PodDisruptionBudget %v", n, seed, seed, pdb)
	rng := rand.New(rand.NewPCG(seed, 0xc4a05))
	var scheds []schedule
	for i := range n {
		scheds = append(scheds, newSchedule(rng, i))
	}
	kinds := map[faultKind]int{}
	var mu sync.Mutex
	var failed []string
	for _, s := range scheds {
		for _, f := range s.faults {
			kinds[f.kind]++
		}
		t.Run(s.String(), func(t *testing.T) {
			runSchedule(t, s, pdb)
			if t.Failed() {
				mu.Lock()
				failed = append(failed, s.String())
				mu.Unlock()
			}
		})
	}
	t.Logf("chaos summary: %d schedules, faults by kind %v, violations in %d: %v (seed %d)", n, kinds, len(failed), failed, seed)
}

// eventLog records every state of the event a watch saw.
type eventLog struct {
	mu     sync.Mutex
	states []*v1alpha1.LifecycleEvent
}

func watchEvent(ctx context.Context, lc *apiclient.LifecycleClients, name string) (*eventLog, error) {
	w, err := lc.Events.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return nil, err
	}
	l := &eventLog{}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if le, ok := ev.Object.(*v1alpha1.LifecycleEvent); ok {
				l.mu.Lock()
				l.states = append(l.states, le.DeepCopy())
				l.mu.Unlock()
			}
		}
	}()
	return l, nil
}

// lastEnd is the last end state seen ("" if none).
func (l *eventLog) lastEnd() v1alpha1.LifecycleEventClaimStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	var end v1alpha1.LifecycleEventClaimStatus
	for _, ev := range l.states {
		if ev.Status.ClaimStatus.Finished() {
			end = ev.Status.ClaimStatus
		}
	}
	return end
}

func stepRank(s v1alpha1.StepState) int {
	switch s {
	case v1alpha1.StepRunning:
		return 1
	case v1alpha1.StepDone, v1alpha1.StepSkipped, v1alpha1.StepFailed:
		return 2
	}
	return 0
}

// check reports the ways the recorded states went backwards: an end state
// that changed, a step that went back from an end.
func (l *eventLog) check() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	var end v1alpha1.LifecycleEventClaimStatus
	best := map[string]int{}
	for _, ev := range l.states {
		cs := ev.Status.ClaimStatus
		if end != "" && cs != end {
			out = append(out, fmt.Sprintf("end state %s changed to %q (rv %s)", end, cs, ev.ResourceVersion))
		}
		if cs.Finished() && end == "" {
			end = cs
		}
		for _, s := range ev.Status.Steps {
			r := stepRank(s.State)
			if best[s.Name] == 2 && r < 2 {
				out = append(out, fmt.Sprintf("step %s went back from done to %s (rv %s)", s.Name, s.State, ev.ResourceVersion))
			}
			best[s.Name] = max(best[s.Name], r)
		}
	}
	return out
}

func runSchedule(t *testing.T, s schedule, pdb bool) {
	ctx := context.Background()
	admin := env.AdminConfig()
	ensureSpare(t)
	node := fmt.Sprintf("chaos-%02d-%s", s.i, s.driver)
	c := &crashCase{node: node, event: "chaos-" + node, dir: t.TempDir(), sockDir: shortDir(t)}
	if err := testenv.CreateNode(ctx, admin, node, map[string]string{"crash": "true"}); err != nil {
		t.Fatal(err)
	}
	k, err := testenv.RunKubeletStandIn(ctx, admin, node)
	if err != nil {
		t.Fatal(err)
	}
	c.kubelet = k
	minAvail := 0
	if pdb {
		minAvail = 2
	}
	w := &testenv.Workload{Namespace: node, Name: "web", Node: node, Spare: spareNode, Replicas: replicas, MinAvailable: minAvail}
	if err := w.Start(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, admin, node, replicas); err != nil {
		t.Fatal(err)
	}
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	c.kubeconfig = filepath.Join(c.dir, "node.kubeconfig")
	if err := testenv.WriteKubeconfig(c.kubeconfig, proxy.Config(env.NodeConfig(node))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.config(), []byte(agentConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range c.logs {
				t.Logf("---- %s (last 60 lines)\n%s", filepath.Base(l), tail(l, 60))
			}
		}
	})
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(admin)

	a := c.start(t, "")
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, node+"-"+s.driver, metav1.GetOptions{})
		return err == nil
	})
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	rec, err := watchEvent(wctx, lc, c.event)
	if err != nil {
		t.Fatal(err)
	}
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: node + "-" + s.driver, BindingNode: node}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	deleted := false
	var cancelledAlive time.Time // a cancel while the agent ran and reached the API
	halfOpenBefore := false
	del := func() {
		if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		deleted = true
	}
	faults := append([]fault(nil), s.faults...)
	sort.Slice(faults, func(i, j int) bool { return faults[i].at < faults[j].at })
	for _, f := range faults {
		time.Sleep(time.Until(created.Add(f.at)))
		switch f.kind {
		case faultKill:
			a.kill()
			if f.cancel {
				del()
			}
			time.Sleep(f.dur)
			a = c.start(t, "")
		case faultOutage, faultHalf:
			if f.kind == faultHalf {
				proxy.Blackhole()
			} else {
				proxy.Cut()
			}
			if f.cancel {
				del()
			}
			time.Sleep(f.dur)
			proxy.Heal()
		case faultCancel:
			del()
			// A half-open connection is found only ~6 s after it died (the
			// HTTP/2 health check): until then the agent cannot know.
			if !halfOpenBefore {
				cancelledAlive = time.Now()
			}
		}
		if f.kind == faultHalf {
			halfOpenBefore = true
		}
	}

	// 1. One end state, or gone with no finalizer, within settleBound of the last fault.
	var final *v1alpha1.LifecycleEvent
	waitFor(t, "the event to settle (an end state with no finalizer, or gone)", settleBound, a, func() bool {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			final = nil
			return true
		}
		if err == nil && got.Status.ClaimStatus.Finished() && len(got.Finalizers) == 0 {
			final = got
			return true
		}
		return false
	})
	if deleted && final != nil {
		t.Errorf("the event was deleted but is still there, %s", final.Status.ClaimStatus)
	}
	waitFor(t, "the agent to be idle with its outbox delivered", 60*time.Second, a, func() bool {
		st, err := statusFromSocket(ctx, c.socket())
		return err == nil && st.Event == nil && st.Outbox == 0
	})
	stopWatch()
	for _, v := range rec.check() {
		t.Errorf("went backwards: %s", v)
	}

	// 2. Nothing non-idempotent twice: each pod evicted at most once, at
	// most one (simulated) reboot for the event.
	evs, err := auditEvictions(node)
	if err != nil {
		t.Fatal(err)
	}
	for pod, n := range evs.accepted {
		if n > 1 {
			t.Errorf("pod %s evicted %d times", pod, n)
		}
	}
	reboots := 0
	for _, l := range c.logs {
		b, _ := os.ReadFile(l)
		reboots += strings.Count(string(b), "simulated reboot (nothing rebooted)")
	}
	if reboots > 1 {
		t.Errorf("%d reboots for one event", reboots)
	}
	// ... and none after a cancel the agent saw (the watch tells it within
	// milliseconds; 2 s allow for a step that was already acting).
	if !cancelledAlive.IsZero() {
		for _, at := range evs.acceptedAt {
			if at.After(cancelledAlive.Add(2 * time.Second)) {
				t.Errorf("an eviction accepted at %s, %s after the cancel", at.Format(time.RFC3339Nano), at.Sub(cancelledAlive).Round(time.Millisecond))
			}
		}
		for _, at := range rebootTimes(c.logs) {
			if at.After(cancelledAlive.Add(2 * time.Second)) {
				t.Errorf("a reboot at %s, %s after the cancel", at.Format(time.RFC3339Nano), at.Sub(cancelledAlive).Round(time.Millisecond))
			}
		}
	}

	// 3. At rest the node is cordoned only by a drain that succeeded.
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A drain deleted after it Succeeded keeps its cordon (its contract):
	// the last end state seen decides.
	wantCordon := rec.lastEnd() == v1alpha1.LifecycleEventSucceeded && s.driver == "drain"
	by := n.Annotations[v1alpha1.AnnotationCordonedBy]
	switch {
	case wantCordon && (!n.Spec.Unschedulable || by != c.event):
		t.Errorf("a succeeded drain left the node unschedulable=%v cordoned-by=%q", n.Spec.Unschedulable, by)
	case !wantCordon && (n.Spec.Unschedulable || by != ""):
		t.Errorf("node left unschedulable=%v cordoned-by=%q after %s", n.Spec.Unschedulable, by, endName(final))
	}

	// 4. The Node's condition agrees with the end: not in progress.
	if cond := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition); cond != nil && cond.Status != corev1.ConditionFalse {
		t.Errorf("node condition %s=%s/%s (%s) at rest after %s", v1alpha1.NodeConditionLifecycleTransition, cond.Status, cond.Reason, cond.Message, endName(final))
	}

	// 6. A clean stop.
	if err := a.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
	t.Logf("%s: ended %s, %d eviction(s) accepted, %d refused, %d cut, %d reboot(s), %d agent run(s)",
		s, endName(final), len(evs.accepted), evs.refused, len(evs.other), reboots, c.runs)
}

// rebootTimes are the times of the simulated reboots in the agent logs.
func rebootTimes(logs []string) []time.Time {
	var out []time.Time
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.Contains(line, "simulated reboot (nothing rebooted)") || !strings.HasPrefix(line, "time=") {
				continue
			}
			ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
			if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
				out = append(out, at)
			}
		}
	}
	return out
}

func endName(ev *v1alpha1.LifecycleEvent) string {
	if ev == nil {
		return "gone (deleted)"
	}
	return string(ev.Status.ClaimStatus) + ": " + ev.Status.Message
}
