package vm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// The scenarios of issue 6 part 3, run against the real package in a real
// systemd VM. Each starts its own control plane and VM.

const (
	// The agent publishes one transition per driver: <node>-<short name>.
	transitionReboot = vm.NodeName + "-reboot"
	rebootDriver     = "lifecycle-agent.x-k8s.io/reboot"
	// agentConfig is added to nodeName: vm-node in config.yaml.
	agentConfig = "logLevel: debug\n"

	agentStartTimeout = 3 * time.Minute
	// A transition with a drain and a reboot under TCG: claim, drain
	// (seconds), reboot (20-40 s), Ready, uncordon.
	transitionTimeout = 8 * time.Minute
)

// agentNode is a VM with the agent installed and running for vm-node.
type agentNode struct {
	c   *vm.Cluster
	v   *vm.VM
	rec *vm.NodeRecorder
	deb string
}

// startAgentNode: control plane, VM, kubeconfig and config, dpkg -i, the
// agent active and its reboot transition published. It fails at once,
// before booting anything, when there is no package to test.
func startAgentNode(t *testing.T) *agentNode {
	t.Helper()
	return startAgentNodeWith(t, vm.Options{})
}

// startAgentNodeWith is startAgentNode with VM options.
func startAgentNodeWith(t *testing.T, opts vm.Options) *agentNode {
	t.Helper()
	return startAgentNodeConfig(t, opts, agentConfig)
}

// startAgentNodeConfig is startAgentNodeWith with the agent's config (added
// to nodeName: vm-node).
func startAgentNodeConfig(t *testing.T, opts vm.Options, config string) *agentNode {
	t.Helper()
	vm.RequireHostTools(t)
	vm.FindDeb(t)
	return startAgentNodeOn(t, vm.StartCluster(t), opts, config)
}

// startAgentNodeOn is startAgentNodeConfig on a cluster already started.
func startAgentNodeOn(t *testing.T, c *vm.Cluster, opts vm.Options, config string) *agentNode {
	t.Helper()
	deb := vm.FindDeb(t)
	rec := c.RecordNode(t)
	v := c.StartVMWith(t, opts)
	c.ProvisionNode(t, v, config)
	out := vm.InstallDeb(t, v, deb)
	t.Logf("dpkg -i %s:\n%s", filepath.Base(deb), out)
	vm.WaitAgentActive(t, v, agentStartTimeout)
	c.WaitTransition(t, transitionReboot, 2*time.Minute)
	return &agentNode{c: c, v: v, rec: rec, deb: deb}
}

// workload creates a pod bound to vm-node, controlled by a ReplicaSet (a
// drain refuses bare pods), which the kubelet stand-in runs and finishes
// when evicted. No controller manager runs: nothing recreates the pod.
func (a *agentNode) workload(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := corev1.PodSpec{
		TerminationGracePeriodSeconds: new(int64),
		AutomountServiceAccountToken:  new(bool),
		Containers:                    []corev1.Container{{Name: "c", Image: "registry.invalid/pause:3.10"}},
	}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{Replicas: new(int32), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}},
	}
	rs, err := a.c.Admin.AppsV1().ReplicaSets("default").Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create replicaset %s: %v", name, err)
	}
	spec.NodeName = a.c.Node
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}},
		Spec: spec,
	}
	if _, err := a.c.Admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	vm.Eventually(t, time.Minute, "pod "+name+" Running", func() (bool, string) {
		p, err := a.c.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.Phase == corev1.PodRunning, string(p.Status.Phase)
	})
}

func (a *agentNode) podGone(name string) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := a.c.Admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, "gone"
	}
	if err != nil {
		return false, err.Error()
	}
	return false, fmt.Sprintf("phase %s deleting=%v", p.Status.Phase, p.DeletionTimestamp != nil)
}

// blockEviction creates a PodDisruptionBudget that refuses every eviction
// of the pods labelled app=<app> (there is no disruption controller to
// allow any); the returned func deletes it.
func (a *agentNode) blockEviction(t *testing.T, app string) (unblock func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: "default"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
	}
	if _, err := a.c.Admin.PolicyV1().PodDisruptionBudgets("default").Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PDB: %v", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.c.Admin.PolicyV1().PodDisruptionBudgets("default").Delete(ctx, app, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete PDB: %v", err)
		}
		t.Logf("PDB %s deleted: evictions allowed", app)
	}
}

// stepRunning reports whether the event's step name is Running.
func stepRunning(name string) func(*v1alpha1.LifecycleEvent) bool {
	return func(e *v1alpha1.LifecycleEvent) bool {
		s := vm.Step(e, name)
		return s != nil && s.State == v1alpha1.StepRunning
	}
}

func finished(e *v1alpha1.LifecycleEvent) bool { return e.Status.ClaimStatus.Finished() }

// checkSucceeded asserts what a user sees after a reboot transition: the
// event Succeeded with consistent steps and no finalizer, the node
// uncordoned, the Node condition at the end state.
func (a *agentNode) checkSucceeded(t *testing.T, name string) *v1alpha1.LifecycleEvent {
	t.Helper()
	ev := a.c.WaitEvent(t, name, transitionTimeout, "an end state", finished)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("event %s ended %s: %s", name, ev.Status.ClaimStatus, vm.DescribeEvent(ev))
	}
	checkSteps(t, ev)
	if t.Failed() {
		b, _ := json.MarshalIndent(ev.Status, "", "  ")
		t.Logf("event %s status:\n%s", name, b)
	}
	if d := ev.Status.Driver; d.Name != rebootDriver || d.Start != "RebootStarted" || d.End != "RebootComplete" {
		t.Errorf("status.driver = %+v", d)
	}
	if ev.Status.CompletionTime == nil {
		t.Errorf("no completionTime")
	}
	if ev.Status.Holder == nil || ev.Status.Holder.Identity == "" {
		t.Errorf("no holder: %+v", ev.Status.Holder)
	}
	if c := meta(ev, v1alpha1.ConditionProgressing); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("condition Progressing = %+v, want False", c)
	}
	a.c.WaitEvent(t, name, time.Minute, "finalizer removed", func(e *v1alpha1.LifecycleEvent) bool {
		for _, f := range e.Finalizers {
			if f == v1alpha1.Finalizer {
				return false
			}
		}
		return true
	})
	vm.Eventually(t, time.Minute, "node uncordoned, LifecycleTransition=False/RebootComplete", func() (bool, string) {
		n := a.c.NodeObject(t)
		_, ann := n.Annotations[v1alpha1.AnnotationCordonedBy]
		ok := !n.Spec.Unschedulable && !ann && vm.ConditionIs(n, v1alpha1.NodeConditionLifecycleTransition, corev1.ConditionFalse, "RebootComplete")
		return ok, fmt.Sprintf("unschedulable=%v annotation=%v condition=%+v", n.Spec.Unschedulable, ann, vm.NodeCondition(n, v1alpha1.NodeConditionLifecycleTransition))
	})
	return ev
}

// checkSteps: every step Done (or Skipped), attempts counted from 1, times
// set and in order, the reboot between the drain and the uncordon.
func checkSteps(t *testing.T, ev *v1alpha1.LifecycleEvent) {
	t.Helper()
	if len(ev.Status.Steps) == 0 {
		t.Fatalf("event %s has no status.steps", ev.Name)
	}
	idx := map[string]int{}
	var prev time.Time
	for i, s := range ev.Status.Steps {
		idx[s.Name] = i
		switch s.State {
		case v1alpha1.StepSkipped:
			continue
		case v1alpha1.StepDone:
		default:
			t.Errorf("step %s is %s after success (%s)", s.Name, s.State, s.Message)
			continue
		}
		if s.Attempt < 1 {
			t.Errorf("step %s: attempt %d", s.Name, s.Attempt)
		}
		if s.StartTime == nil || s.FinishTime == nil {
			t.Errorf("step %s: startTime %v finishTime %v", s.Name, s.StartTime, s.FinishTime)
			continue
		}
		if s.FinishTime.Before(s.StartTime) {
			t.Errorf("step %s finished (%s) before it started (%s)", s.Name, s.FinishTime, s.StartTime)
		}
		if s.StartTime.Time.Before(prev) {
			t.Errorf("step %s started (%s) before the step before it (%s)", s.Name, s.StartTime, prev)
		}
		prev = s.StartTime.Time
	}
	r, ok := idx["reboot"]
	if !ok {
		t.Fatalf("no reboot step: %s", vm.DescribeEvent(ev))
	}
	if c, ok := idx["cordon"]; ok && c > r {
		t.Errorf("cordon after reboot: %s", vm.DescribeEvent(ev))
	}
	if u, ok := idx["uncordon"]; !ok || u < r {
		t.Errorf("uncordon missing or before reboot: %s", vm.DescribeEvent(ev))
	}
}

func meta(ev *v1alpha1.LifecycleEvent, typ string) *metav1.Condition {
	for i := range ev.Status.Conditions {
		if ev.Status.Conditions[i].Type == typ {
			return &ev.Status.Conditions[i]
		}
	}
	return nil
}

// checkJournalClean: the agent runs, nothing was moved aside as corrupt,
// and its log since boot says nothing of corruption.
//
// The resumed event may reboot the node at any moment (its reboot step), so
// this reads only what survives a reboot — the state directory and the
// agent's log of every boot — in one command, retried until the guest
// answers it with the agent active.
func (a *agentNode) checkJournalClean(t *testing.T) {
	t.Helper()
	const sep = "--- agent log"
	var out string
	vm.Eventually(t, agentStartTimeout, "the agent active after the power cut, then its state directory and log", func() (bool, string) {
		o, _, code, err := a.v.Try("systemctl is-active " + vm.Unit + " && ls -a " + vm.GuestStateDir + " && echo '" + sep + "' && journalctl --no-pager -o short-precise -u " + vm.Unit)
		if err != nil || code != 0 {
			return false, fmt.Sprintf("exit %d, %v: %s", code, err, lastLines(o, 2))
		}
		out = o
		return true, ""
	})
	dir, log, _ := strings.Cut(out, sep)
	if regexp.MustCompile(`(?i)corrupt|\.bad|\.broken`).MatchString(dir) {
		t.Errorf("journal moved aside after a power cut: %s", dir)
	}
	if !strings.Contains(dir, "journal.db") {
		t.Errorf("no journal.db in %s: %s", vm.GuestStateDir, dir)
	}
	if regexp.MustCompile(`(?i)corrupt`).MatchString(log) {
		t.Errorf("agent log mentions corruption:\n%s", lastLines(log, 40))
	}
}

// verifyJournalOffline stops the agent, runs `lifecycle-agent journal
// verify` and starts it again.
func (a *agentNode) verifyJournalOffline(t *testing.T) {
	t.Helper()
	out, code := a.v.Run("systemctl stop " + vm.Unit + " && lifecycle-agent journal verify 2>&1; rc=$?; systemctl start " + vm.Unit + "; exit $rc")
	if code != 0 {
		t.Errorf("lifecycle-agent journal verify: exit %d\n%s", code, out)
	}
}

// (a) The reboot driver end to end: drain, reboot through logind, resume
// after the boot, success.
func TestScenarioReboot(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNode(t)
	a.workload(t, "workload", map[string]string{"app": "workload"})
	bootBefore := a.v.BootID()
	boots := a.v.Boots()

	a.c.CreateEvent(t, "reboot-1", transitionReboot, nil)
	a.c.WatchEvent(t, "reboot-1", 2*time.Minute, "claimed", func(e *v1alpha1.LifecycleEvent) bool {
		return e.Status.ClaimStatus != "" && e.Status.ClaimStatus != v1alpha1.LifecycleEventPending
	})
	vm.Eventually(t, 3*time.Minute, "workload evicted (drain)", func() (bool, string) {
		if e := a.c.Event(t, "reboot-1"); e.Status.ClaimStatus.Finished() && e.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("event reboot-1 ended before the drain: %s", vm.DescribeEvent(e))
		}
		return a.podGone("workload")
	})
	drained := time.Now()
	if a.rec.FirstSeen(vm.Cordoned).IsZero() {
		t.Errorf("the node was never seen cordoned by the agent before the pods went:\n%s", a.rec.Describe())
	}

	bootAfter := a.v.WaitBoot(boots)
	if bootAfter == bootBefore {
		t.Fatalf("boot ID unchanged: %s", bootAfter)
	}
	t.Logf("drained, then rebooted %s after the drain", time.Since(drained).Round(time.Second))
	ev := a.checkSucceeded(t, "reboot-1")
	if ev.Status.Holder != nil && ev.Status.Holder.BootID == bootAfter && ev.Status.Holder.ClaimTime != nil && ev.Status.Holder.ClaimTime.Time.After(drained) {
		t.Errorf("holder says the event was claimed after the reboot: %+v", ev.Status.Holder)
	}
	if got := a.v.BootID(); got != bootAfter {
		t.Errorf("the node rebooted more than once: boot %s, then %s", bootAfter, got)
	}
	t.Logf("agent log of the boot before the reboot:\n%s", lastLines(a.v.JournalBoot(vm.Unit, -1), 15))
}

// (b) Graceful shutdown: systemctl poweroff while the agent holds its
// logind delay lock.
func TestScenarioShutdown(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNode(t)
	vm.Eventually(t, time.Minute, "the agent's logind delay lock on shutdown", func() (bool, string) {
		out, _ := a.v.Run("systemd-inhibit --list --no-pager --no-legend")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "lifecycle") && strings.Contains(l, "shutdown") && strings.Contains(l, "delay") {
				return true, l
			}
		}
		return false, out
	})

	took := a.v.Poweroff()
	off := time.Now()
	// Nothing in the guest can write now: what the Node shows was posted
	// before the power went off.
	n := a.c.NodeObject(t)
	if !vm.ConditionIs(n, v1alpha1.NodeConditionLifecycleTransition, corev1.ConditionTrue, "ShuttingDown") {
		t.Errorf("after power-off: LifecycleTransition = %+v, want True/ShuttingDown\n%s", vm.NodeCondition(n, v1alpha1.NodeConditionLifecycleTransition), a.rec.Describe())
	}
	if !vm.ConditionIs(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress, corev1.ConditionTrue, "") {
		t.Errorf("after power-off: GracefulNodeShutdownInProgress = %+v, want True", vm.NodeCondition(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress))
	}
	if !vm.Cordoned(n) {
		t.Errorf("after power-off: node not cordoned by the agent (unschedulable=%v, annotations %v)", n.Spec.Unschedulable, n.Annotations)
	}
	if at := a.rec.FirstSeen(func(n *corev1.Node) bool {
		return vm.ConditionIs(n, v1alpha1.NodeConditionLifecycleTransition, corev1.ConditionTrue, "ShuttingDown")
	}); at.IsZero() || at.After(off) {
		t.Errorf("ShuttingDown not seen before the power-off (%s):\n%s", at, a.rec.Describe())
	}
	t.Logf("power-off took %s with the agent's delay lock", took.Round(100*time.Millisecond))

	a.v.PowerOn()
	vm.WaitAgentActive(t, a.v, agentStartTimeout)
	vm.Eventually(t, 3*time.Minute, "ShutdownComplete and uncordoned after the boot", func() (bool, string) {
		n := a.c.NodeObject(t)
		ok := vm.ConditionIs(n, v1alpha1.NodeConditionLifecycleTransition, corev1.ConditionFalse, "ShutdownComplete") &&
			!vm.ConditionIs(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress, corev1.ConditionTrue, "") &&
			!n.Spec.Unschedulable
		return ok, fmt.Sprintf("unschedulable=%v LifecycleTransition=%+v", n.Spec.Unschedulable, vm.NodeCondition(n, v1alpha1.NodeConditionLifecycleTransition))
	}, func() string { return a.rec.Describe() })

	// The previous boot's logs: the agent handled the shutdown; logind did
	// not have to time the delay lock out.
	prev := a.v.JournalBoot(vm.Unit, -1)
	if !regexp.MustCompile(`(?i)shutdown`).MatchString(prev) {
		t.Errorf("the agent's log of the boot that powered off says nothing of the shutdown:\n%s", lastLines(prev, 30))
	}
	if logind := a.v.JournalBoot("systemd-logind.service", -1); strings.Contains(logind, "inhibitor timeout is reached") {
		t.Errorf("logind timed out the agent's delay lock:\n%s", lastLines(logind, 10))
	}
	out, code := a.v.Run("systemctl stop " + vm.Unit + " && lifecycle-agent journal export; rc=$?; systemctl start " + vm.Unit + "; exit $rc")
	if code != 0 {
		t.Fatalf("lifecycle-agent journal export: exit %d\n%s", code, out)
	}
	if !regexp.MustCompile(`(?i)shutdown|ShuttingDown`).MatchString(out) {
		t.Errorf("journal export has no shutdown record:\n%s", lastLines(out, 40))
	}
}

// (c) Power cuts (QEMU system_reset) at two points of a reboot transition
// (a third, mid-drain, is TestRealNode's (l)): the journal opens clean and
// the transition completes.
func TestScenarioPowerCut(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNode(t)

	cut := func(name string, aim func(ev string) (after func())) {
		start := time.Now()
		t.Logf("=== power cut %s", name)
		ev := "cut-" + name
		after := aim(ev)
		a.v.HardReset()
		a.checkJournalClean(t)
		if after != nil {
			after()
		}
		a.checkSucceeded(t, ev)
		vm.Timings.Record("power cut "+name+" (to success)", time.Since(start))
	}

	// 1. Right after the claim: the status says Claimed; the journal may or
	// may not hold the event yet.
	cut("after-claim", func(ev string) func() {
		a.c.CreateEvent(t, ev, transitionReboot, nil)
		a.c.WatchEvent(t, ev, 2*time.Minute, "claimed", func(e *v1alpha1.LifecycleEvent) bool { return e.Status.ClaimStatus == v1alpha1.LifecycleEventClaimed })
		return nil
	})

	// Mid-drain: TestRealNode's (l) cuts the power while a reboot event
	// drains real pods behind a PDB on the real kubelet (this scenario had
	// its own cut there, with a stand-in kubelet and a PDB allowing
	// nothing, until (l) covered it with more to check).

	// 2. Right after the reboot intent: the status says the reboot step
	// runs (its intent is committed before it is reported); the power goes
	// while logind's reboot is under way. The boot that follows must count
	// as the reboot: no second one.
	var bootsAtCut int
	cut("after-reboot-intent", func(ev string) func() {
		a.c.CreateEvent(t, ev, transitionReboot, nil)
		a.c.WatchEvent(t, ev, 3*time.Minute, "reboot step running", stepRunning("reboot"))
		return func() { bootsAtCut = a.v.Boots() }
	})
	if got := a.v.Boots(); got != bootsAtCut {
		t.Errorf("the node rebooted again after the power cut that followed the reboot intent (%d boots, want %d)", got, bootsAtCut)
	}
	a.verifyJournalOffline(t)
}

// (d) dpkg -i of a newer package version in the middle of a transition:
// the new agent resumes and completes it.
func TestScenarioUpgradeMidTransition(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNode(t)
	newDeb := newerDeb(t, a.deb, a.c.Dir)

	a.workload(t, "blocked", map[string]string{"app": "blocked"})
	unblock := a.blockEviction(t, "blocked")
	a.c.CreateEvent(t, "upgrade-1", transitionReboot, nil)
	a.c.WatchEvent(t, "upgrade-1", 3*time.Minute, "evict running", stepRunning("evict"))
	oldPID := strings.TrimSpace(a.v.MustRun("systemctl show -p MainPID --value " + vm.Unit))
	oldVer := strings.TrimSpace(a.v.MustRun("dpkg-query -W -f='${Version}' lifecycle-agent"))

	// As an unattended upgrade: no --force-conf*, no terminal, over the
	// provisioned (edited) config. The conffile is the same in both
	// versions, so dpkg must not ask, and the edits must stay.
	upOut := vm.UpgradeDeb(t, a.v, newDeb)
	t.Logf("dpkg -i %s:\n%s", filepath.Base(newDeb), upOut)
	if strings.Contains(upOut, "Configuration file") || strings.Contains(upOut, "conffile") {
		t.Errorf("the upgrade over the edited config asked about the conffile:\n%s", upOut)
	}
	if cfg := a.v.MustRun("cat " + vm.GuestConfig); !strings.Contains(cfg, "nodeName: "+vm.NodeName) {
		t.Errorf("the upgrade lost the config's edits:\n%s", cfg)
	}
	newVer := strings.TrimSpace(a.v.MustRun("dpkg-query -W -f='${Version}' lifecycle-agent"))
	if newVer == oldVer {
		t.Fatalf("package version unchanged: %s", newVer)
	}
	vm.WaitAgentActive(t, a.v, agentStartTimeout)
	if pid := strings.TrimSpace(a.v.MustRun("systemctl show -p MainPID --value " + vm.Unit)); pid == oldPID {
		t.Errorf("the upgrade did not restart the agent (MainPID %s)", pid)
	}
	if out := a.v.MustRun("lifecycle-agent --version 2>&1 || lifecycle-agent version 2>&1"); !strings.Contains(out, newVer) {
		t.Errorf("the installed agent says %q, want version %s", strings.TrimSpace(out), newVer)
	}
	if e := a.c.Event(t, "upgrade-1"); e.Status.ClaimStatus.Finished() {
		t.Fatalf("event finished during the upgrade: %s", vm.DescribeEvent(e))
	}
	unblock()
	a.checkSucceeded(t, "upgrade-1")
	t.Logf("upgraded %s -> %s mid-transition", oldVer, newVer)
}

// newerDeb is the package under test built again at a higher version:
// $LIFECYCLE_AGENT_DEB_NEW, or hack/build-deb.sh <version>+vmtest1 into dir.
func newerDeb(t *testing.T, deb, dir string) string {
	t.Helper()
	if p := os.Getenv("LIFECYCLE_AGENT_DEB_NEW"); p != "" {
		return p
	}
	m := regexp.MustCompile(`^lifecycle-agent_(.+)_amd64\.deb$`).FindStringSubmatch(filepath.Base(deb))
	if m == nil {
		t.Fatalf("cannot read the version of %s", deb)
	}
	ver := m[1] + "+vmtest1"
	out := filepath.Join(dir, "dist-new")
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "hack", "build-deb.sh"), ver)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "DIST="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/build-deb.sh %s (the newer package for the upgrade): %v\n%s", ver, err, b)
	}
	vm.Timings.Record("build newer .deb", time.Since(start))
	p := filepath.Join(out, "lifecycle-agent_"+ver+"_amd64.deb")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("hack/build-deb.sh made no %s: %v", p, err)
	}
	return p
}

// (e) apt-get remove keeps /var/lib/lifecycle-agent (and the config), and
// the package installed again starts on that journal; purge removes both.
func TestScenarioRemovePurge(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNode(t)
	vm.Eventually(t, time.Minute, "journal.db created", func() (bool, string) {
		out, code := a.v.Run("ls -la " + vm.GuestStateDir)
		return code == 0 && strings.Contains(out, "journal.db"), out
	})
	removed := a.v.MustRun("DEBIAN_FRONTEND=noninteractive apt-get remove -y lifecycle-agent 2>&1")
	// prerm withdrew the node's transitions (lifecycle-agent unpublish).
	if list, err := a.c.Lifecycle.Transitions.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + vm.NodeName}); err != nil {
		t.Fatal(err)
	} else if len(list.Items) != 0 {
		t.Errorf("after remove, %d LifecycleTransitions of %s are left; apt-get said:\n%s", len(list.Items), vm.NodeName, removed)
	}
	out, _ := a.v.Run("dpkg-query -W -f='${db:Status-Abbrev}' lifecycle-agent; echo; systemctl is-active " + vm.Unit + "; command -v lifecycle-agent; ls " + vm.GuestStateDir + " " + vm.GuestConfig)
	if !strings.HasPrefix(out, "rc") {
		t.Errorf("after remove, the package is not in state rc: %q", out)
	}
	if strings.Contains(out, "\nactive") || strings.Contains(out, "/usr/bin/lifecycle-agent") {
		t.Errorf("after remove, the agent is still there: %q", out)
	}
	if !strings.Contains(out, "journal.db") || !strings.Contains(out, vm.GuestConfig) {
		t.Errorf("after remove, the journal or the config is gone: %q", out)
	}
	// Installed again: it starts by itself, on the journal the removal kept.
	inode := strings.TrimSpace(a.v.MustRun("stat -c %i " + vm.GuestStateDir + "/journal.db"))
	t.Logf("dpkg -i again after remove:\n%s", vm.InstallDeb(t, a.v, a.deb))
	vm.WaitAgentActive(t, a.v, agentStartTimeout)
	if again := strings.TrimSpace(a.v.MustRun("stat -c %i " + vm.GuestStateDir + "/journal.db")); again != inode {
		t.Errorf("the reinstalled agent did not keep the journal (inode %s, was %s)", again, inode)
	}
	// Purge removes the state and the config, but never a journal the
	// agent moved aside as corrupt (evidence); the directory stays for it.
	corrupt := vm.GuestStateDir + "/journal.db.corrupt-20261201T000000Z"
	a.v.MustRun("echo garbage > " + corrupt)
	a.v.MustRun("DEBIAN_FRONTEND=noninteractive apt-get purge -y lifecycle-agent 2>&1")
	if out, code := a.v.Run("test ! -e " + vm.GuestStateDir + "/journal.db && test ! -e " + vm.GuestConfig + " && ! dpkg-query -W lifecycle-agent 2>/dev/null"); code != 0 {
		out2, _ := a.v.Run("ls -la " + vm.GuestStateDir + " /etc/lifecycle-agent; dpkg -l lifecycle-agent")
		t.Errorf("after purge, state, config or package left: %s%s", out, out2)
	}
	if left := strings.Fields(a.v.MustRun("ls -A " + vm.GuestStateDir)); len(left) != 1 || left[0] != filepath.Base(corrupt) {
		t.Errorf("after purge %s holds %v; want only the corrupt journal kept as evidence", vm.GuestStateDir, left)
	}
	if out, code := a.v.Run("test -f " + vm.GuestKubeconfig); code != 0 {
		t.Errorf("purge removed the kubelet's kubeconfig: %s", out)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// (h) The start limit (issue 16.6), on the guest's real systemd: an agent
// that keeps failing at start is restarted until the limit trips (not a
// moment before: OnFailure= fires only then), then left failed while
// lifecycle-agent-recover.service waits, and started again by it once the
// wait is over; the cause gone by then, it comes back active. The limit,
// RestartSec and the recover delay are shortened by drop-ins, and a
// wrapper makes the start fail (exit 1) until a flag file exists: what is
// under test is the units' and the recover script's behaviour as shipped.
func TestScenarioStartLimit(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNode(t)
	const (
		fixed   = "/run/lifecycle-agent-test-fixed"
		recover = "lifecycle-agent-recover.service"
	)
	a.v.WriteFile("/etc/systemd/system/"+vm.Unit+".d/50-start-limit-test.conf", []byte(`[Unit]
StartLimitBurst=3
StartLimitIntervalSec=120
[Service]
RestartSec=1
ExecStart=
ExecStart=/bin/sh -c 'test -e `+fixed+` && exec /usr/bin/lifecycle-agent run; echo "start-limit test: failing at start"; exit 1'
`), 0o644)
	a.v.WriteFile("/etc/systemd/system/"+recover+".d/50-start-limit-test.conf", []byte("[Service]\nEnvironment=LIFECYCLE_AGENT_RECOVER_DELAY=10\n"), 0o644)
	a.v.MustRun("systemctl daemon-reload && systemctl restart --no-block " + vm.Unit)
	show := func(unit string) string {
		return strings.Join(strings.Fields(a.v.MustRun("systemctl show -P ActiveState "+unit+"; systemctl show -P Result "+unit)), " ")
	}
	units := func() string {
		out, _ := a.v.Run("systemctl show -p ActiveState,SubState,Result,NRestarts " + vm.Unit + " " + recover + "; journalctl --no-pager -n 40 -u " + vm.Unit + " -u " + recover)
		return out
	}
	// systemd 252 says "Start request repeated too quickly" and keeps the
	// last failure's result (exit-code): start-limit-hit is only for a
	// manual start. The recover script must (and does) read it so.
	vm.Eventually(t, 90*time.Second, "the start limit trips", func() (bool, string) {
		s := show(vm.Unit)
		return strings.HasPrefix(s, "failed ") && strings.Contains(a.v.Journal(vm.Unit), "Start request repeated too quickly"), s
	}, units)
	failures := strings.Count(a.v.Journal(vm.Unit), "start-limit test: failing at start")
	if failures != 3 {
		t.Errorf("%d failed starts before the limit tripped; want StartLimitBurst=3", failures)
	}
	if s := show(recover); !strings.HasPrefix(s, "activating") {
		t.Errorf("%s is %q right after the limit tripped; want it activating (waiting)", recover, s)
	}
	if log := a.v.Journal(recover); !strings.Contains(log, "hit its start limit; starting it again in 10s") || strings.Count(log, "starting it again") != 1 {
		t.Errorf("%s log:\n%s\nwant exactly one wait, begun when the limit tripped", recover, log)
	}
	a.v.MustRun("touch " + fixed)
	vm.WaitAgentActive(t, a.v, agentStartTimeout)
	vm.Eventually(t, 30*time.Second, recover+" done", func() (bool, string) {
		s := show(recover)
		return s == "inactive success", s + "\n" + a.v.Journal(recover)
	})
	if log := a.v.Journal(recover); !strings.Contains(log, vm.Unit+" started again after its start limit") {
		t.Errorf("%s log:\n%s\nwant the restart said", recover, log)
	}
	if s := show(vm.Unit); s != "active success" {
		t.Errorf("after the recover unit: agent %q, want active", s)
	}
}
