package crash

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// claimBound is how soon an idle agent claims a new event bound to it
// (docs/reliability.md).
const claimBound = 10 * time.Second

var (
	spareOnce sync.Once
	spareErr  error
)

// ensureSpare registers the spare node (where replacement pods go) and its
// kubelet stand-in once per test process.
func ensureSpare(t *testing.T) {
	t.Helper()
	spareOnce.Do(func() {
		admin := env.AdminConfig()
		spareErr = testenv.CreateNode(context.Background(), admin, spareNode, map[string]string{"crash": "spare"})
		if spareErr == nil || apierrors.IsAlreadyExists(spareErr) {
			_, spareErr = testenv.RunKubeletStandIn(context.Background(), admin, spareNode)
		}
	})
	if spareErr != nil {
		t.Fatalf("spare node: %v", spareErr)
	}
}

// claimNextThenStop checks the agent is not deaf — a new (uncordon) event
// for c's node is claimed within claimBound — and stops it cleanly.
func claimNextThenStop(t *testing.T, c *crashCase, lc *apiclient.LifecycleClients, a *agentProc) {
	t.Helper()
	createDrain(t, lc, c, "uncordon-"+c.node, "uncordon")
	created := time.Now()
	waitFor(t, "the next event to be claimed", claimBound, a, func() bool {
		ev, err := lc.Events.Get(context.Background(), "uncordon-"+c.node, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus != "" && ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending
	})
	t.Logf("next event claimed %s after creation", time.Since(created).Round(time.Millisecond))
	if err := a.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// blockedDrain starts the agent (with failpoints, when not empty), creates
// c's drain and waits until the PodDisruptionBudget holds it at evict.
func blockedDrain(t *testing.T, c *crashCase, lc *apiclient.LifecycleClients, failpoints string) *agentProc {
	t.Helper()
	ctx := context.Background()
	a := c.start(t, failpoints)
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-drain", metav1.GetOptions{})
		return err == nil
	})
	createDrain(t, lc, c, c.event, "drain")
	waitFor(t, "the drain to be blocked at evict", 60*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "evict"
	})
	return a
}

// waitUncordoned waits until c's node is schedulable, carries no
// cordoned-by annotation and reports no transition in progress.
func waitUncordoned(t *testing.T, c *crashCase, cs kubernetes.Interface, a *agentProc) {
	t.Helper()
	waitFor(t, "the node uncordoned and the transition ended", 60*time.Second, a, func() bool {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), c.node, metav1.GetOptions{})
		if err != nil || n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
			return false
		}
		// Not in progress: never written (the start's conditions are
		// queued with the claim's snapshot, after the finalizer), or
		// taken back.
		cond := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
		return cond == nil || cond.Status == corev1.ConditionFalse
	})
}

// compoundCase prepares one node with PDB-protected pods for a compound
// fault and returns it with admin clients. hold makes the PDB refuse every
// eviction until release is called.
func compoundCase(t *testing.T, node string, hold bool) (c *crashCase, lc *apiclient.LifecycleClients, cs kubernetes.Interface, release func()) {
	t.Helper()
	ctx := context.Background()
	admin := env.AdminConfig()
	ensureSpare(t)
	c = &crashCase{node: node, event: "drain-" + node, dir: t.TempDir(), sockDir: shortDir(t)}
	if err := c.setUp(ctx); err != nil {
		t.Fatal(err)
	}
	cs = kubernetes.NewForConfigOrDie(admin)
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	release = func() {}
	if hold {
		// minAvailable = replicas: no eviction is allowed.
		pdbs := cs.PolicyV1().PodDisruptionBudgets(node)
		setMin := func(v int32) {
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				p, err := pdbs.Get(ctx, "web", metav1.GetOptions{})
				if err != nil {
					return err
				}
				p.Spec.MinAvailable.IntVal = v
				_, err = pdbs.Update(ctx, p, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		setMin(replicas)
		deadline := time.Now().Add(60 * time.Second)
		for {
			p, err := pdbs.Get(ctx, "web", metav1.GetOptions{})
			if err == nil && p.Status.ObservedGeneration == p.Generation && p.Status.DisruptionsAllowed == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("PodDisruptionBudget %s/web still allows disruptions after 60s", node)
			}
			time.Sleep(100 * time.Millisecond)
		}
		release = func() { setMin(replicas - 1) }
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range c.logs {
				t.Logf("---- %s (last 80 lines)\n%s", filepath.Base(l), tail(l, 80))
			}
		}
	})
	return c, lc, cs, release
}

// shortDir is a directory for a unix socket (at most 107 bytes of path).
func shortDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "lacr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func createDrain(t *testing.T, lc *apiclient.LifecycleClients, c *crashCase, name, short string) {
	t.Helper()
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: c.node + "-" + short, BindingNode: c.node}}
	if _, err := lc.Events.Create(context.Background(), ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A drain claimed and blocked by a PodDisruptionBudget; the agent is
// SIGKILLed; the event is deleted while it is down; the agent starts again.
// The restarted agent must see the cancel before it acts: no eviction after
// the restart, the finalizer released (the event is gone), the node
// uncordoned, and LifecycleTransition no longer in progress. Then a new
// event for the node is claimed at once (the agent is not deaf).
func TestDeletedWhileDown(t *testing.T) {
	c, lc, cs, release := compoundCase(t, "compound-deleted", true)
	ctx := context.Background()
	a1 := blockedDrain(t, c, lc, "")
	a1.kill()
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The budget would now let the evictions through: a drain that did not
	// notice the cancel evicts the pods.
	release()
	killedAt := time.Now()
	a2 := c.start(t, "")
	waitFor(t, "the deleted event to be gone (finalizer released)", 60*time.Second, a2, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	waitUncordoned(t, c, cs, a2)
	pods, err := cs.CoreV1().Pods(c.node).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.node})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != replicas {
		t.Errorf("%d of %d pods left on %s: the cancelled drain evicted after the restart", len(pods.Items), replicas, c.node)
	}
	evs, err := auditEvictions(c.node)
	if err != nil {
		t.Fatal(err)
	}
	for pod, n := range evs.accepted {
		t.Errorf("pod %s evicted %d time(s) after the cancel (%s after the kill)", pod, n, time.Since(killedAt).Round(time.Millisecond))
	}

	claimNextThenStop(t, c, lc, a2)
}

// The second report of the deaf agent: a drain claimed by an agent that was
// SIGKILLed and restarted finishes Succeeded, is deleted, and the next
// event for the node must be claimed within claimBound.
func TestRestartFinishDeleteThenClaim(t *testing.T) {
	c, lc, _, release := compoundCase(t, "compound-deaf", true)
	ctx := context.Background()
	a1 := blockedDrain(t, c, lc, "")
	a1.kill()
	a2 := c.start(t, "")
	release()
	waitFor(t, "the resumed drain to finish", finishTimeout, a2, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded && len(ev.Finalizers) == 0
	})
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drain event gone", 30*time.Second, a2, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	claimNextThenStop(t, c, lc, a2)
}

// A drain blocked by a PodDisruptionBudget is cancelled (deleted) while the
// agent runs; the agent dies in the middle of the abort (failpoint
// engineDuringAbort). The restarted agent must resume straight into the
// abort: no step runs again (no eviction once the budget allows it), the
// node is uncordoned, the finalizer comes off and the event is gone.
func TestCrashDuringAbortOfCancel(t *testing.T) {
	c, lc, cs, release := compoundCase(t, "compound-abort", true)
	ctx := context.Background()
	a1 := blockedDrain(t, c, lc, `engineDuringAbort=1*panic("crash at engineDuringAbort")`)
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a1.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the agent did not reach engineDuringAbort within 60s of the cancel")
	}
	if !strings.Contains(a1.logText(), "panic: failpoint panic: crash at engineDuringAbort") {
		t.Fatalf("the agent died, but not at engineDuringAbort: %s", a1.exit())
	}
	release()
	a2 := c.start(t, "")
	waitFor(t, "the cancelled event to be gone (finalizer released)", 60*time.Second, a2, func() bool {
		_, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	waitUncordoned(t, c, cs, a2)
	// Give a resumed drain (the bug) time to evict now that it may.
	time.Sleep(2 * time.Second)
	evs, err := auditEvictions(c.node)
	if err != nil {
		t.Fatal(err)
	}
	for pod, n := range evs.accepted {
		t.Errorf("pod %s evicted %d time(s) after the cancel: the failed step ran again", pod, n)
	}
	if !strings.Contains(a2.logText(), `state=Aborting`) {
		t.Errorf("the restarted agent did not resume the event in its abort:\n%s", tail(a2.log, 30))
	}
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// A drain is claimed and cordons; the agent is SIGKILLed and restarted with
// the drain driver disabled. The event cannot go on, but it must not stay
// Claimed with its finalizer: the restarted agent undoes the cordon it owns
// and ends the event Failed, saying why; no pod is evicted.
func TestDriverGoneOnReplay(t *testing.T) {
	c, lc, cs, release := compoundCase(t, "compound-gone", true)
	defer release()
	ctx := context.Background()
	a1 := blockedDrain(t, c, lc, "")
	a1.kill()
	if err := os.WriteFile(c.config(), []byte(agentConfig+"drivers:\n  drain:\n    enabled: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a2 := c.start(t, "")
	var final *v1alpha1.LifecycleEvent
	waitFor(t, "the event to end with its finalizer off", 60*time.Second, a2, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if err == nil && ev.Status.ClaimStatus.Finished() && len(ev.Finalizers) == 0 {
			final = ev
			return true
		}
		return false
	})
	if final.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(final.Status.Message, "is not enabled on this node any more") {
		t.Errorf("event ended %s: %q; want Failed naming the missing driver", final.Status.ClaimStatus, final.Status.Message)
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
		t.Errorf("node left cordoned (unschedulable=%v, %s=%q) by an event that was aborted", n.Spec.Unschedulable, v1alpha1.AnnotationCordonedBy, n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
	evs, err := auditEvictions(c.node)
	if err != nil {
		t.Fatal(err)
	}
	for pod, k := range evs.accepted {
		t.Errorf("pod %s evicted %d time(s)", pod, k)
	}
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// In real host mode on a host where systemd-logind does not answer, the
// drivers that reboot through it (reboot, os-upgrade) are not published —
// no event for them could ever be performed — and `status` says which and
// why; the others are published as usual.
func TestRealModeWithoutLogind(t *testing.T) {
	c, lc, _, _ := compoundCase(t, "compound-nologind", false)
	c.hostMode = "real"
	c.extraEnv = []string{"DBUS_SYSTEM_BUS_ADDRESS=unix:path=" + filepath.Join(c.sockDir, "no-system-bus")}
	ctx := context.Background()
	a := c.start(t, "")
	waitFor(t, "the drain transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-drain", metav1.GetOptions{})
		return err == nil
	})
	for _, short := range []string{"reboot", "os-upgrade"} {
		if _, err := lc.Transitions.Get(ctx, c.node+"-"+short, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("transition %s-%s: %v; want it not published without logind", c.node, short, err)
		}
	}
	out, err := exec.Command(agentFP.Path, "status", "--socket", c.socket(), "--config", c.config()).CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, want := range []string{`(?m)^mode:\s+real$`, `(?m)^not published:\s+lifecycle-agent\.x-k8s\.io/reboot: host\.mode is real and systemd-logind does not answer on D-Bus`} {
		if !regexp.MustCompile(want).Match(out) {
			t.Errorf("status does not say %s:\n%s", want, out)
		}
	}
	if err := a.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// An os-upgrade whose verify step fails (the target VERSION_ID is not what
// the host has); the agent crashes in the abort that follows. The restarted
// agent must go straight on with the abort and end the event Failed with
// the verify step's own message — not run the failed step again (resuming
// the event as if it were running did), nor upgrade or reboot again.
func TestCrashDuringAbortOfFailedStep(t *testing.T) {
	a2 := crashInFailedUpgrade(t, "compound-abort-failed", "engineDuringAbort")
	if !strings.Contains(a2.logText(), `state=Aborting`) {
		t.Errorf("the restarted agent did not resume the event in its abort:\n%s", tail(a2.log, 30))
	}
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// The same os-upgrade, its verify step failing, but the agent dies in the
// instant after the failure is journaled and before the abort is: the
// journal says the event is running and its verify step failed. The
// restarted agent must take the failure as it stands and go to the abort
// — not run the failed step again (it did: the replay skipped only steps
// done, and asked only steps begun, so a failed one ran anew; for an
// upgrade whose outcome could not be told, ErrUndecidable, that is a
// second upgrade).
func TestCrashAfterStepFailed(t *testing.T) {
	a2 := crashInFailedUpgrade(t, "compound-step-failed", "engineAfterStepFailed")
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// The same os-upgrade, its verify step failing, but the agent is killed
// during the abort, after the API server got the event's status with verify
// Failed while the event is still Claimed, and its journal is lost (moved
// aside as corrupt, a re-imaged disk). The agent adopts the event it
// claimed and rebuilds its steps from that status: the failure must stand
// and go to the abort, not run verify again (the rebuild took only Done and
// Running steps, so a Failed one ran anew: for an upgrade whose outcome
// could not be told, a second upgrade). An abort's progress carries such a
// status (gpu-reset's, restarting the GPU services after a failed reset);
// here the admin writes it while a failpoint holds the abort, so the state
// is there every run.
func TestCrashDuringAbortOfFailedStepJournalLost(t *testing.T) {
	a2 := failedUpgradeDown(t, "compound-failed-lost", "engineDuringAbort=sleep(20000)", func(c *crashCase, lc *apiclient.LifecycleClients, a1 *agentProc) {
		ctx := context.Background()
		waitFor(t, "verify run and the abort held", 90*time.Second, a1, func() bool {
			return strings.Contains(a1.logText(), "step verify\" event=") && strings.Contains(a1.logText(), "step=verify")
		})
		time.Sleep(2 * time.Second) // verify fails at once; the abort is held 20 s
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if ev.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed {
				t.Fatalf("the event is %s already; want it Claimed, its abort held", ev.Status.ClaimStatus)
			}
			for i := range ev.Status.Steps {
				st := &ev.Status.Steps[i]
				if st.Name == "verify" {
					st.State, st.Message = v1alpha1.StepFailed, "the upgrade did not reach its target: VERSION_ID is not 999 (the status the abort's progress carried)"
					break
				}
				st.State = v1alpha1.StepDone
			}
			_, err = lc.Events.UpdateStatus(ctx, ev, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		a1.kill()
		if err := os.Remove(c.journal()); err != nil {
			t.Fatal(err)
		}
	})
	if l := a2.logText(); !strings.Contains(l, "resumed after a failed step") {
		t.Errorf("the adopting agent did not take the failure as it stands:\n%s", tail(a2.log, 30))
	}
	if err := a2.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}

// crashInFailedUpgrade runs an os-upgrade whose verify step fails, the
// agent dying at failpoint on the way to its end, and restarts it: the
// event must end Failed with verify's message, verify run once, one reboot
// and one upgrade in all, the node uncordoned (a failed upgrade's abort
// does). It returns the restarted agent.
func crashInFailedUpgrade(t *testing.T, node, failpoint string) *agentProc {
	t.Helper()
	return failedUpgradeDown(t, node, failpoint+`=1*panic("crash at `+failpoint+`")`, func(_ *crashCase, _ *apiclient.LifecycleClients, a1 *agentProc) {
		select {
		case <-a1.done:
		case <-time.After(90 * time.Second):
			t.Fatalf("the agent did not reach %s within 90s", failpoint)
		}
		if !strings.Contains(a1.logText(), "panic: failpoint panic: crash at "+failpoint) {
			t.Fatalf("the agent died, but not at %s: %s", failpoint, a1.exit())
		}
	})
}

// failedUpgradeDown is crashInFailedUpgrade's run: the first agent runs
// with the failpoint term given and down ends it (and does what else the
// case needs while it is down) before the second starts.
func failedUpgradeDown(t *testing.T, node, term string, down func(c *crashCase, lc *apiclient.LifecycleClients, a1 *agentProc)) *agentProc {
	t.Helper()
	c, lc, cs, _ := compoundCase(t, node, false)
	ctx := context.Background()
	if err := os.WriteFile(c.config(), []byte(chaosConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	a1 := c.start(t, term)
	waitFor(t, "transition published", 60*time.Second, a1, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-os-upgrade", metav1.GetOptions{})
		return err == nil
	})
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: c.event},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: c.node + "-os-upgrade", BindingNode: c.node,
			Parameters: map[string]string{"profile": "chaos", "targetVersionID": "999"}}}
	if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	down(c, lc, a1)
	a2 := c.start(t, "")
	var end *v1alpha1.LifecycleEvent
	waitFor(t, "the event to end", 60*time.Second, a2, func() bool {
		got, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		if err == nil && got.Status.ClaimStatus.Finished() && len(got.Finalizers) == 0 {
			end = got
			return true
		}
		return false
	})
	if end.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(end.Status.Message, "999") {
		t.Errorf("ended %s: %q, want Failed naming the expected VERSION_ID 999", end.Status.ClaimStatus, end.Status.Message)
	}
	for _, s := range end.Status.Steps {
		if s.Name == "verify" && (s.State != v1alpha1.StepFailed || s.Attempt != 1) {
			t.Errorf("step verify %s after %d attempt(s), want Failed after 1: the failed step ran again", s.State, s.Attempt)
		}
	}
	if n := strings.Count(a2.logText(), "step=verify"); n > 0 {
		t.Errorf("the restarted agent ran verify again (%d log lines):\n%s", n, tail(a2.log, 30))
	}
	logs := []string{a1.log, a2.log}
	if n := len(actionTimes(logs, logReboot, "")); n != 1 {
		t.Errorf("%d reboots, want the one before verify", n)
	}
	if n := len(actionTimes(logs, logTransient, "chaos-upgrade")); n != 1 {
		t.Errorf("the upgrade ran %d times, want 1", n)
	}
	// A failed upgrade is uncordoned by its abort (docs/pipelines.md).
	waitUncordoned(t, c, cs, a2)
	return a2
}

// An event deleted in the instant after the agent's claim (a failpoint
// holds the agent between the claimed status and the finalizer): the
// finalizer cannot be added (404) and nothing was done on the host. The
// claim must take back what it set — the node Lease and the Node's
// transition condition — rather than leave the node marked in a
// transition nobody runs, and the node Lease held, until it expires.
func TestDeletedDuringClaim(t *testing.T) {
	c, lc, cs, _ := compoundCase(t, "compound-claim-deleted", false)
	ctx := context.Background()
	c.gofailHTTP = true
	a := c.start(t, `engineAfterClaim=sleep(3000)`)
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-uncordon", metav1.GetOptions{})
		return err == nil
	})
	createDrain(t, lc, c, c.event, "uncordon")
	waitFor(t, "the claim", 30*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed
	})
	if err := lc.Events.Delete(ctx, c.event, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node Lease released and the transition condition not in progress", 15*time.Second, a, func() bool {
		l, err := lc.Leases(v1alpha1.SystemNamespace).Get(ctx, "node-"+c.node, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			return false
		}
		n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		// Not in progress: never written (the start's conditions are
		// queued with the claim's snapshot, after the finalizer), or
		// taken back.
		cond := nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition)
		return cond == nil || cond.Status == corev1.ConditionFalse
	})
	if _, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the deleted event is still there: %v", err)
	}
	req, _ := http.NewRequest(http.MethodDelete, "http://"+a.gofail+"/engineAfterClaim", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	claimNextThenStop(t, c, lc, a)
}

// The control plane of test/crash runs without the NodeLifecycleConditions
// feature gate (test/e2e runs with it): the agent writes the same Node
// conditions either way (docs/conditions.md).
func TestConditionsWithoutFeatureGate(t *testing.T) {
	c, lc, cs, _ := compoundCase(t, "compound-gate-off", false)
	ctx := context.Background()
	a := c.start(t, "")
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-drain", metav1.GetOptions{})
		return err == nil
	})
	createDrain(t, lc, c, c.event, "drain")
	waitFor(t, "the drain to succeed", 90*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded && len(ev.Finalizers) == 0
	})
	n, err := cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for typ, want := range map[string]string{
		v1alpha1.NodeConditionLifecycleTransition: "False/DrainComplete",
		v1alpha1.NodeConditionDrainInProgress:     "False/DrainCompleted",
		v1alpha1.NodeConditionDrained:             "True/DrainCompleted",
	} {
		cond := nodeCondition(n, typ)
		if cond == nil || string(cond.Status)+"/"+cond.Reason != want {
			t.Errorf("after the drain, with the gate off: %s = %+v, want %s", typ, cond, want)
		}
	}
	if err := a.stop(20 * time.Second); err != nil {
		t.Error(err)
	}
}
