package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// readinessNode is a node with a kubelet stand-in, 8 allocatable
// nvidia.com/gpu and a DaemonSet (no DaemonSet controller runs here: its
// pod is created bound to the node, owned by the DaemonSet, and the stand-in
// makes it Running and Ready).
type readinessNode struct {
	t    *testing.T
	cs   kubernetes.Interface
	node string
	ns   string
	pod  string
}

func newReadinessNode(t *testing.T, node string) *readinessNode {
	t.Helper()
	newNode(t, node)
	ctx := context.Background()
	r := &readinessNode{t: t, cs: kubernetes.NewForConfigOrDie(env.AdminConfig()), node: node, ns: node}
	pod, err := testenv.CreateDaemonSetPod(ctx, env.AdminConfig(), r.ns, "device-plugin", node, "lifecycle.test/pause:1")
	if err != nil {
		t.Fatal(err)
	}
	r.pod = pod
	waitFor(t, "the DaemonSet pod Ready", 30*time.Second, func() bool { return r.podReady() })
	r.setGPUs(8)
	return r
}

func (r *readinessNode) podReady() bool {
	p, err := r.cs.CoreV1().Pods(r.ns).Get(context.Background(), r.pod, metav1.GetOptions{})
	return err == nil && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// setPodReady sets the pod's Ready condition (Running either way), as the
// kubelet does while a restarted container's readiness probe fails.
func (r *readinessNode) setPodReady(ready bool) { r.setPodReadyAt(ready, time.Now()) }

// setPodReadyAt sets the pod's Ready condition as changed at at (the
// kubelet's lastTransitionTime).
func (r *readinessNode) setPodReadyAt(ready bool, at time.Time) {
	r.t.Helper()
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := r.cs.CoreV1().Pods(r.ns).Get(context.Background(), r.pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
				p.Status.Conditions[i].Status = st
				p.Status.Conditions[i].LastTransitionTime = metav1.NewTime(at)
			}
		}
		_, err = r.cs.CoreV1().Pods(r.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// setGPUs sets allocatable (and capacity) nvidia.com/gpu, as the device
// plugin's registration does.
func (r *readinessNode) setGPUs(n int64) {
	r.t.Helper()
	if err := testenv.SetAllocatable(context.Background(), env.AdminConfig(), r.node, "nvidia.com/gpu", n); err != nil {
		r.t.Fatal(err)
	}
}

func (r *readinessNode) setReady(ready bool) {
	r.t.Helper()
	if err := testenv.SetNodeReady(context.Background(), env.AdminConfig(), r.node, ready); err != nil {
		r.t.Fatal(err)
	}
}

// waitMessage waits (a minute at most) until event name's status message
// contains every one of want, and returns it.
func (r *readinessNode) waitMessage(name, what string, want ...string) string {
	r.t.Helper()
	lc := clients(r.t, env.AdminConfig())
	var msg string
	waitFor(r.t, what, time.Minute, func() bool {
		ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		msg = ev.Status.Message
		return !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(msg, w) })
	})
	return msg
}

// startReboot creates a reboot event while the Node is NotReady, so the
// event stops at wait-ready after the (simulated) reboot; it returns once
// the reboot step is done, with the claim-time snapshot taken.
func (r *readinessNode) startReboot(name string) { r.startEvent(name, "reboot", nil) }

// startEvent creates an event of driver (reboot or os-upgrade) and waits
// for its reboot step, the node not Ready.
func (r *readinessNode) startEvent(name, driver string, params map[string]string) {
	r.t.Helper()
	waitTransition(r.t, transitionName(r.node, driver))
	r.setReady(false)
	createEvent(r.t, name, r.node, transitionName(r.node, driver), params, nil)
	lc := clients(r.t, env.AdminConfig())
	waitFor(r.t, "the reboot step done, waiting for Ready", time.Minute, func() bool {
		ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && strings.Contains(stepStates(ev), "reboot=Done")
	})
}

// TestReadinessBeforeUncordon: after a reboot the kubelet reports Ready,
// but the device plugin's DaemonSet pod is not Ready yet and the node's
// nvidia.com/gpu is 0 (not re-registered): the event waits, cordoned, its
// status naming both, and ends Succeeded, uncordoned, only once both are
// back to what they were at claim.
func TestReadinessBeforeUncordon(t *testing.T) {
	node := "ready-node"
	r := newReadinessNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	r.startReboot("ready-1")
	r.setPodReady(false)
	r.setGPUs(0)
	r.setReady(true)
	lc := clients(t, env.AdminConfig())
	want := []string{"DaemonSet ready-node/device-plugin has no Ready pod on the node", "allocatable nvidia.com/gpu is 0 of 8"}
	r.waitMessage("ready-1", "the event's status naming what is not back", want...)
	if !getNode(t, node).Spec.Unschedulable {
		t.Fatal("the node was uncordoned while its DaemonSet pod and GPUs were not back")
	}
	r.setPodReady(true)
	// The next poll's message names only the GPUs (a progress status may
	// linger up to a second in the outbox before it is written).
	var ev *v1alpha1.LifecycleEvent
	waitFor(t, "the event's status naming only the GPUs", time.Minute, func() bool {
		e, err := lc.Events.Get(context.Background(), "ready-1", metav1.GetOptions{})
		if err != nil {
			return false
		}
		ev = e
		return ev.Status.ClaimStatus.Finished() || !strings.Contains(ev.Status.Message, want[0])
	})
	if ev.Status.ClaimStatus.Finished() || !strings.Contains(ev.Status.Message, want[1]) {
		t.Fatalf("with the pod Ready and the GPUs still 0: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	r.setGPUs(8)
	ev = waitEvent(t, "ready-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("reboot ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if got := stepStates(ev); !strings.Contains(got, "wait-ready=Done,wait-workloads-ready=Done,uncordon=Done") {
		t.Errorf("steps %s", got)
	}
	if getNode(t, node).Spec.Unschedulable {
		t.Error("the node is still cordoned after the event succeeded")
	}
}

// TestReadinessReadyFromAnEarlierBoot: after a reboot the API server still
// shows the DaemonSet pod as the previous boot left it, Ready, until the new
// boot's kubelet posts the pod's status (a second or two after it reports
// the Node Ready: seen in the VM scenario TestRealNode/RebootWithPods, where
// the agent once uncordoned in that window). Through the agent as wired:
// the event waits, cordoned, its status saying the pod's Ready is from
// before this boot, and ends Succeeded, uncordoned, only once the pod is
// Ready in this boot. In simulate mode the host's boot is the real one (a
// simulated reboot restarts nothing), so a Ready dated before this
// machine's boot is what a previous boot left.
func TestReadinessReadyFromAnEarlierBoot(t *testing.T) {
	node := "ready-boot-node"
	r := newReadinessNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	boot, err := host.Paths{}.BootTime()
	if err != nil {
		t.Fatal(err)
	}
	r.startReboot("ready-boot-1")
	r.setPodReadyAt(true, boot.Add(-time.Hour))
	r.setReady(true)
	msg := r.waitMessage("ready-boot-1", "the event's status naming the pod's Ready from before this boot",
		"DaemonSet ready-boot-node/device-plugin has no Ready pod on the node (its pod's Ready is from before this boot")
	if !getNode(t, node).Spec.Unschedulable {
		t.Fatalf("the node was uncordoned on a pod Ready from before this boot: %q", msg)
	}
	// The new boot's kubelet posts the pod: Ready now.
	r.setPodReady(true)
	ev := waitEvent(t, "ready-boot-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || !strings.Contains(stepStates(ev), "wait-workloads-ready=Done,uncordon=Done") {
		t.Fatalf("reboot ended %s: %s [%s]", ev.Status.ClaimStatus, ev.Status.Message, stepStates(ev))
	}
	if getNode(t, node).Spec.Unschedulable {
		t.Error("the node is still cordoned after the event succeeded")
	}
}

// onTimeoutCases are readiness.onTimeout's values and whether each leaves
// the node cordoned after a readiness timeout.
var onTimeoutCases = []struct {
	name, onTimeout string
	cordoned        bool
}{
	{name: "keepCordoned", onTimeout: config.ReadinessKeepCordoned, cordoned: true},
	{name: "uncordon", onTimeout: config.ReadinessUncordon, cordoned: false},
}

// TestReadinessTimeout: the GPUs never come back. The event ends Failed
// naming them; by default the node stays cordoned (its annotation naming
// the event), with readiness.onTimeout uncordon it is given back. The
// same for an os-upgrade, whose abort is its own (it uncordoned whatever
// onTimeout said).
func TestReadinessTimeout(t *testing.T) {
	for _, driver := range []string{"reboot", "os-upgrade"} {
		for _, tc := range onTimeoutCases {
			t.Run(driver+"/"+tc.name, func(t *testing.T) { readinessTimeout(t, driver, tc.onTimeout, tc.cordoned) })
		}
	}
}

func readinessTimeout(t *testing.T, driver, onTimeout string, cordoned bool) {
	node := "ready-timeout-" + strings.ToLower(onTimeout)
	if driver != "reboot" {
		node = "ready-timeout-" + driver + "-" + strings.ToLower(onTimeout)
	}
	r := newReadinessNode(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		c.Readiness.Timeout = 3 * time.Second
		c.Readiness.OnTimeout = onTimeout
		c.OSUpgrade.Profiles = map[string]config.OSUpgradeProfile{
			"debian-full-upgrade": {Command: []string{"/usr/bin/apt-get", "-y", "full-upgrade"}, Timeout: time.Minute, RebootPolicy: config.RebootAlways},
		}
	}})
	var params map[string]string
	if driver == "os-upgrade" {
		if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedOSReleaseFile), []byte("VERSION_ID=\"13\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		params = map[string]string{"profile": "debian-full-upgrade", "targetVersionID": "13"}
	}
	r.startEvent(node+"-1", driver, params)
	r.setGPUs(0)
	r.setReady(true)
	ev := waitEvent(t, node+"-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "not ready within 3s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8") {
		t.Fatalf("event ended %s: %q; want Failed naming the GPUs", ev.Status.ClaimStatus, ev.Status.Message)
	}
	wantKept(t, node, ev, onTimeout, cordoned)
	// At rest the journal owns nothing: the kept cordon is the admin's
	// now, and its record (kept through the abort, so that an abort
	// replayed after a crash leaves the cordon too) went with the event.
	waitFor(t, "the event finished", 30*time.Second, func() bool { return strings.Contains(a.logBuf.String(), "event finished") })
	a.stop(t)
	j, _, err := journal.Open(context.Background(), a.Journal, journal.Options{CheckCommand: checkCommand()})
	if err != nil {
		t.Fatal(err)
	}
	owned, err := j.Owned()
	_ = j.Close()
	if err != nil || len(owned) != 0 {
		t.Errorf("the journal owns %+v at rest (err %v), want nothing", owned, err)
	}
}

// TestReadinessChecksOnServer: each check of package readiness against the
// real API server with the node's own identity (the Node authorizer lets it
// read its Node and list its pods): a condition with the wrong status, a
// command that fails, and readinessChecks narrowing them.
func TestReadinessChecksOnServer(t *testing.T) {
	node := "ready-checks"
	r := newReadinessNode(t, node)
	ctx := context.Background()
	api, err := apiclient.New(env.NodeConfig(node), node, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := readiness.Config{}.Take(ctx, api)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Allocatable["nvidia.com/gpu"] != 8 || !slices.Equal(snap.DaemonSets, []string{node + "/device-plugin"}) {
		t.Fatalf("snapshot %+v", snap)
	}
	// node-problem-detector's condition, reporting a problem.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := r.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionTrue, Reason: "DockerHung"})
		_, err = r.cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := readiness.Config{Conditions: map[string]corev1.ConditionStatus{"KernelDeadlock": corev1.ConditionFalse},
		Command: []string{"/bin/sh", "-c", "exit 3"}}
	run := func(ctx context.Context, argv []string, timeout time.Duration) error {
		return execCommand(ctx, argv, timeout)
	}
	all, err := cfg.Selected("")
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.NotReady(ctx, api, snap, all, run, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	wantAll := []string{"condition KernelDeadlock is True (DockerHung), want False", "readiness.command /bin/sh: exit status 3"}
	if strings.Join(got, "|") != strings.Join(wantAll, "|") {
		t.Errorf("not ready: %q, want %q", got, wantAll)
	}
	only, err := cfg.Selected("daemonsets,resources")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cfg.NotReady(ctx, api, snap, only, run, time.Time{}); err != nil || len(got) != 0 {
		t.Errorf("daemonsets,resources: %q %v, want ready", got, err)
	}
	if _, err := cfg.Selected("daemonsets,disks"); err == nil || !strings.Contains(err.Error(), `parameters.readinessChecks: "disks" is not one of`) {
		t.Errorf("a bad readinessChecks: %v", err)
	}
}

// execCommand runs argv with a timeout, as the agent's host runner does.
func execCommand(ctx context.Context, argv []string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return exec.CommandContext(ctx, argv[0], argv[1:]...).Run()
}

// TestReadinessCancel: an event cancelled (deleted) while it waits for the
// node's workloads ends without doing anything more, and what it owned is
// undone: its cordon is lifted.
func TestReadinessCancel(t *testing.T) {
	node := "ready-cancel"
	r := newReadinessNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour})
	r.startReboot("ready-cancel-1")
	r.setGPUs(0)
	r.setReady(true)
	lc := clients(t, env.AdminConfig())
	waitFor(t, "the wait naming the GPUs", time.Minute, func() bool {
		ev, err := lc.Events.Get(context.Background(), "ready-cancel-1", metav1.GetOptions{})
		return err == nil && strings.Contains(ev.Status.Message, "allocatable nvidia.com/gpu is 0 of 8")
	})
	if err := lc.Events.Delete(context.Background(), "ready-cancel-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancelled event gone and the node uncordoned", time.Minute, func() bool {
		_, err := lc.Events.Get(context.Background(), "ready-cancel-1", metav1.GetOptions{})
		return err != nil && !getNode(t, node).Spec.Unschedulable
	})
}

// TestReadinessDaemonSetNamespaces: readiness.daemonSets.namespaces narrows
// the DaemonSets the uncordon waits for, through the agent as wired: the
// device plugin's pod (in a namespace not listed) is not Ready after the
// reboot and the event ends Succeeded, uncordoned, all the same; listed,
// the same pod holds the node (TestReadinessBeforeUncordon).
func TestReadinessDaemonSetNamespaces(t *testing.T) {
	node := "ready-ns-node"
	r := newReadinessNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		c.Readiness.DaemonSets.Namespaces = []string{"kube-system"}
	}})
	r.startReboot("ready-ns-1")
	r.setPodReady(false)
	r.setReady(true)
	ev := waitEvent(t, "ready-ns-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || !strings.Contains(stepStates(ev), "wait-workloads-ready=Done,uncordon=Done") {
		t.Fatalf("reboot ended %s: %s [%s]; want Succeeded without waiting for a DaemonSet outside readiness.daemonSets.namespaces", ev.Status.ClaimStatus, ev.Status.Message, stepStates(ev))
	}
	if r.podReady() {
		t.Fatal("the DaemonSet pod is Ready: the test's premise is that it is not")
	}
	if getNode(t, node).Spec.Unschedulable {
		t.Error("the node is still cordoned after the event succeeded")
	}
}

// TestReadinessNotReadyEnds: the other ways a readiness wait ends with the
// node not ready leave the cordon as readiness.onTimeout says, as the
// workloads' timeout does (DESIGN "Ready means ready": the Node's Ready of
// this boot is one of the checks): wait-ready's reboot.readyTimeout (the
// kubelet never reports Ready), and the event's sla reached during
// wait-workloads-ready. Both aborts uncordoned whatever onTimeout said.
func TestReadinessNotReadyEnds(t *testing.T) {
	for _, tc := range onTimeoutCases {
		t.Run("never Ready/"+tc.name, func(t *testing.T) {
			node := "never-ready-" + strings.ToLower(tc.name)
			r := newReadinessNode(t, node)
			startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
				c.Reboot.ReadyTimeout = 3 * time.Second
				c.Readiness.OnTimeout = tc.onTimeout
			}})
			r.startReboot(node + "-1")
			ev := waitEvent(t, node+"-1", time.Minute)
			if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "did not become Ready within 3s (reboot.readyTimeout)") {
				t.Fatalf("event ended %s: %q; want Failed naming reboot.readyTimeout", ev.Status.ClaimStatus, ev.Status.Message)
			}
			wantKept(t, node, ev, tc.onTimeout, tc.cordoned)
		})
		t.Run("sla during the wait/"+tc.name, func(t *testing.T) {
			node := "sla-ready-" + strings.ToLower(tc.name)
			r := newReadinessNode(t, node)
			startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
				c.Readiness.OnTimeout = tc.onTimeout
			}})
			lc := clients(t, env.AdminConfig())
			waitTransition(t, transitionName(node, "reboot"))
			pub, err := lc.Transitions.Get(context.Background(), transitionName(node, "reboot"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			lt := &v1alpha1.LifecycleTransition{ObjectMeta: metav1.ObjectMeta{Name: node + "-reboot-sla"}, Spec: *pub.Spec.DeepCopy()}
			lt.Spec.Sla = &metav1.Duration{Duration: 15 * time.Second}
			if _, err := lc.Transitions.Create(context.Background(), lt, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			r.setReady(false)
			createEvent(t, node+"-1", node, lt.Name, nil, nil)
			waitFor(t, "the reboot step done", time.Minute, func() bool {
				ev, err := lc.Events.Get(context.Background(), node+"-1", metav1.GetOptions{})
				return err == nil && strings.Contains(stepStates(ev), "reboot=Done")
			})
			r.setGPUs(0)
			r.setReady(true)
			ev := waitEvent(t, node+"-1", time.Minute)
			if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSlaExpired || !strings.Contains(ev.Status.Message, "passed during step wait-workloads-ready") {
				t.Fatalf("event ended %s: %q; want SlaExpired during wait-workloads-ready", ev.Status.ClaimStatus, ev.Status.Message)
			}
			wantKept(t, node, ev, tc.onTimeout, tc.cordoned)
		})
	}
}

// wantKept checks the node's cordon and Drained after a readiness wait
// that ended with the node not ready, per readiness.onTimeout.
func wantKept(t *testing.T, node string, ev *v1alpha1.LifecycleEvent, onTimeout string, cordoned bool) {
	t.Helper()
	n := getNode(t, node)
	if n.Spec.Unschedulable != cordoned {
		t.Errorf("node unschedulable=%v, want %v (readiness.onTimeout %s)", n.Spec.Unschedulable, cordoned, onTimeout)
	}
	if cordoned != strings.Contains(ev.Status.Message, "stays cordoned") {
		t.Errorf("the message says the node stays cordoned: %v, want %v: %q", !cordoned, cordoned, ev.Status.Message)
	}
	if c := nodeCondition(n, v1alpha1.NodeConditionDrained); cordoned && c != nil && c.Reason == "ReturnedToService" {
		t.Errorf("Drained is %s/%s %q on a node kept cordoned", c.Status, c.Reason, c.Message)
	}
}
