package vm_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// Issue 18: the VM as a real Kubernetes node. The guest's own kubelet
// (v1.37, hack/nodebin.sh) and containerd 2 register vm-node with the
// test apiserver with the agent's node credentials (the same
// /etc/kubernetes/kubelet.conf), run real containers, and no stand-in
// plays vm-node's kubelet. Evicted pods' replacements land on the
// host-side SpareNode (a stand-in), as a scheduler would put them.

const (
	// recordDir is the workload's hostPath: one <pod>.log per pod, lines
	// "start|sigterm|exit <unix ns> <time>" (test/nodebin/workload).
	recordDir = "/var/lib/lifecycle-test/record"
	// workloadLinger is how long a workload container keeps running
	// after SIGTERM; its grace period (podGrace) is longer.
	workloadLinger = 3 * time.Second
	podGrace       = 10
	// Under TCG the kubelet takes 20-60 s from start to Ready.
	kubeletReadyTimeout = 5 * time.Minute
	// kubeletLate delays the kubelet's start after the reboot.
	kubeletLate = 20 * time.Second
)

// realNode is an agentNode whose kubelet is real.
type realNode struct {
	*agentNode
	kubeletVersion string
}

// startRealNodeWith: a RealKubelet cluster (with more options), the VM,
// the agent installed and active, then the kubelet, containerd and the
// image import enabled, and the Node vm-node Ready as the kubelet of this
// boot reports it.
func startRealNodeWith(t *testing.T, opts vm.ClusterOptions) *realNode {
	t.Helper()
	vm.RequireHostTools(t)
	deb := vm.FindDeb(t)
	opts.RealKubelet = true
	c := vm.StartClusterWith(t, opts)
	rec := c.RecordNode(t)
	v := c.StartVMWith(t, vm.Options{Mem: 2048})
	c.ProvisionNode(t, v, realNodeConfig)
	t.Logf("dpkg -i:\n%s", lastLines(vm.InstallDeb(t, v, deb), 5))
	vm.WaitAgentActive(t, v, agentStartTimeout)
	// The logind drop-in race (issue 40 item 4), as on a node's first
	// boot: the agent is active with its drop-in at its own budget and no
	// 99-kubelet.conf exists when the kubelet starts for the first time.
	if out, code := v.Run("test ! -e " + kubeletDropIn + " && grep -x 'InhibitDelayMaxSec=10' " + agentDropIn); code != 0 {
		out, _, _, _ = v.Try("ls -l /etc/systemd/logind.conf.d/; grep -H . /etc/systemd/logind.conf.d/*")
		t.Fatalf("before the kubelet's first start: want no %s and the agent's %s at its budget (10 s):\n%s", kubeletDropIn, agentDropIn, out)
	} else {
		t.Logf("before the kubelet's first start: the agent's drop-in says %s, no 99-kubelet.conf", strings.TrimSpace(out))
	}
	// The kubelet's first start is on a cold boot (the reset button, after
	// a sync), with the agent and the kubelet both enabled: systemd starts
	// them in the unit files' order, as on a freshly provisioned node's
	// first power-on, not in the order a test would choose.
	start := time.Now()
	v.MustRun("systemctl enable containerd.service ci-images.service kubelet.service 2>&1 && sync")
	v.HardReset()
	n := waitKubeletReady(t, c, v, kubeletReadyTimeout)
	vm.Timings.Record("real kubelet: enable, cold boot → Node Ready", time.Since(start))
	t.Logf("vm-node Ready after %s: kubelet %s, runtime %s, boot %s", time.Since(start).Round(time.Second),
		n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.BootID)
	checkDropInFollowed(t, v)
	c.WaitTransition(t, transitionReboot, 2*time.Minute)
	return &realNode{agentNode: &agentNode{c: c, v: v, rec: rec, deb: deb}, kubeletVersion: n.Status.NodeInfo.KubeletVersion}
}

const (
	// realNodeConfig: the agent manages its logind drop-in with a budget
	// above logind's default 5 s and below the kubelet's 20 s, so both
	// drop-ins exist and the agent's, which sorts last, must follow the
	// kubelet's (checkDropInFollowed).
	realNodeConfig = agentConfig + "shutdown:\n  budget: 10s\n  manageLogindDropIn: true\n"
	kubeletDropIn  = "/etc/systemd/logind.conf.d/99-kubelet.conf"
	agentDropIn    = "/etc/systemd/logind.conf.d/99-lifecycle-agent.conf"
)

// checkDropInFollowed checks the end of the drop-in race on the kubelet's
// first start with graceful node shutdown on (the image's 20 s): the
// kubelet wrote 99-kubelet.conf after the agent's drop-in existed; the
// agent's file, which sorts last and decides, followed it to the
// kubelet's value; logind's effective InhibitDelayMaxUSec is that value;
// the kubelet's shutdown manager started (its delay lock is held, its log
// has no "Failed to start node shutdown manager"). The order and times of
// the writes are logged, on the guest's clock.
func checkDropInFollowed(t *testing.T, v *vm.VM) {
	t.Helper()
	vm.Eventually(t, time.Minute, "the kubelet's delay lock (its shutdown manager started)", func() (bool, string) {
		out, _, _, _ := v.Try("systemd-inhibit --list --no-pager --no-legend")
		return strings.Contains(out, "kubelet"), out
	})
	out := v.MustRun("stat -c '%.9Y %n' " + kubeletDropIn + " " + agentDropIn + "; cat " + kubeletDropIn + " " + agentDropIn +
		"; busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec")
	t.Logf("after the kubelet's first start (mtimes on the guest's clock, then both files and logind's value):\n%s", out)
	if !strings.Contains(out, "t 20000000") {
		t.Errorf("logind's InhibitDelayMaxUSec is not the kubelet's 20 s after its first start: the agent's drop-in did not follow 99-kubelet.conf:\n%s", out)
	}
	if kl := v.Journal("kubelet"); strings.Contains(kl, "Failed to start node shutdown manager") {
		t.Errorf("the kubelet ran without graceful node shutdown after its first start:\n%s", grepLines(kl, "shutdown"))
	}
	if al := v.JournalBoot(vm.Unit, 0); !strings.Contains(al, "logind drop-in follows the kubelet's") {
		t.Errorf("the agent's log of this boot does not say its drop-in followed the kubelet's:\n%s", lastLines(grepLines(al, "drop-in"), 10))
	} else {
		t.Logf("the agent's log of this boot:\n%s", lastLines(grepLines(al, "drop-in"), 5))
	}
	checkBootOrder(t, v)
}

// checkBootOrder checks, in this boot's journal, that systemd started the
// agent before the kubelet (Before=kubelet.service) and that the agent's
// drop-in followed after the kubelet had started: the order of a node's
// first boot, in which the race exists. The lines are logged.
func checkBootOrder(t *testing.T, v *vm.VM) {
	t.Helper()
	out := v.MustRun("journalctl --no-pager -b 0 -o short-monotonic -u " + vm.Unit + " -u kubelet.service" +
		" | grep -E 'Started (lifecycle-agent|kubelet)|logind drop-in|Starting kubelet' || true")
	t.Logf("this boot, agent and kubelet (monotonic seconds since boot):\n%s", out)
	agentUp, kubeletUp, followed := -1, -1, -1
	for i, l := range strings.Split(out, "\n") {
		switch {
		case agentUp < 0 && strings.Contains(l, "Started "+vm.Unit):
			agentUp = i
		case kubeletUp < 0 && strings.Contains(l, "Started kubelet.service"):
			kubeletUp = i
		case strings.Contains(l, "logind drop-in follows the kubelet's"):
			followed = i
		}
	}
	switch {
	case agentUp < 0 || kubeletUp < 0:
		t.Errorf("this boot's journal does not show both units started (agent line %d, kubelet line %d)", agentUp, kubeletUp)
	case agentUp > kubeletUp:
		t.Errorf("the kubelet started before the agent in this boot: the first-boot order (Before=kubelet.service) did not hold")
	case followed < kubeletUp:
		t.Errorf("the agent's drop-in did not follow after the kubelet's start in this boot (follow line %d, kubelet line %d)", followed, kubeletUp)
	}
}

// waitKubeletReady waits until the Node is Ready as reported by the
// kubelet running in the guest's current boot: Ready=True/KubeletReady and
// status.nodeInfo.bootID equal to the guest's boot ID.
func waitKubeletReady(t *testing.T, c *vm.Cluster, v *vm.VM, timeout time.Duration) *corev1.Node {
	t.Helper()
	boot := v.BootID()
	var node *corev1.Node
	vm.Eventually(t, timeout, "the guest's kubelet to report vm-node Ready in boot "+boot, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n, err := c.Admin.CoreV1().Nodes().Get(ctx, vm.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		node = n
		r := vm.NodeCondition(n, string(corev1.NodeReady))
		return apiclient.ReadyInBoot(n, boot) && n.Status.NodeInfo.BootID == boot && r.Reason == "KubeletReady",
			fmt.Sprintf("bootID %q, Ready %+v", n.Status.NodeInfo.BootID, r)
	}, func() string {
		out, _, _, _ := v.Try("systemctl --no-pager status kubelet containerd ci-images | head -40; journalctl --no-pager -n 40 -u kubelet -u containerd")
		return out
	})
	if !strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://2.") {
		t.Errorf("container runtime %q, want containerd://2.x", node.Status.NodeInfo.ContainerRuntimeVersion)
	}
	return node
}

// realPodSpec runs the workload image on the real kubelet: it records
// start, SIGTERM and exit on the hostPath, and lingers workloadLinger
// after SIGTERM within a podGrace-second grace period.
func realPodSpec(string) corev1.PodSpec {
	grace := int64(podGrace)
	dir := corev1.HostPathDirectoryOrCreate
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: &grace,
		AutomountServiceAccountToken:  new(bool),
		Containers: []corev1.Container{{
			Name: "app", Image: "lifecycle.test/workload:1", ImagePullPolicy: corev1.PullNever,
			Args: []string{"-dir", "/record", "-linger", workloadLinger.String()},
			Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "record", MountPath: "/record"}},
		}},
		Volumes: []corev1.Volume{{Name: "record", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: recordDir, Type: &dir}}}},
	}
}

// podLife is one pod's record from the hostPath.
type podLife struct{ start, sigterm, exit time.Time }

func (r *realNode) podRecord(t *testing.T, pod string) podLife {
	t.Helper()
	out, code := r.v.Run("cat " + recordDir + "/" + pod + ".log")
	if code != 0 {
		t.Fatalf("no record of pod %s on the node (%s/%s.log): %s", pod, recordDir, pod, out)
	}
	var l podLife
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			t.Fatalf("pod %s record line %q: %v", pod, line, err)
		}
		at := time.Unix(0, ns)
		switch f[0] {
		case "start":
			l.start = at
		case "sigterm":
			l.sigterm = at
		case "exit":
			l.exit = at
		}
	}
	return l
}

// TestRealNode runs the real-node scenarios in one VM session: one control
// plane, one boot, one package install and one kubelet join for all four,
// which cost about a minute each under TCG when every scenario had its own
// (and (i)'s reboot, which (k) repeats with more to check, is gone). Each
// scenario starts from a Ready, uncordoned node with no pod of its own on
// it (realNode.scenario checks) and leaves the node so for the next; one
// that fails stops the ones after it, which would start from a node in an
// unknown state. VM_TESTS narrows to one scenario, e.g.
// VM_TESTS=TestRealNode/PowerCutMidDrain (the join still runs first).
//
//	(i) DrainAndUncordon: a drain of real pods behind a PDB, the uncordon
//	(k) RebootWithPods: a reboot event with real pods and a late DaemonSet pod
//	(l) PowerCutMidDrain: a power cut while a reboot event drains real pods
//	(j) Poweroff: systemctl poweroff beside the kubelet's graceful node shutdown
func TestRealNode(t *testing.T) {
	defer vm.Scenario(t)()
	// The audit log is (l)'s: it counts the evictions.
	r := startRealNodeWith(t, vm.ClusterOptions{AuditLog: true})
	if want := "v1.37"; !strings.HasPrefix(r.kubeletVersion, want) {
		t.Errorf("kubelet version %s, want the control plane's %s.x", r.kubeletVersion, want)
	}
	// The image's kubelet config, before a scenario changes it: graceful
	// node shutdown on, as (j) needs it (the others turn it off).
	if out, code := r.v.Run("grep -x 'shutdownGracePeriod: 20s' /var/lib/kubelet/config.yaml && grep -x 'shutdownGracePeriodCriticalPods: 5s' /var/lib/kubelet/config.yaml"); code != 0 {
		t.Fatalf("the image's kubelet config does not set shutdownGracePeriod 20s / shutdownGracePeriodCriticalPods 5s (hack/vm/build-image.sh): %s", out)
	}
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *realNode)
	}{
		{"DrainAndUncordon", realNodeDrainAndUncordon}, // (i)
		{"RebootWithPods", realNodeRebootWithPods},     // (k)
		{"PowerCutMidDrain", realNodePowerCutMidDrain}, // (l)
		{"Poweroff", realNodePoweroff},                 // (j)
	} {
		if !t.Run(sc.name, func(t *testing.T) {
			defer vm.Scenario(t)()
			sc.run(t, r.scenario(t))
		}) {
			t.Fatalf("%s failed: the scenarios after it share its node and were not run", sc.name)
		}
	}
}

// scenario is r for one scenario of TestRealNode: the VM's infrastructure
// failures end t, the Node recorder looks only at what t sees. It first
// checks where the scenario starts: the kubelet of this boot reports the
// Node Ready, the node is schedulable with nothing of ours on it, and no
// pod but a DaemonSet's runs on it.
func (r *realNode) scenario(t *testing.T) *realNode {
	t.Helper()
	t.Cleanup(r.v.Bind(t))
	waitKubeletReady(t, r.c, r.v, kubeletReadyTimeout)
	vm.Eventually(t, 2*time.Minute, "vm-node schedulable, not cordoned by us, no pod but a DaemonSet's on it", func() (bool, string) {
		n := r.c.NodeObject(t)
		if n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
			return false, describeConditions(n)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := r.c.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + vm.NodeName})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range l.Items {
			if c := metav1.GetControllerOf(&p); c != nil && c.Kind == "DaemonSet" {
				continue
			}
			left = append(left, p.Namespace+"/"+p.Name+"="+string(p.Status.Phase))
		}
		return len(left) == 0, "pods on vm-node: " + strings.Join(left, " ")
	})
	s := *r
	a := *r.agentNode
	a.rec = r.rec.Since(time.Now())
	s.agentNode = &a
	return &s
}

// deletePods deletes pods ns/names at once (grace 0) and waits until they
// are gone: a scenario's bare pods, which a later scenario's drain would
// refuse to evict (no controller).
func (r *realNode) deletePods(t *testing.T, ns string, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	zero := int64(0)
	for _, n := range names {
		if err := r.c.Admin.CoreV1().Pods(ns).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete pod %s/%s: %v", ns, n, err)
		}
	}
	vm.Eventually(t, 2*time.Minute, fmt.Sprintf("pods %s/%v gone", ns, names), func() (bool, string) {
		for _, n := range names {
			if _, err := r.c.Admin.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, fmt.Sprintf("%s: %v", n, err)
			}
		}
		return true, ""
	})
}

// realNodeDrainAndUncordon is (i): a drain of three real pods behind a PDB,
// then the uncordon.
func realNodeDrainAndUncordon(t *testing.T, r *realNode) {

	// Drain: three real pods behind a PDB (minAvailable 2: one eviction at
	// a time, the next only once the replacement on SpareNode is Ready).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &testenv.Workload{Namespace: "web", Name: "web", Node: vm.NodeName, Spare: vm.SpareNode, Replicas: 3, MinAvailable: 2, PodSpec: realPodSpec}
	if err := w.Start(ctx, r.c.Env.AdminConfig()); err != nil {
		t.Fatalf("workload: %v", err)
	}
	started := time.Now()
	vm.Eventually(t, 4*time.Minute, "3 workload pods Running and Ready on vm-node (real containers)", func() (bool, string) {
		l, err := r.c.Admin.CoreV1().Pods("web").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + vm.NodeName})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		var states []string
		for _, p := range l.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
			states = append(states, p.Name+"="+string(p.Status.Phase))
		}
		return ready == 3, strings.Join(states, " ")
	}, func() string {
		out, _, _, _ := r.v.Try("journalctl --no-pager -n 30 -u kubelet -u containerd")
		return out
	})
	vm.Timings.Record("real kubelet: 3 pods created → Ready", time.Since(started))

	drainStart := time.Now()
	r.c.CreateEvent(t, "drain-1", vm.NodeName+"-drain", nil)
	ev := r.c.WaitEvent(t, "drain-1", 6*time.Minute, "an end state", finished)
	vm.Timings.Record("real kubelet: drain of 3 pods behind a PDB", time.Since(drainStart))
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("drain-1 ended %s: %s", ev.Status.ClaimStatus, vm.DescribeEvent(ev))
	}
	t.Logf("drain-1 Succeeded in %s", time.Since(drainStart).Round(100*time.Millisecond))
	var lives []podLife
	for i := 0; i < 3; i++ {
		pod := fmt.Sprintf("web-%d", i)
		l := r.podRecord(t, pod)
		switch {
		case l.start.IsZero() || l.sigterm.IsZero() || l.exit.IsZero():
			t.Errorf("pod %s: record start=%v sigterm=%v exit=%v: want all three (SIGTERM received, then a clean exit)", pod, l.start, l.sigterm, l.exit)
		case l.exit.Sub(l.sigterm) < workloadLinger:
			t.Errorf("pod %s exited %s after SIGTERM; it lingers %s within a %ds grace period: killed early", pod, l.exit.Sub(l.sigterm), workloadLinger, podGrace)
		default:
			t.Logf("pod %s: SIGTERM at +%s, exit %s later", pod, l.sigterm.Sub(drainStart).Round(10*time.Millisecond), l.exit.Sub(l.sigterm).Round(10*time.Millisecond))
		}
		lives = append(lives, l)
	}
	// The PDB allows one disruption at a time: no two pods were stopping
	// at once.
	for i := range lives {
		for j := range lives {
			if i != j && !lives[i].sigterm.IsZero() && !lives[j].sigterm.IsZero() && lives[j].sigterm.After(lives[i].sigterm) && lives[j].sigterm.Before(lives[i].exit) {
				t.Errorf("web-%d got SIGTERM while web-%d was still stopping: the PDB (minAvailable 2 of 3) allows one at a time", j, i)
			}
		}
	}
	if got := w.Replaced(); got != 3 {
		t.Errorf("%d replacements on %s, want 3", got, vm.SpareNode)
	}
	vm.Eventually(t, time.Minute, "Drained=True/DrainCompleted beside the kubelet's Ready=True", func() (bool, string) {
		n := r.c.NodeObject(t)
		ok := n.Spec.Unschedulable && vm.ConditionIs(n, v1alpha1.NodeConditionDrained, corev1.ConditionTrue, "DrainCompleted") &&
			vm.ConditionIs(n, string(corev1.NodeReady), corev1.ConditionTrue, "KubeletReady") &&
			vm.NodeCondition(n, string(corev1.NodeMemoryPressure)) != nil
		return ok, describeConditions(n)
	})

	// Uncordon: back in service, the kubelet's conditions untouched.
	r.c.CreateEvent(t, "uncordon-1", vm.NodeName+"-uncordon", nil)
	if ev := r.c.WaitEvent(t, "uncordon-1", 3*time.Minute, "an end state", finished); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("uncordon-1 ended %s: %s", ev.Status.ClaimStatus, vm.DescribeEvent(ev))
	}
	vm.Eventually(t, time.Minute, "schedulable, Drained=False/ReturnedToService, Ready=True", func() (bool, string) {
		n := r.c.NodeObject(t)
		ok := !n.Spec.Unschedulable && vm.ConditionIs(n, v1alpha1.NodeConditionDrained, corev1.ConditionFalse, "ReturnedToService") &&
			vm.ConditionIs(n, string(corev1.NodeReady), corev1.ConditionTrue, "KubeletReady")
		return ok, describeConditions(n)
	})
}

// setKubeletShutdownGrace sets the kubelet's shutdownGracePeriod and
// shutdownGracePeriodCriticalPods (whole seconds; 0 turns graceful node
// shutdown off, kubeadm's default), restarts it and waits until it reports
// Ready again.
func (r *realNode) setKubeletShutdownGrace(t *testing.T, grace, critical int) {
	t.Helper()
	r.v.MustRun(fmt.Sprintf("sed -i -e 's/^shutdownGracePeriod: .*/shutdownGracePeriod: %ds/' -e 's/^shutdownGracePeriodCriticalPods: .*/shutdownGracePeriodCriticalPods: %ds/' /var/lib/kubelet/config.yaml && grep -q '^shutdownGracePeriod: %ds' /var/lib/kubelet/config.yaml && systemctl restart kubelet", grace, critical, grace))
	want := grace > 0
	vm.Eventually(t, time.Minute, fmt.Sprintf("the kubelet's inhibitor lock held=%v (shutdownGracePeriod %ds)", want, grace), func() (bool, string) {
		out, _, _, _ := r.v.Try("systemd-inhibit --list --no-pager --no-legend")
		return strings.Contains(out, "kubelet") == want, out
	})
	waitKubeletReady(t, r.c, r.v, kubeletReadyTimeout)
}

func describeConditions(n *corev1.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "unschedulable=%v", n.Spec.Unschedulable)
	for _, c := range n.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s/%s", c.Type, c.Status, c.Reason)
	}
	return b.String()
}
