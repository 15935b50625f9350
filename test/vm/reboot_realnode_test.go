package vm_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// TestRealNode's (k), issue 40 item 3 and issue 41 item 4: a reboot event
// on a real node with real pods and a DaemonSet pod whose readiness lags
// the kubelet's Ready.
//
// The test cluster runs no scheduler and no DaemonSet controller
// (kube-controller-manager --controllers in test/testenv). So:
//   - the workload is testenv.Workload: a StatefulSet object and two pods
//     bound to vm-node (spec.nodeName, the real kubelet runs them); the
//     drain's evictions are replaced on SpareNode (a stand-in), as a
//     scheduler would place them;
//   - the DaemonSet is an apps/v1 DaemonSet object and one pod bound to
//     vm-node owned by it (controller: true), as the DaemonSet controller
//     would create it. The drain leaves it (a DaemonSet pod), the reboot
//     kills its container, the new boot's kubelet starts it again;
//   - "pods run on vm-node again" means: pods bound to vm-node after the
//     uncordon run and turn Ready on the new boot's kubelet, and the
//     DaemonSet pod runs a new container.
//
// The DaemonSet pod's readiness probe (exec /workload -h, exit 0) starts
// dsReadyDelay after its container: after the reboot it is Ready that long
// after the kubelet started it, so later than the Node's Ready. The agent's
// wait-workloads-ready must hold the cordon until it is.
//
// The kubelet runs with graceful node shutdown off and starts kubeletLate
// after the agent in the new boot: the Node still
// shows the old boot's Ready=True when the guest is back, which the test
// checks, so wait-ready has to tell the boots apart.
//
// Measured under TCG (2 cores), alone, two runs: 4m34s and 4m32s (the
// reboot event 1m58s and 1m52s: the new boot's kubelet Ready at +1m31s and
// +1m26s, the DaemonSet pod Ready again 24-26 s later, the uncordon
// 0.6-1 s after that). Both runs saw the old boot's Ready=True when the
// guest was back, and the kubelet post the pod's Ready=False in the same
// moment as the Node's new-boot Ready.

const (
	dsName       = "node-agent"
	dsPod        = "node-agent-vm-node"
	dsReadyDelay = 15 * time.Second
)

// podSnap is one version of a pod as a watch saw it.
type podSnap struct {
	at  time.Time
	pod *corev1.Pod
}

// watchPod keeps every version of pod ns/name until the test ends.
func watchPod(t *testing.T, c *vm.Cluster, ns, name string) func() []podSnap {
	t.Helper()
	var mu sync.Mutex
	var snaps []podSnap
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	go func() {
		for ctx.Err() == nil {
			w, err := c.Admin.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					mu.Lock()
					snaps = append(snaps, podSnap{at: time.Now(), pod: p.DeepCopy()})
					mu.Unlock()
				}
			}
			w.Stop()
		}
	}()
	return func() []podSnap {
		mu.Lock()
		defer mu.Unlock()
		return append([]podSnap(nil), snaps...)
	}
}

// eventMessages polls the event's status.message every 200 ms and keeps
// each distinct one with when it was first seen, until the test ends.
func eventMessages(t *testing.T, c *vm.Cluster, name string) func() []podMsg {
	t.Helper()
	var mu sync.Mutex
	var msgs []podMsg
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		last := ""
		for ctx.Err() == nil {
			gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
			e, err := c.Lifecycle.Events.Get(gctx, name, metav1.GetOptions{})
			gcancel()
			if err == nil && e.Status.Message != last {
				last = e.Status.Message
				mu.Lock()
				msgs = append(msgs, podMsg{at: time.Now(), step: e.Status.CurrentStep, msg: last})
				mu.Unlock()
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return func() []podMsg {
		mu.Lock()
		defer mu.Unlock()
		return append([]podMsg(nil), msgs...)
	}
}

type podMsg struct {
	at        time.Time
	step, msg string
}

func podIsReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerID(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	return p.Status.ContainerStatuses[0].ContainerID
}

func describePod(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s", c.Type, c.Status)
	}
	for _, s := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, " container=%s ready=%v restarts=%d", s.ContainerID, s.Ready, s.RestartCount)
	}
	return b.String()
}

// waitPodsReady waits until the pods ns/names are Running and Ready.
func (r *realNode) waitPodsReady(t *testing.T, ns string, names []string, timeout time.Duration) {
	t.Helper()
	vm.Eventually(t, timeout, fmt.Sprintf("pods %v Running and Ready on vm-node", names), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var states []string
		ok := true
		for _, n := range names {
			p, err := r.c.Admin.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			ok = ok && podIsReady(p) && p.Spec.NodeName == vm.NodeName
			states = append(states, n+": "+describePod(p))
		}
		return ok, strings.Join(states, "; ")
	}, func() string {
		out, _, _, _ := r.v.Try("journalctl --no-pager -n 30 -u kubelet -u containerd")
		return out
	})
}

// realNodeRebootWithPods is TestRealNode's (k).
func realNodeRebootWithPods(t *testing.T, r *realNode) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Graceful node shutdown off (kubeadm's default): the kubelet leaves
	// the Node's Ready=True and the pods' status as they are at the
	// reboot. The kubelet of the new boot starts kubeletLate after the
	// agent.
	r.setKubeletShutdownGrace(t, 0, 0)
	r.v.WriteFile("/etc/systemd/system/kubelet.service.d/late.conf",
		[]byte(fmt.Sprintf("[Service]\nExecStartPre=/bin/sleep %d\n", int(kubeletLate.Seconds()))), 0o644)
	r.v.MustRun("systemctl daemon-reload")

	// 1. Two workload pods (a StatefulSet's, bound to vm-node) and the
	// DaemonSet pod.
	w := &testenv.Workload{Namespace: "apps", Name: "app", Node: vm.NodeName, Spare: vm.SpareNode, Replicas: 2, PodSpec: realPodSpec}
	if err := w.Start(ctx, r.c.Env.AdminConfig()); err != nil {
		t.Fatalf("workload: %v", err)
	}
	dsLabels := map[string]string{"app": dsName}
	dsSpec := realPodSpec(vm.NodeName)
	dsSpec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:        corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/workload", "-h"}}},
		InitialDelaySeconds: int32(dsReadyDelay.Seconds()), PeriodSeconds: 2, TimeoutSeconds: 10, FailureThreshold: 1,
	}
	// The tolerations the DaemonSet controller adds to its pods.
	for _, k := range []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"} {
		dsSpec.Tolerations = append(dsSpec.Tolerations, corev1.Toleration{Key: k, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	}
	dsSpec.Tolerations = append(dsSpec.Tolerations, corev1.Toleration{Key: "node.kubernetes.io/unschedulable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	ds, err := r.c.Admin.AppsV1().DaemonSets("default").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: dsName, Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: dsLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: dsLabels}, Spec: dsSpec}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create DaemonSet: %v", err)
	}
	podSpec := dsSpec
	podSpec.NodeName = vm.NodeName
	yes := true
	if _, err := r.c.Admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: dsPod, Namespace: "default", Labels: dsLabels, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}}},
		Spec: podSpec,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the DaemonSet's pod: %v", err)
	}
	dsHistory := watchPod(t, r.c, "default", dsPod)
	podsStart := time.Now()
	r.waitPodsReady(t, "apps", []string{"app-0", "app-1"}, 4*time.Minute)
	r.waitPodsReady(t, "default", []string{dsPod}, 4*time.Minute)
	vm.Timings.Record("real kubelet: 2 pods and a DaemonSet pod created → Ready", time.Since(podsStart))
	before, err := r.c.Admin.CoreV1().Pods("default").Get(ctx, dsPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldContainer := containerID(before)
	t.Logf("before the reboot: %s %s (uid %s)", dsPod, describePod(before), before.UID)

	// 2. The reboot event (drain: the default).
	const evName = "reboot-pods"
	boots := r.v.Boots()
	oldBoot := r.v.BootID()
	rebootStart := time.Now()
	r.c.CreateEvent(t, evName, transitionReboot, nil)
	msgs := eventMessages(t, r.c, evName)
	newBoot := r.v.WaitBoot(boots)
	if newBoot == oldBoot {
		t.Fatalf("boot ID unchanged: %s", newBoot)
	}
	// The precondition: the guest is back, and the Node still shows the
	// old boot's Ready=True.
	back := r.c.NodeObject(t)
	backReady := vm.NodeCondition(back, string(corev1.NodeReady))
	oldReadyShown := back.Status.NodeInfo.BootID == oldBoot && backReady != nil && backReady.Status == corev1.ConditionTrue
	agentUp, _ := r.v.Run("systemctl is-active " + vm.Unit)
	t.Logf("the guest is back at +%s (boot %s, agent %s): the Node shows bootID %s, Ready %+v; old boot's Ready=True shown: %v",
		time.Since(rebootStart).Round(time.Second), newBoot, strings.TrimSpace(agentUp), back.Status.NodeInfo.BootID, backReady, oldReadyShown)
	if !oldReadyShown {
		t.Errorf("when the guest was back the Node did not show the old boot's (%s) Ready=True (bootID %s, Ready %+v): the boot-ID wait was not put to the test",
			oldBoot, back.Status.NodeInfo.BootID, backReady)
	}

	// 3. Succeeded, with wait-workloads-ready between wait-ready and the
	// uncordon.
	ev := r.checkSucceeded(t, evName)
	took := time.Since(rebootStart)
	vm.Timings.Record("real kubelet: reboot event with a late DaemonSet pod (drain, reboot, wait-ready, wait-workloads-ready, uncordon)", took)
	var steps []string
	for _, s := range ev.Status.Steps {
		steps = append(steps, s.Name+"="+string(s.State))
	}
	stepList := strings.Join(steps, ",")
	if !strings.Contains(stepList, "wait-ready=Done,wait-workloads-ready=Done,uncordon=Done") {
		t.Errorf("steps %s: want wait-ready=Done,wait-workloads-ready=Done,uncordon=Done in that order", stepList)
	}
	// wait-ready ended after the kubelet of the new boot reported Ready:
	// both times from the guest's clock (the kubelet's heartbeat, the
	// agent's step time), whole seconds; the host's clock can be off from
	// the guest's under TCG.
	var kubeletBack time.Time
	r.rec.FirstSeen(func(n *corev1.Node) bool {
		if apiclient.ReadyInBoot(n, newBoot) && n.Status.NodeInfo.BootID == newBoot {
			kubeletBack = vm.NodeCondition(n, string(corev1.NodeReady)).LastHeartbeatTime.Time
			return true
		}
		return false
	})
	switch s := vm.Step(ev, "wait-ready"); {
	case kubeletBack.IsZero():
		t.Errorf("never saw the kubelet of boot %s report Ready:\n%s", newBoot, r.rec.Describe())
	case s == nil || s.FinishTime == nil:
		t.Errorf("no finished wait-ready step: %s", vm.DescribeEvent(ev))
	case s.FinishTime.Time.Before(kubeletBack):
		t.Errorf("wait-ready finished at %s, before the kubelet of the new boot reported Ready (heartbeat %s): it trusted the old boot's Ready",
			s.FinishTime.Time.Format(time.RFC3339), kubeletBack.Format(time.RFC3339))
	default:
		t.Logf("the new boot's kubelet reported Ready (heartbeat %s), wait-ready done at %s (guest clock)", kubeletBack.Format(time.RFC3339), s.FinishTime.Time.Format(time.RFC3339))
	}

	// When the Node was given back (host clock, from the watch).
	cordoned := false
	uncordoned := r.rec.FirstSeen(func(n *corev1.Node) bool {
		if n.Spec.Unschedulable {
			cordoned = true
		}
		return cordoned && !n.Spec.Unschedulable
	})
	newReady := r.rec.FirstSeen(func(n *corev1.Node) bool {
		return apiclient.ReadyInBoot(n, newBoot) && n.Status.NodeInfo.BootID == newBoot
	})
	if uncordoned.IsZero() {
		t.Fatalf("never saw vm-node cordoned and then schedulable again:\n%s", r.rec.Describe())
	}
	// When the DaemonSet pod of the new boot was Ready: a new container,
	// Ready=True.
	var dsBack time.Time
	var dsBackPod *corev1.Pod
	var hist strings.Builder
	for _, s := range dsHistory() {
		if s.at.Before(rebootStart) {
			continue
		}
		fmt.Fprintf(&hist, "  +%s %s\n", s.at.Sub(rebootStart).Round(10*time.Millisecond), describePod(s.pod))
		if dsBack.IsZero() && podIsReady(s.pod) && containerID(s.pod) != "" && containerID(s.pod) != oldContainer {
			dsBack, dsBackPod = s.at, s.pod
		}
	}
	t.Logf("the DaemonSet pod from the event's creation (host clock):\n%s", hist.String())
	// The stale Ready=True of the old boot's container stays on the pod
	// until the new boot's kubelet posts the pod's status; how long after
	// the Node's new-boot Ready it did (a window in which a check that
	// trusts the pod's Ready alone would pass).
	for _, s := range dsHistory() {
		if s.at.After(rebootStart) && !podIsReady(s.pod) {
			if !newReady.IsZero() {
				t.Logf("the kubelet posted the DaemonSet pod not Ready %s after the Node's new-boot Ready (host clock, watch)", s.at.Sub(newReady).Round(time.Millisecond))
			}
			break
		}
	}
	var mb strings.Builder
	named := false
	want := "DaemonSet default/" + dsName + " has no Ready pod on the node"
	for _, m := range msgs() {
		fmt.Fprintf(&mb, "  +%s [%s] %s\n", m.at.Sub(rebootStart).Round(10*time.Millisecond), m.step, m.msg)
		if strings.Contains(m.msg, want) {
			named = true
		}
	}
	t.Logf("the event's status.message (polled, host clock):\n%s", mb.String())
	t.Logf("host clock from the event's creation: new boot's kubelet Ready %s, DaemonSet pod Ready in the new boot %s, uncordoned %s; event Succeeded after %s",
		sinceOr(newReady, rebootStart), sinceOr(dsBack, rebootStart), sinceOr(uncordoned, rebootStart), took.Round(time.Second))
	switch {
	case dsBack.IsZero():
		t.Errorf("the DaemonSet pod was never seen Ready with a new container after the reboot (old container %s)", oldContainer)
	case !dsBack.Before(uncordoned):
		t.Errorf("the node was uncordoned at %s, before the DaemonSet pod was Ready again (%s): wait-workloads-ready did not wait for it",
			rel(uncordoned, rebootStart), rel(dsBack, rebootStart))
	default:
		if c := podReadyCondition(dsBackPod); c != nil {
			t.Logf("the DaemonSet pod's Ready lastTransitionTime %s (guest clock)", c.LastTransitionTime.Format(time.RFC3339))
		}
	}
	if !newReady.IsZero() && !dsBack.IsZero() && dsBack.Sub(newReady) < 5*time.Second {
		t.Logf("note: the DaemonSet pod was Ready only %s after the Node's new-boot Ready", dsBack.Sub(newReady).Round(100*time.Millisecond))
	}
	if !named {
		t.Errorf("the event's status.message never said %q during the wait", want)
	}
	if p, err := r.c.Admin.CoreV1().Pods("default").Get(ctx, dsPod, metav1.GetOptions{}); err != nil || p.UID != before.UID {
		t.Errorf("the DaemonSet pod after the reboot: %v (uid want %s): the drain must leave a DaemonSet's pod", err, before.UID)
	}

	// 4. The node takes pods again: pods bound to it after the uncordon run
	// on the new boot's kubelet.
	if got := w.Replaced(); got != 2 {
		t.Errorf("%d replacements on %s after the drain, want 2", got, vm.SpareNode)
	}
	var again []string
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("after-%d", i)
		spec := realPodSpec(vm.NodeName)
		spec.NodeName = vm.NodeName
		if _, err := r.c.Admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: spec}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		again = append(again, name)
	}
	againStart := time.Now()
	r.waitPodsReady(t, "default", again, 3*time.Minute)
	vm.Timings.Record("real kubelet: 2 pods after the uncordon → Ready", time.Since(againStart))
	for _, p := range again {
		if l := r.podRecord(t, p); l.start.IsZero() {
			t.Errorf("pod %s: no start recorded on the node", p)
		}
	}
	t.Logf("after the uncordon: pods %v Ready on vm-node in %s; steps %s", again, time.Since(againStart).Round(time.Second), stepList)
	if t.Failed() {
		t.Logf("agent log (this boot):\n%s", lastLines(grepLines(r.v.Journal(vm.Unit), "readiness")+"\n"+lastLines(r.v.Journal(vm.Unit), 30), 50))
		return
	}

	// The node as the next scenario expects it: no bare pod (a drain
	// would refuse it), no DaemonSet whose late pod every reboot would
	// wait for, the kubelet starting with the boot.
	r.deletePods(t, "default", append(again, dsPod)...)
	if err := r.c.Admin.AppsV1().DaemonSets("default").Delete(ctx, dsName, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete DaemonSet: %v", err)
	}
	r.v.MustRun("rm -f /etc/systemd/system/kubelet.service.d/late.conf && systemctl daemon-reload")
}

func podReadyCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodReady {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
