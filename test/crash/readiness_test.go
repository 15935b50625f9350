package crash

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// readinessWait is a reboot event whose agent was SIGKILLed while it
// waited, after the reboot, for the 8 nvidia.com/gpu the node had at claim.
type readinessWait struct {
	c        *crashCase
	lc       *apiclient.LifecycleClients
	msg      func() string
	cordoned func() bool
	setGPUs  func(int64)
}

const readinessMissing = "allocatable nvidia.com/gpu is 0 of 8"

func killedInReadinessWait(t *testing.T, node string) readinessWait {
	t.Helper()
	w, a := rebootWithoutGPUs(t, node, "readiness:\n  timeout: 5m\n", "")
	waitFor(t, "the wait naming the GPUs", time.Minute, a, func() bool { return strings.Contains(w.msg(), readinessMissing) }, w.msg)
	a.kill()
	if !w.cordoned() {
		t.Fatal("the node is not cordoned while the agent waits for the GPUs")
	}
	return w
}

// rebootWithoutGPUs runs the real agent (config agentConfig+readiness,
// GOFAIL_FAILPOINTS failpoints) on a node with a DaemonSet pod and 8
// nvidia.com/gpu, and a reboot event for it; after the reboot the node is
// Ready again but its GPUs are not back (0), so the event waits in
// wait-workloads-ready when this returns.
func rebootWithoutGPUs(t *testing.T, node, readiness, failpoints string) (readinessWait, *agentProc) {
	t.Helper()
	ctx := context.Background()
	admin := env.AdminConfig()
	kubelet := chaosNode(t, node)
	cs := kubernetes.NewForConfigOrDie(admin)
	setGPUs := func(n int64) {
		t.Helper()
		if err := testenv.SetAllocatable(ctx, admin, node, "nvidia.com/gpu", n); err != nil {
			t.Fatal(err)
		}
	}
	setReady := func(ready bool) {
		t.Helper()
		if err := testenv.SetNodeReady(ctx, admin, node, ready); err != nil {
			t.Fatal(err)
		}
	}
	// A DaemonSet with its pod on the node (the stand-in makes it Ready).
	if _, err := testenv.CreateDaemonSetPod(ctx, admin, node, "plugin", node, "lifecycle.test/pause:1"); err != nil {
		t.Fatal(err)
	}
	setGPUs(8)
	c := chaosCase(t, node, node+"-reboot", agentConfig+readiness, env.NodeConfig(node))
	c.kubelet = kubelet
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	a := c.start(t, failpoints)
	tn := node + "-reboot"
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, tn, metav1.GetOptions{})
		return err == nil
	})
	// NotReady from here: the event stops at wait-ready after the reboot.
	setReady(false)
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: tn, BindingNode: node}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := func() string {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if err != nil {
			return "error: " + err.Error()
		}
		return string(got.Status.ClaimStatus) + ": " + got.Status.Message + " [" + stepStates(got) + "]"
	}
	waitFor(t, "the reboot done, waiting for Ready", time.Minute, a, func() bool { return strings.Contains(msg(), "reboot=Done") }, msg)
	setGPUs(0)
	setReady(true)
	cordoned := func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && n.Spec.Unschedulable
	}
	return readinessWait{c: c, lc: lc, msg: msg, cordoned: cordoned, setGPUs: setGPUs}, a
}

// TestCrashAfterTheAbortKeepsTheKeptCordon: the readiness wait times out
// with readiness.onTimeout keepCordoned (the default), and the agent dies
// at the end of its abort (failpoint engineAfterAbort), after the abort
// let go of the cordon and before the end state was journaled. Restarted,
// it replays the abort: the cordon must stay for an admin, as it would
// have without the crash, and the event end Failed saying so. (The kept
// record was dropped with the cordon's in the abort: the replay found
// neither, took the ordinary abort and uncordoned the node it had just
// decided was not ready.)
func TestCrashAfterTheAbortKeepsTheKeptCordon(t *testing.T) {
	ctx := context.Background()
	w, a1 := rebootWithoutGPUs(t, "ready-kept-crash", "readiness:\n  timeout: 3s\n", `engineAfterAbort=1*panic("crash at engineAfterAbort")`)
	select {
	case <-a1.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("the agent did not reach engineAfterAbort within 90s: %s", w.msg())
	}
	if !strings.Contains(a1.logText(), "panic: failpoint panic: crash at engineAfterAbort") {
		t.Fatalf("the agent died, but not at engineAfterAbort: %s", a1.exit())
	}
	if !w.cordoned() {
		t.Fatalf("the node is not cordoned after the kept cordon's abort: %s", w.msg())
	}
	a2 := w.c.start(t, "")
	defer func() { _ = a2.stop(30 * time.Second) }()
	waitFor(t, "the event to end Failed", time.Minute, a2, func() bool { return strings.HasPrefix(w.msg(), "Failed") }, w.msg)
	if m := w.msg(); !strings.Contains(m, "the node stays cordoned") || !strings.Contains(m, readinessMissing) {
		t.Errorf("the end state: %s; want the GPUs named and the kept cordon said", m)
	}
	n, err := kubernetes.NewForConfigOrDie(env.AdminConfig()).CoreV1().Nodes().Get(ctx, w.c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != w.c.event {
		t.Errorf("after the replayed abort the node is unschedulable=%v, cordoned-by %q; want it kept cordoned by %s for an admin",
			n.Spec.Unschedulable, n.Annotations[v1alpha1.AnnotationCordonedBy], w.c.event)
	}
}

// TestReadinessWaitCancelledWhileDown: the event is deleted while its agent
// is down in the readiness wait (killed there). Restarted, the agent
// cancels it: the node is uncordoned (the cordon was ours), the event is
// gone with no end state ever written, nothing waits any more.
func TestReadinessWaitCancelledWhileDown(t *testing.T) {
	ctx := context.Background()
	w := killedInReadinessWait(t, "ready-cancel")
	wa, err := w.lc.Events.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + w.c.event})
	if err != nil {
		t.Fatal(err)
	}
	defer wa.Stop()
	if err := w.lc.Events.Delete(ctx, w.c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a := w.c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	timeout := time.After(time.Minute)
	for gone := false; !gone; {
		select {
		case e, ok := <-wa.ResultChan():
			if !ok {
				t.Fatal("the test's watch ended")
			}
			if e.Type == watch.Deleted {
				gone = true
				break
			}
			if ev, ok := e.Object.(*v1alpha1.LifecycleEvent); ok && ev.Status.ClaimStatus.Finished() {
				t.Errorf("an end state on the cancelled event: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
			}
		case <-timeout:
			t.Fatalf("the cancelled event is not gone a minute after the restart: %s", w.msg())
		}
	}
	waitFor(t, "the node uncordoned", 30*time.Second, a, func() bool { return !w.cordoned() })
}

// TestReadinessWaitAcrossCrash: the real agent reboots a node (simulated
// host) whose 8 nvidia.com/gpu are not re-registered after the reboot; it
// waits before the uncordon, naming them, and is SIGKILLed during that
// wait. Restarted, it resumes the wait against the snapshot journaled at
// claim — not one re-read now, which would see 0 GPUs and pass at once —
// and the event ends Succeeded, uncordoned, only once the GPUs are back.
func TestReadinessWaitAcrossCrash(t *testing.T) {
	w := killedInReadinessWait(t, "ready-crash")
	c, msg, cordoned, setGPUs := w.c, w.msg, w.cordoned, w.setGPUs
	const missing = readinessMissing
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	// The restarted agent waits again (it has 5 s to wrongly pass).
	time.Sleep(5 * time.Second)
	if m := msg(); !strings.HasPrefix(m, "Claimed") || !cordoned() {
		t.Fatalf("after the restart, with the GPUs still missing: %s (cordoned %v); want the wait resumed against the claim-time snapshot", m, cordoned())
	}
	waitFor(t, "the restarted agent naming the GPUs", time.Minute, a, func() bool { return strings.Contains(msg(), missing) }, msg)
	setGPUs(8)
	waitFor(t, "the reboot to succeed", time.Minute, a, func() bool { return strings.HasPrefix(msg(), "Succeeded") }, msg)
	if m := msg(); !strings.Contains(m, "wait-workloads-ready=Done,uncordon=Done") {
		t.Errorf("steps: %s", m)
	}
	if cordoned() {
		t.Error("the node is still cordoned after the event succeeded")
	}
}

// TestReadinessWaitJournalLost: as TestReadinessWaitAcrossCrash, but the
// agent's journal is lost while it is down (moved aside as corrupt, a
// re-imaged root): the restarted agent knows the event only from the API
// and adopts it. It must not take the readiness snapshot again from the
// node the reboot already disrupted (0 GPUs: the wait would pass at once
// and uncordon a node without its GPUs); it reads back the plan its claim
// wrote beside the finalizer (the resolved-plan annotation). The wait's
// deadline still counts from the step's start as the event's status has
// it, not from the adoption: the progress says the wait was resumed.
func TestReadinessWaitJournalLost(t *testing.T) {
	ctx := context.Background()
	w := killedInReadinessWait(t, "ready-lost")
	c, msg, cordoned, setGPUs := w.c, w.msg, w.cordoned, w.setGPUs
	ev, err := w.lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var plan map[string]string
	if err := json.Unmarshal([]byte(ev.Annotations[v1alpha1.AnnotationResolvedPlan]), &plan); err != nil || !strings.Contains(plan["resolved.readiness"], "nvidia.com/gpu") {
		t.Fatalf("the claimed event's %s annotation: %q (%v); want the claim-time snapshot with nvidia.com/gpu",
			v1alpha1.AnnotationResolvedPlan, ev.Annotations[v1alpha1.AnnotationResolvedPlan], err)
	}
	if err := os.Remove(c.journal()); err != nil {
		t.Fatal(err)
	}
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	// The status still names the GPUs from before the kill: wait for the
	// adopting agent's own wait.
	waitFor(t, "the adopting agent's readiness wait", time.Minute, a, func() bool {
		return strings.Contains(a.logText(), "checking the node's workloads")
	})
	waitFor(t, "the adopting agent naming the GPUs", time.Minute, a, func() bool { return strings.Contains(msg(), readinessMissing) }, msg)
	if l := a.logText(); !strings.Contains(l, "resumed after a restart") {
		t.Errorf("the adopted wait does not count from the step's start: its progress does not say it was resumed:\n%s", grepLog(l, "checking the node's workloads"))
	}
	time.Sleep(3 * time.Second)
	if m := msg(); !strings.HasPrefix(m, "Claimed") || !cordoned() {
		t.Fatalf("adopted without its journal, with the GPUs still missing: %s (cordoned %v); want the wait against the claim-time snapshot", m, cordoned())
	}
	setGPUs(8)
	waitFor(t, "the reboot to succeed", time.Minute, a, func() bool { return strings.HasPrefix(msg(), "Succeeded") }, msg)
	if cordoned() {
		t.Error("the node is still cordoned after the event succeeded")
	}
}

// grepLog is the lines of log that contain s.
func grepLog(log, s string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCrashInAdoption: the same reboot, killed in its readiness wait, its
// journal lost; the restarted agent adopts it from the API and dies right
// after the adoption's journal commit. The third start replays it from
// that journal. The history rebuilt from the status (reboot Done, the
// wait begun) and the cordon's ownership must be in that commit: they
// were written after it, one record at a time, and a crash between left
// the event journaled with no steps — the replay rebooted again.
func TestCrashInAdoption(t *testing.T) {
	ctx := context.Background()
	w := killedInReadinessWait(t, "ready-adopt-crash")
	c := w.c
	if err := os.Remove(c.journal()); err != nil {
		t.Fatal(err)
	}
	a2 := c.start(t, `engineAfterClaimSnapshot=panic("crash after the adoption's commit")`)
	select {
	case <-a2.done:
	case <-time.After(90 * time.Second):
		t.Fatal("the adopting agent did not reach engineAfterClaimSnapshot within 90s")
	}
	if !strings.Contains(a2.logText(), "panic: failpoint panic: crash after the adoption's commit") {
		t.Fatalf("the adopting agent died, but not at engineAfterClaimSnapshot: %s", a2.exit())
	}
	a3 := c.start(t, "")
	defer func() { _ = a3.stop(30 * time.Second) }()
	waitFor(t, "the replayed wait naming the GPUs", time.Minute, a3, func() bool { return strings.Contains(w.msg(), readinessMissing) }, w.msg)
	w.setGPUs(8)
	waitFor(t, "the reboot to succeed", time.Minute, a3, func() bool { return strings.HasPrefix(w.msg(), "Succeeded") }, w.msg)
	if n := len(actionTimes(c.logs, logReboot, "")); n != 1 {
		t.Errorf("%d reboots for one event, want 1: the replay after the adoption's crash ran the reboot again", n)
	}
	if w.cordoned() {
		t.Error("the node is still cordoned after the event succeeded: the adoption's commit lost the cordon's ownership")
	}
	ev, err := w.lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ev.Status.Steps {
		if s.Name == "reboot" && s.Attempt != 1 {
			t.Errorf("step reboot after %d attempts, want 1", s.Attempt)
		}
	}
}
