package vm_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// startRealNode: a RealKubelet cluster, the VM, the agent installed and
// active, then the kubelet, containerd and the image import enabled, and
// the Node vm-node Ready as the kubelet of this boot reports it.
func startRealNode(t *testing.T) *realNode {
	t.Helper()
	return startRealNodeWith(t, vm.ClusterOptions{})
}

// startRealNodeWith is startRealNode with more cluster options
// (RealKubelet is always set).
func startRealNodeWith(t *testing.T, opts vm.ClusterOptions) *realNode {
	t.Helper()
	vm.RequireHostTools(t)
	deb := vm.FindDeb(t)
	opts.RealKubelet = true
	c := vm.StartClusterWith(t, opts)
	rec := c.RecordNode(t)
	v := c.StartVMWith(t, vm.Options{Mem: 2048})
	c.ProvisionNode(t, v, agentConfig)
	t.Logf("dpkg -i:\n%s", lastLines(vm.InstallDeb(t, v, deb), 5))
	vm.WaitAgentActive(t, v, agentStartTimeout)
	start := time.Now()
	v.MustRun("systemctl enable --now containerd.service ci-images.service kubelet.service 2>&1")
	n := waitKubeletReady(t, c, v, kubeletReadyTimeout)
	vm.Timings.Record("real kubelet: enable → Node Ready", time.Since(start))
	t.Logf("vm-node Ready after %s: kubelet %s, runtime %s, boot %s", time.Since(start).Round(time.Second),
		n.Status.NodeInfo.KubeletVersion, n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.BootID)
	c.WaitTransition(t, transitionReboot, 2*time.Minute)
	return &realNode{agentNode: &agentNode{c: c, v: v, rec: rec, deb: deb}, kubeletVersion: n.Status.NodeInfo.KubeletVersion}
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

func TestRealNode(t *testing.T) {
	defer vm.Scenario(t)()
	r := startRealNode(t)
	if want := "v1.37"; !strings.HasPrefix(r.kubeletVersion, want) {
		t.Errorf("kubelet version %s, want the control plane's %s.x", r.kubeletVersion, want)
	}

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

	// Reboot: the driver waits for the kubelet of the new boot, not for
	// the Ready=True the Node still shows from the old one. The kubelet
	// comes up kubeletLate after the agent in the new boot (a drop-in), as
	// a kubelet waiting for its runtime or its disks does: long enough for
	// an agent that trusted the old Ready to uncordon first.
	//
	// The kubelet runs with kubeadm's default here, graceful node shutdown
	// off (shutdownGracePeriod 0): with it on, the kubelet itself posts
	// Ready=False ("node is shutting down") before the reboot, and the old
	// Ready=True is gone before the agent could trust it.
	r.setKubeletShutdownGrace(t, 0, 0)
	r.v.WriteFile("/etc/systemd/system/kubelet.service.d/late.conf",
		[]byte(fmt.Sprintf("[Service]\nExecStartPre=/bin/sleep %d\n", int(kubeletLate.Seconds()))), 0o644)
	r.v.MustRun("systemctl daemon-reload")
	boots := r.v.Boots()
	oldBoot := r.v.BootID()
	rebootStart := time.Now()
	r.c.CreateEvent(t, "reboot-1", transitionReboot, nil)
	newBoot := r.v.WaitBoot(boots)
	if newBoot == oldBoot {
		t.Fatalf("boot ID unchanged: %s", newBoot)
	}
	ev = r.checkSucceeded(t, "reboot-1")
	vm.Timings.Record("real kubelet: reboot event (drain, reboot, kubelet Ready, uncordon)", time.Since(rebootStart))
	// Both times below come from the guest's clock (the kubelet's heartbeat,
	// the agent's step time), whole seconds; the host's clock can be off
	// from the guest's under TCG.
	var kubeletBack time.Time
	seenBack := r.rec.FirstSeen(func(n *corev1.Node) bool {
		if apiclient.ReadyInBoot(n, newBoot) && n.Status.NodeInfo.BootID == newBoot {
			kubeletBack = vm.NodeCondition(n, string(corev1.NodeReady)).LastHeartbeatTime.Time
			return true
		}
		return false
	})
	if seenBack.IsZero() {
		t.Fatalf("never saw the kubelet of boot %s report Ready:\n%s", newBoot, r.rec.Describe())
	}
	s := vm.Step(ev, "wait-ready")
	if s == nil || s.FinishTime == nil {
		t.Fatalf("no finished wait-ready step: %s", vm.DescribeEvent(ev))
	}
	if s.FinishTime.Time.Before(kubeletBack) {
		t.Errorf("wait-ready finished at %s, before the kubelet of the new boot reported Ready (heartbeat %s): it trusted the old boot's Ready",
			s.FinishTime.Time.Format(time.RFC3339), kubeletBack.Format(time.RFC3339))
	}
	t.Logf("reboot-1 Succeeded %s after creation; the new boot's kubelet reported Ready (heartbeat %s, seen by the host at +%s), wait-ready done at %s (guest clock)",
		time.Since(rebootStart).Round(time.Second), kubeletBack.Format(time.RFC3339), seenBack.Sub(rebootStart).Round(time.Second), s.FinishTime.Time.Format(time.RFC3339))
	t.Logf("kubelet log after the reboot:\n%s", lastLines(r.v.Journal("kubelet"), 10))
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
