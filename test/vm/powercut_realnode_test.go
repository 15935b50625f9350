package vm_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// TestRealNode's (l), issue 40 item 2: a power cut (QEMU system_reset) in the middle of a
// reboot event's drain, with real pods on the real kubelet.
//
// Three workload pods (a StatefulSet's, bound to vm-node) behind a PDB of
// minAvailable 2: one eviction at a time, the next only once the evicted
// pod is gone and its replacement (on SpareNode) Ready. Each pod keeps
// running cutLinger after SIGTERM (within a cutGrace grace period), so
// after the first eviction the drain is held for that long: one pod
// stopping, two waiting. The power goes then, once the API shows exactly
// that (the event's evict step Running, one pod terminating, two not) and
// the stopping pod's hostPath record has its SIGTERM and no exit yet.
//
// After the boot nothing is helped along: the pod that was stopping is
// still in the API with its deletionTimestamp (nothing in the guest ran to
// finish it) and only the new boot's kubelet can finish it; the other two
// are restarted by that kubelet and evicted by the resumed drain. Then the
// event reboots the node itself (its reboot step had not begun) and ends.
//
// What a user would see, asserted: the kubelet of the boot after the cut
// reported Ready; the agent resumed the event from its journal; the event
// Succeeded (every step Done, driver end RebootComplete); the node
// uncordoned with our annotation gone, after the kubelet of the event's own
// reboot reported Ready; every original pod stopped exactly once (one
// SIGTERM in its record, the two evicted after the cut given their linger,
// the one stopping at the cut never started again and finished by the new
// boot's kubelet) and evicted once (one eviction per pod answered 201 in
// kube-apiserver's audit log); three replacements, none evicted.
//
// The resumed drain once sent a second eviction for the pod that was still
// terminating at the cut (accepted, 201, without effect); the drain now
// waits for a terminating pod instead (test/crash
// TestDrainWaitsForTerminatingPod), and a second eviction fails this test.
//
// The kubelet config of the boot after the cut has graceful node shutdown
// off (kubeadm's default, as in (k)): the event's own reboot does
// not wait out the kubelet's 15 s group period.

const (
	// cutNS is the workload's namespace and name (pods cut-0, cut-1, ...).
	cutNS     = "cut"
	cutEvent  = "cut-drain"
	cutPods   = 3
	cutLinger = 10 * time.Second
	cutGrace  = 30
)

// cutPodSpec is realPodSpec with a cutLinger linger and a cutGrace grace
// period.
func cutPodSpec(node string) corev1.PodSpec {
	s := realPodSpec(node)
	grace := int64(cutGrace)
	s.TerminationGracePeriodSeconds = &grace
	s.Containers[0].Args = []string{"-dir", "/record", "-linger", cutLinger.String()}
	return s
}

// podEvent is one pod watch event (ADDED, MODIFIED, DELETED) as seen.
type podEvent struct {
	at  time.Time
	typ watch.EventType
	pod *corev1.Pod
}

// watchNamespacePods keeps every pod watch event of namespace ns until the
// test ends.
func watchNamespacePods(t *testing.T, c *vm.Cluster, ns string) func() []podEvent {
	t.Helper()
	var mu sync.Mutex
	var evs []podEvent
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			w, err := c.Admin.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
			if err != nil {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok {
					mu.Lock()
					evs = append(evs, podEvent{at: time.Now(), typ: ev.Type, pod: p.DeepCopy()})
					mu.Unlock()
				}
			}
			w.Stop()
		}
	}()
	return func() []podEvent {
		mu.Lock()
		defer mu.Unlock()
		return append([]podEvent(nil), evs...)
	}
}

// podRecords reads the hostPath records of pods with one ssh command (a
// power cut is aimed by them).
func (r *realNode) podRecords(t *testing.T, pods []string) map[string][]recordLine {
	t.Helper()
	out := r.v.MustRun("cd " + recordDir + " && for p in " + strings.Join(pods, " ") + "; do echo \"== $p\"; cat $p.log 2>/dev/null; done")
	recs := map[string][]recordLine{}
	pod := ""
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "==":
			pod = f[1]
		case len(f) >= 2 && pod != "":
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("pod %s record line %q: %v", pod, line, err)
			}
			recs[pod] = append(recs[pod], recordLine{what: f[0], at: time.Unix(0, ns)})
		}
	}
	return recs
}

func count(lines []recordLine, what string) int {
	n := 0
	for _, l := range lines {
		if l.what == what {
			n++
		}
	}
	return n
}

func describeRecord(lines []recordLine) string {
	var s []string
	for _, l := range lines {
		s = append(s, l.what+"@"+l.at.Format("15:04:05.000"))
	}
	return strings.Join(s, " ")
}

// realNodePowerCutMidDrain is TestRealNode's (l).
func realNodePowerCutMidDrain(t *testing.T, r *realNode) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Graceful node shutdown off for the kubelets of the boots to come
	// (this one's is cut off anyway); synced, so the cut keeps it.
	r.v.MustRun("sed -i -e 's/^shutdownGracePeriod: .*/shutdownGracePeriod: 0s/' -e 's/^shutdownGracePeriodCriticalPods: .*/shutdownGracePeriodCriticalPods: 0s/' /var/lib/kubelet/config.yaml && grep -q '^shutdownGracePeriod: 0s' /var/lib/kubelet/config.yaml && sync")

	// 1. Three real pods behind a PDB allowing one disruption at a time.
	w := &testenv.Workload{Namespace: cutNS, Name: cutNS, Node: vm.NodeName, Spare: vm.SpareNode, Replicas: cutPods, MinAvailable: cutPods - 1, PodSpec: cutPodSpec}
	if err := w.Start(ctx, r.c.Env.AdminConfig()); err != nil {
		t.Fatalf("workload: %v", err)
	}
	var orig []string
	for i := 0; i < cutPods; i++ {
		orig = append(orig, fmt.Sprintf(cutNS+"-%d", i))
	}
	pods := watchNamespacePods(t, r.c, cutNS)
	podsStart := time.Now()
	r.waitPodsReady(t, cutNS, orig, 4*time.Minute)
	vm.Timings.Record("real kubelet: 3 pods created → Ready", time.Since(podsStart))
	// The PDB's status (kube-controller-manager) allows one disruption.
	vm.Eventually(t, time.Minute, "the PDB allowing 1 disruption", func() (bool, string) {
		p, err := r.c.Admin.PolicyV1().PodDisruptionBudgets(cutNS).Get(ctx, cutNS, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Status.DisruptionsAllowed == 1 && p.Status.CurrentHealthy == cutPods, fmt.Sprintf("%+v", p.Status)
	})

	// 2. The reboot event; its drain evicts one pod, which stops for
	// cutLinger while the PDB holds the other two.
	boot1 := r.v.BootID()
	start := time.Now()
	r.c.CreateEvent(t, cutEvent, transitionReboot, nil)
	msgs := eventMessages(t, r.c, cutEvent)
	var victim string
	var waiting []string
	var atCut map[string][]recordLine
	var evAtCut *v1alpha1.LifecycleEvent
	vm.Eventually(t, 3*time.Minute, "the drain under way: evict Running, one pod stopping (SIGTERM recorded, no exit), the others not evicted", func() (bool, string) {
		e := r.c.Event(t, cutEvent)
		if e.Status.ClaimStatus.Finished() {
			t.Fatalf("event %s ended before the cut: %s", cutEvent, vm.DescribeEvent(e))
		}
		if s := vm.Step(e, "evict"); s == nil || s.State != v1alpha1.StepRunning {
			return false, vm.DescribeEvent(e)
		}
		l, err := r.c.Admin.CoreV1().Pods(cutNS).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + vm.NodeName})
		if err != nil {
			return false, err.Error()
		}
		var stopping, others, states []string
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				stopping = append(stopping, p.Name)
			} else {
				others = append(others, p.Name)
			}
			states = append(states, fmt.Sprintf("%s deleting=%v", p.Name, p.DeletionTimestamp != nil))
		}
		if len(stopping) != 1 || len(others) != cutPods-1 {
			return false, strings.Join(states, ", ")
		}
		recs := r.podRecords(t, orig)
		if rec := recs[stopping[0]]; count(rec, "sigterm") == 0 || count(rec, "exit") > 0 {
			return false, stopping[0] + " record: " + describeRecord(rec)
		}
		victim, waiting, evAtCut, atCut = stopping[0], others, e, recs
		return true, ""
	}, func() string {
		out, _, _, _ := r.v.Try("journalctl --no-pager -n 20 -u " + vm.Unit)
		return out
	})

	// 3. The power cut.
	cutAt := time.Now()
	t.Logf("cut at +%s: %s stopping (record %s), %v waiting; event %s, message %q", cutAt.Sub(start).Round(10*time.Millisecond),
		victim, describeRecord(atCut[victim]), waiting, vm.DescribeEvent(evAtCut), evAtCut.Status.Message)
	boot2 := r.v.HardReset()
	upAt := time.Now()
	bootsAfterCut := r.v.Boots()
	if boot2 == boot1 {
		t.Fatalf("boot ID unchanged after the power cut: %s", boot2)
	}
	back := r.c.NodeObject(t)
	ready := vm.NodeCondition(back, string(corev1.NodeReady))
	t.Logf("the guest is back at +%s (boot %s): the Node shows bootID %s, Ready %s/%s; cordoned by us: %v",
		upAt.Sub(start).Round(time.Second), boot2, back.Status.NodeInfo.BootID, ready.Status, ready.Reason, vm.Cordoned(back))
	if !vm.Cordoned(back) {
		t.Errorf("after the power cut mid-drain the node is not cordoned by the agent: unschedulable=%v annotations=%v", back.Spec.Unschedulable, back.Annotations)
	}
	if e := r.c.Event(t, cutEvent); e.Status.ClaimStatus.Finished() {
		t.Fatalf("event %s ended by the power cut: %s", cutEvent, vm.DescribeEvent(e))
	}

	// 4. The resumed event: the drain finishes on the new boot's kubelet,
	// then the event's own reboot.
	r.c.WaitEvent(t, cutEvent, 5*time.Minute, "the reboot step (the drain done)", func(e *v1alpha1.LifecycleEvent) bool {
		if e.Status.ClaimStatus.Finished() {
			return true
		}
		s := vm.Step(e, "reboot")
		return s != nil && s.State != v1alpha1.StepPending
	})
	if e := r.c.Event(t, cutEvent); e.Status.ClaimStatus.Finished() {
		t.Fatalf("event %s ended before its reboot: %s", cutEvent, vm.DescribeEvent(e))
	}
	rebootAt := time.Now()
	boot3 := r.v.WaitBoot(bootsAfterCut)
	if boot3 == boot2 {
		t.Fatalf("boot ID unchanged after the event's reboot: %s", boot3)
	}
	ev := r.checkSucceeded(t, cutEvent)
	took := time.Since(start)
	vm.Timings.Record("real kubelet: reboot event cut mid-drain (cut, drain resumed, reboot, uncordon)", took)
	if got := r.v.Boots(); got != bootsAfterCut+1 {
		t.Errorf("%d boots after the cut, want 1 (the event's reboot)", got-bootsAfterCut)
	}

	// 5. The kubelet of the boot after the cut recovered; the agent resumed
	// the event from its journal; the node was given back after the kubelet
	// of the event's reboot reported Ready.
	ready2 := r.rec.FirstSeen(func(n *corev1.Node) bool {
		return apiclient.ReadyInBoot(n, boot2) && n.Status.NodeInfo.BootID == boot2
	})
	ready3 := r.rec.FirstSeen(func(n *corev1.Node) bool {
		return apiclient.ReadyInBoot(n, boot3) && n.Status.NodeInfo.BootID == boot3
	})
	cordoned := false
	uncordoned := r.rec.FirstSeen(func(n *corev1.Node) bool {
		if vm.Cordoned(n) {
			cordoned = true
		}
		return cordoned && !n.Spec.Unschedulable
	})
	if ready2.IsZero() {
		t.Errorf("the kubelet of the boot after the power cut (%s) never reported Ready", boot2)
	}
	switch {
	case ready3.IsZero():
		t.Errorf("the kubelet of the event's reboot (%s) never reported Ready", boot3)
	case uncordoned.IsZero():
		t.Errorf("never saw vm-node cordoned and then schedulable again:\n%s", r.rec.Describe())
	case uncordoned.Before(ready3):
		t.Errorf("uncordoned at %s, before the kubelet of the new boot reported Ready (%s)", rel(uncordoned, start), rel(ready3, start))
	}
	agentLog := r.v.JournalBoot(vm.Unit, -1)
	if !strings.Contains(agentLog, "resuming event from the journal") || !strings.Contains(agentLog, cutEvent) {
		t.Errorf("the agent's log of the boot after the cut does not say it resumed %s from its journal:\n%s", cutEvent, lastLines(agentLog, 30))
	}

	// 6. Every original pod stopped exactly once. The records hold every
	// boot's lines (fsynced): those after the snapshot at the cut are the
	// boot's after it.
	for _, p := range orig {
		all := r.podRecordLines(t, p)
		if len(all) < len(atCut[p]) {
			t.Errorf("pod %s: record shrank across the cut: %s, then %s", p, describeRecord(atCut[p]), describeRecord(all))
			continue
		}
		after := all[len(atCut[p]):]
		t.Logf("pod %s: before the cut %s; after it %s", p, describeRecord(atCut[p]), describeRecord(after))
		if n := count(all, "sigterm"); n != 1 {
			t.Errorf("pod %s got SIGTERM %d times (record %s): want exactly once", p, n, describeRecord(all))
		}
		if p == victim {
			if n := count(after, "start"); n > 0 {
				t.Errorf("pod %s, stopping at the cut, was started again after it: %s", p, describeRecord(after))
			}
			continue
		}
		var sigterm, exit time.Time
		for _, l := range after {
			switch l.what {
			case "sigterm":
				sigterm = l.at
			case "exit":
				exit = l.at
			}
		}
		switch {
		case count(after, "start") != 1:
			t.Errorf("pod %s: %d starts after the cut, want 1 (the new boot's kubelet restarting it): %s", p, count(after, "start"), describeRecord(after))
		case sigterm.IsZero() || exit.IsZero():
			t.Errorf("pod %s: no SIGTERM and exit after the cut: %s", p, describeRecord(after))
		case exit.Sub(sigterm) < cutLinger:
			t.Errorf("pod %s exited %s after SIGTERM; it lingers %s within a %ds grace period: killed early", p, exit.Sub(sigterm), cutLinger, cutGrace)
		}
	}

	// ... and was evicted by one eviction the API server accepted (201),
	// none of a replacement. One exception is reported and not failed: the
	// pod stopping at the cut evicted again by the resumed drain while it
	// was still terminating. The API server accepts the eviction of a
	// terminating pod without asking its budget and changes nothing (no
	// second SIGTERM: asserted above), so no workload notices; it is an
	// agent issue all the same (docs/shutdown.md), to be made an error here
	// once the drain leaves terminating pods alone.
	accepted := map[string][]time.Time{}
	refused := map[string]int{}
	var other, deleted []string
	var victimGone time.Time
	for _, q := range r.c.PodRequests(t, cutNS) {
		switch {
		case q.Subresource == "eviction" && q.Code == 201:
			accepted[q.Pod] = append(accepted[q.Pod], q.At)
		case q.Subresource == "eviction" && q.Code == 429:
			refused[q.Pod]++
		case q.Subresource == "eviction":
			other = append(other, fmt.Sprintf("%s %d at %s", q.Pod, q.Code, rel(q.At, start)))
		case q.Verb == "delete" && q.Subresource == "":
			deleted = append(deleted, fmt.Sprintf("%s by %s (%d) at %s", q.Pod, q.User, q.Code, rel(q.At, start)))
			if q.Pod == victim && q.User == "system:node:"+vm.NodeName && q.Code == 200 {
				victimGone = q.At
			}
		}
	}
	var again []string
	for _, p := range orig {
		acc := accepted[p]
		var at []string
		for _, a := range acc {
			at = append(at, rel(a, start))
		}
		t.Logf("pod %s: evictions accepted at %v, refused (429) %d times", p, at, refused[p])
		switch {
		case len(acc) == 0:
			t.Errorf("pod %s: no eviction accepted", p)
			continue
		case p == victim && !acc[0].Before(cutAt):
			t.Errorf("pod %s, stopping at the cut, evicted at %s, after the cut (%s)", p, at[0], rel(cutAt, start))
		case p != victim && acc[0].Before(upAt):
			t.Errorf("pod %s, waiting at the cut, evicted at %s, before the guest was back (%s)", p, at[0], rel(upAt, start))
		}
		for i, a := range acc[1:] {
			if p == victim && a.After(cutAt) && (victimGone.IsZero() || a.Before(victimGone)) {
				again = append(again, p+" at "+at[i+1])
			}
			t.Errorf("pod %s evicted again at %s (accepted at %v): want once", p, at[i+1], at)
		}
	}
	if len(again) > 0 {
		t.Errorf("the resumed drain evicted %v again while it was still terminating from its eviction before the cut", again)
	}
	if victimGone.Before(upAt) {
		t.Errorf("pod %s, stopping at the cut, was not finished (deleted) by the kubelet after the cut (deleted at %s; guest back at %s)", victim, sinceOr(victimGone, start), rel(upAt, start))
	}
	for p := range accepted {
		if !slices.Contains(orig, p) {
			t.Errorf("pod %s evicted: not one of vm-node's pods", p)
		}
	}
	if len(other) > 0 {
		t.Logf("eviction requests answered otherwise: %v", other)
	}
	t.Logf("pod deletions (audit): %v", deleted)
	if got := w.Replaced(); got != cutPods {
		t.Errorf("%d replacements on %s, want %d", got, vm.SpareNode, cutPods)
	}
	if l, err := r.c.Admin.CoreV1().Pods(cutNS).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + vm.NodeName}); err != nil || len(l.Items) != 0 {
		t.Errorf("pods left on vm-node after the event: %v %v", err, l)
	}

	// 7. The order of events (host clock, from the event's creation).
	gone := map[string]time.Time{}
	for _, e := range pods() {
		if e.typ == watch.Deleted && slices.Contains(orig, e.pod.Name) {
			gone[e.pod.Name] = e.at
		}
	}
	type moment struct {
		at   time.Time
		what string
	}
	var tl []moment
	add := func(at time.Time, what string) {
		if !at.IsZero() {
			tl = append(tl, moment{at, what})
		}
	}
	for p, ats := range accepted {
		for _, a := range ats {
			add(a, "eviction of "+p+" accepted")
		}
	}
	for p, at := range gone {
		add(at, p+" deleted")
	}
	add(cutAt, "power cut (system_reset)")
	add(upAt, "guest back (ssh), boot "+boot2[:8])
	add(ready2, "kubelet Ready in boot "+boot2[:8])
	add(rebootAt, "event's reboot step seen")
	add(ready3, "kubelet Ready in boot "+boot3[:8])
	add(uncordoned, "uncordoned")
	if ev.Status.CompletionTime != nil {
		t.Logf("event completionTime %s (guest clock)", ev.Status.CompletionTime.Format(time.RFC3339))
	}
	sort.Slice(tl, func(i, j int) bool { return tl[i].at.Before(tl[j].at) })
	var tb strings.Builder
	for _, m := range tl {
		fmt.Fprintf(&tb, "  %-10s %s\n", rel(m.at, start), m.what)
	}
	t.Logf("order of events (host clock, from the event's creation):\n%s", tb.String())
	var mb strings.Builder
	for _, m := range msgs() {
		fmt.Fprintf(&mb, "  +%s [%s] %s\n", m.at.Sub(start).Round(10*time.Millisecond), m.step, m.msg)
	}
	t.Logf("the event's status.message (polled, host clock):\n%s", mb.String())
	var steps []string
	for _, s := range ev.Status.Steps {
		steps = append(steps, fmt.Sprintf("%s=%s(attempt %d)", s.Name, s.State, s.Attempt))
	}
	t.Logf("%s Succeeded %s after creation; steps %s", cutEvent, took.Round(time.Second), strings.Join(steps, " "))
	if t.Failed() {
		t.Logf("agent log of the boot after the cut:\n%s", lastLines(agentLog, 60))
	}
}
