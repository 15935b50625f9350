package crash

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// TestReadinessDeadlineAcrossKills: the real agent reboots a node
// (simulated host) whose 8 nvidia.com/gpu never come back, with
// readiness.timeout 20s, and is SIGKILLed twice during the wait before the
// uncordon (about 7 s and 16 s into it) and restarted each time. The
// deadline is the wait's first start plus readiness.timeout, journaled: the
// event ends Failed naming readiness.timeout at max(first start + 20s, the
// last restart's start) plus a few polls. A deadline restarted with the
// agent would end it 20 s after the last restart's start, at least 16 s
// later than that (the assertion allows 10 s), whatever the restarts cost.
// The times compared are the agent's own, from the event's status: the
// step's start while the first agent waited, and the last attempt's start
// and finish.
// gpuNode is a node with a kubelet stand-in and 8 allocatable
// nvidia.com/gpu, its agent's case, and readers of its event.
type gpuNode struct {
	c        *crashCase
	lc       *apiclient.LifecycleClients
	setGPUs  func(int64)
	setReady func(bool)
	get      func() *v1alpha1.LifecycleEvent
	msg      func() string
	cordoned func() bool
}

func newGPUNode(t *testing.T, node, config string) gpuNode {
	t.Helper()
	ctx := context.Background()
	admin := env.AdminConfig()
	kubelet := chaosNode(t, node)
	cs := kubernetes.NewForConfigOrDie(admin)
	g := gpuNode{}
	g.setGPUs = func(n int64) {
		t.Helper()
		if err := testenv.SetAllocatable(ctx, admin, node, "nvidia.com/gpu", n); err != nil {
			t.Fatal(err)
		}
	}
	g.setReady = func(ready bool) {
		t.Helper()
		if err := testenv.SetNodeReady(ctx, admin, node, ready); err != nil {
			t.Fatal(err)
		}
	}
	g.setGPUs(8)
	g.c = chaosCase(t, node, node+"-reboot", agentConfig+config, env.NodeConfig(node))
	g.c.kubelet = kubelet
	var err error
	if g.lc, err = apiclient.NewLifecycleClients(admin); err != nil {
		t.Fatal(err)
	}
	g.get = func() *v1alpha1.LifecycleEvent {
		got, err := g.lc.Events.Get(ctx, g.c.event, metav1.GetOptions{})
		if err != nil {
			return &v1alpha1.LifecycleEvent{Status: v1alpha1.LifecycleEventStatus{Message: "error: " + err.Error()}}
		}
		return got
	}
	g.msg = func() string {
		got := g.get()
		return string(got.Status.ClaimStatus) + ": " + got.Status.Message + " [" + stepStates(got) + "]"
	}
	g.cordoned = func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Spec.Unschedulable
	}
	return g
}

// reboot creates the node's reboot event once agent a published the
// transition; the node is NotReady from then on, so the event stops at
// wait-ready after the reboot until the test says otherwise.
func (g gpuNode) reboot(t *testing.T, a *agentProc) {
	t.Helper()
	ctx := context.Background()
	tn := g.c.node + "-reboot"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := g.lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	g.setReady(false)
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: g.c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: g.c.node}}
	if _, err := g.lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// gpusGone waits for the reboot to be done, then takes the GPUs away and
// makes the node Ready: the readiness wait begins and names the GPUs.
func (g gpuNode) gpusGone(t *testing.T, a *agentProc) {
	t.Helper()
	waitFor(t, "the reboot done, waiting for Ready", time.Minute, a, func() bool { return strings.Contains(g.msg(), "reboot=Done") }, g.msg)
	g.setGPUs(0)
	g.setReady(true)
}

func waitStep(ev *v1alpha1.LifecycleEvent) *v1alpha1.StepStatus {
	for i := range ev.Status.Steps {
		if ev.Status.Steps[i].Name == "wait-workloads-ready" {
			return &ev.Status.Steps[i]
		}
	}
	return &v1alpha1.StepStatus{}
}

const gpusMissing = "allocatable nvidia.com/gpu is 0 of 8"

// TestReadinessDeadlineAcrossKills: the real agent reboots a node
// (simulated host) whose 8 nvidia.com/gpu never come back, with
// readiness.timeout 20s, and is SIGKILLed twice during the wait before the
// uncordon (about 7 s and 16 s into it) and restarted each time. The
// deadline is the wait's first start plus readiness.timeout, journaled: the
// event ends Failed naming readiness.timeout at max(first start + 20s, the
// last restart's start) plus a few polls. A deadline restarted with the
// agent would end it 20 s after the last restart's start, at least 16 s
// later than that (the assertion allows 10 s), whatever the restarts cost.
// The times compared are the agent's own, from the event's status: the
// step's start while the first agent waited, and the last attempt's start
// and finish.
func TestReadinessDeadlineAcrossKills(t *testing.T) {
	const timeout = 20 * time.Second
	g := newGPUNode(t, "ready-deadline", "readiness:\n  timeout: 20s\n")
	a := g.c.start(t, "")
	defer func() { a.kill() }()
	g.reboot(t, a)
	g.gpusGone(t, a)

	// The first agent waits, naming the GPUs: the wait's first start.
	var first time.Time
	waitFor(t, "the wait naming the GPUs", time.Minute, a, func() bool {
		ev := g.get()
		if s := waitStep(ev); s.State == v1alpha1.StepRunning && s.StartTime != nil && strings.Contains(ev.Status.Message, gpusMissing) {
			first = s.StartTime.Time
			return true
		}
		return false
	}, g.msg)
	// killAt kills agent a once it waits in attempt n, not before at.
	killAt := func(a *agentProc, n int32, at time.Duration) {
		t.Helper()
		waitFor(t, "the wait resumed", time.Minute, a, func() bool {
			ev := g.get()
			s := waitStep(ev)
			return s.State == v1alpha1.StepRunning && s.Attempt >= n && strings.Contains(ev.Status.Message, gpusMissing)
		}, g.msg)
		time.Sleep(time.Until(first.Add(at)))
		a.kill()
	}
	killAt(a, 1, 7*time.Second)
	a = g.c.start(t, "")
	killAt(a, 2, 16*time.Second)
	if !strings.Contains(a.logText(), "resumed after a restart") {
		t.Error("the restarted agent's progress does not say the wait was resumed")
	}
	a = g.c.start(t, "")
	waitFor(t, "the event Failed", 2*time.Minute, a, func() bool { return g.get().Status.ClaimStatus == v1alpha1.LifecycleEventFailed }, g.msg)

	end := g.get()
	if m := end.Status.Message; !strings.Contains(m, "readiness.timeout") || !strings.Contains(m, gpusMissing) {
		t.Errorf("Failed with %q; want it to name readiness.timeout and %q", m, gpusMissing)
	}
	s := waitStep(end)
	if s.State != v1alpha1.StepFailed || s.StartTime == nil || s.FinishTime == nil || s.Attempt < 3 {
		t.Fatalf("wait-workloads-ready: %+v; want Failed at attempt 3 or later, with its times", *s)
	}
	last, failed := s.StartTime.Time, s.FinishTime.Time
	due := first.Add(timeout)
	if last.After(due) {
		due = last // resumed past the deadline: one last look
	}
	t.Logf("wait began %s; last attempt (%d) began +%s; failed +%s (due +%s)", first.Format(time.RFC3339),
		s.Attempt, last.Sub(first), failed.Sub(first), due.Sub(first))
	if late := failed.Sub(due); late > 10*time.Second {
		t.Errorf("the wait failed %s after its first start (last restart +%s): %s past the journaled deadline; a restart gave it a fresh readiness.timeout",
			failed.Sub(first), last.Sub(first), late)
	}
	if !g.cordoned() {
		t.Error("the node is not kept cordoned after the readiness timeout")
	}
}

// TestReadinessSnapshotAfterClaimCrash: the agent dies right after its
// claim was accepted, before the journal holds the event (failpoint
// engineAfterClaim). Restarted, it adopts the event and resolves the plan
// again — the readiness snapshot included — which is safe because nothing
// of the event has run yet: the node still has its 8 GPUs, and every step
// runs only after the journal commit that holds the plan. The reboot then
// loses the GPUs and the wait holds the uncordon until they are back.
// (A claim write that failed, a conflict or an outage, likewise resolves
// again on the next try with nothing done; replays after that commit never
// resolve again: TestReadinessWaitAcrossCrash.)
func TestReadinessSnapshotAfterClaimCrash(t *testing.T) {
	g := newGPUNode(t, "ready-adopt", "")
	a := g.c.start(t, `engineAfterClaim=1*panic("crash at engineAfterClaim")`)
	defer func() { a.kill() }()
	g.reboot(t, a)
	select {
	case <-a.done:
	case <-time.After(time.Minute):
		t.Fatalf("the agent did not die at engineAfterClaim: %s", g.msg())
	}
	if m := g.msg(); !strings.HasPrefix(m, "Claimed") {
		t.Fatalf("after the crash: %s; want Claimed", m)
	}
	a = g.c.start(t, "")
	g.gpusGone(t, a)
	waitFor(t, "the wait naming the GPUs", time.Minute, a, func() bool { return strings.Contains(g.msg(), gpusMissing) }, g.msg)
	if !strings.Contains(a.logText(), "adopted an event this agent had claimed") {
		t.Error("the restarted agent did not adopt the event (the path under test)")
	}
	time.Sleep(5 * time.Second) // it has 5 s to wrongly pass
	if m := g.msg(); !strings.HasPrefix(m, "Claimed") || !g.cordoned() {
		t.Fatalf("with the GPUs missing: %s (cordoned %v); want the wait holding the uncordon", m, g.cordoned())
	}
	g.setGPUs(8)
	waitFor(t, "the reboot to succeed", time.Minute, a, func() bool { return strings.HasPrefix(g.msg(), "Succeeded") }, g.msg)
	if g.cordoned() {
		t.Error("the node is still cordoned after the event succeeded")
	}
}
