package plugin

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

const (
	rolloutLabel = "lifecycle.x-k8s.io/rollout"
	// leaseEventAnnotation on a slot lease names the event holding it.
	leaseEventAnnotation = "lifecycle.x-k8s.io/event"
)

var runningRE = regexp.MustCompile(`running (\d+), waiting`)

// TestDrainRebootUncordon is the maintenance of one node through the
// plugin's shorthands: drain, reboot, uncordon, each exit 0, each step
// reported; the node ends schedulable, and the reboot shows as a new boot
// ID. Also: a driver the node does not offer is a usage error (2) naming
// what it offers; a bad parameter fails the event (1) with the driver's
// reason; run without --wait prints the name, cancel --wait removes it.
func TestDrainRebootUncordon(t *testing.T) {
	const node = "flow-1"
	startNodes(t, node)
	addPods(t, "flow", node, 2)

	r := plugin(t, 30*time.Second, "transitions", node)
	wantExit(t, r, 0, "transitions")
	wantContains(t, r.stdout, node+"-drain", "transitions")
	wantContains(t, r.stdout, "lifecycle-agent.x-k8s.io/uncordon", "transitions")

	r = plugin(t, 30*time.Second, "run", "no-such-driver", node)
	wantExit(t, r, 2, "run of a driver the node does not offer")
	wantContains(t, r.stderr, "node flow-1 has no transition flow-1-no-such-driver; it offers: drain (flow-1-drain)", "run no-such-driver")

	r = plugin(t, 60*time.Second, "run", "drain", node, "--param", "gracePeriodSeconds=soon", "--wait")
	wantExit(t, r, 1, "drain with a bad parameter")
	wantContains(t, r.stderr, "gracePeriodSeconds", "drain with a bad parameter")

	// drain
	r = plugin(t, 90*time.Second, "drain", node)
	wantExit(t, r, 0, "drain")
	for _, step := range []string{"step cordon", "step evict", "step wait-empty", "Succeeded in"} {
		wantContains(t, r.stdout, step, "drain output")
	}
	n := getNode(t, node)
	if !n.Spec.Unschedulable {
		t.Fatalf("after drain: node %s is schedulable", node)
	}
	if left := podsOn(t, node); len(left) > 0 {
		t.Fatalf("after drain: pods left on %s: %v", node, left)
	}
	if c := nodeCondition(n, v1alpha1.NodeConditionDrained); c == nil || c.Status != corev1.ConditionTrue {
		t.Errorf("after drain: Node condition Drained = %+v, want True", c)
	}
	drainEv := lastSucceeded(t, node, node+"-drain")
	r = plugin(t, 30*time.Second, "status", drainEv.Name)
	wantExit(t, r, 0, "status EVENT")
	for _, s := range []string{"Succeeded", "cordon", "evict", "wait-empty", "Progressing", "LifecycleTransition", "Drained", "cordoned by lifecycle-agent for " + drainEv.Name} {
		wantContains(t, r.stdout, s, "status EVENT")
	}

	// reboot (driver lifecycle-agent.x-k8s.io/reboot; simulated: the boot ID changes)
	rebooted := false
	// The agent publishes its transitions one by one (startNodes waits for
	// the uncordon's): a create retried under load comes a resync later.
	var terr error
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, terr = lc.Transitions.Get(context.Background(), node+"-reboot", metav1.GetOptions{}); terr == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if terr != nil {
		t.Errorf("the agent publishes no %s-reboot transition (%v): the reboot driver is not enabled in lifecycle-agent yet; reboot part not run", node, terr)
	} else {
		r = plugin(t, 120*time.Second, "reboot", node)
		wantExit(t, r, 0, "reboot")
		wantContains(t, r.stdout, "step reboot", "reboot output")
		rebooted = true
		// The reboot's drain found the drain event's cordon and left it:
		// the node is still cordoned, and still Drained (it said
		// ReturnedToService, "back in service", before 4bb8cb5).
		n := getNode(t, node)
		if c := nodeCondition(n, v1alpha1.NodeConditionDrained); !n.Spec.Unschedulable || c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("after the reboot: unschedulable %v, Drained %+v; want the drain event's cordon kept and Drained=True", n.Spec.Unschedulable, c)
		}
	}

	// uncordon
	r = plugin(t, 60*time.Second, "uncordon", node)
	wantExit(t, r, 0, "uncordon")
	wantContains(t, r.stdout, "step uncordon", "uncordon output")
	n = getNode(t, node)
	if n.Spec.Unschedulable {
		t.Errorf("after uncordon: node %s is still cordoned", node)
	}
	if by, ok := n.Annotations[v1alpha1.AnnotationCordonedBy]; ok {
		t.Errorf("after uncordon: annotation %s=%s left", v1alpha1.AnnotationCordonedBy, by)
	}
	if rebooted {
		unc := lastSucceeded(t, node, node+"-uncordon")
		if drainEv.Status.Holder == nil || unc.Status.Holder == nil || drainEv.Status.Holder.BootID == "" ||
			drainEv.Status.Holder.BootID == unc.Status.Holder.BootID {
			t.Errorf("boot ID did not change across the reboot: drain claimed in boot %+v, uncordon in boot %+v", drainEv.Status.Holder, unc.Status.Holder)
		}
	}

	r = plugin(t, 30*time.Second, "history", node)
	wantExit(t, r, 0, "history")
	wantContains(t, r.stdout, "COMPLETED", "history")
	if got := strings.Count(r.stdout, "Succeeded"); got < 2 {
		t.Errorf("history: %d Succeeded events, want at least 2 (drain, uncordon)", got)
	}
	wantContains(t, r.stdout, "Failed", "history (the bad-parameter drain)")

	// -o name, as the help advertises, on each listing command: one
	// kind/name line per object (it failed on every list before).
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", node, "-o", "name"}, "lifecycleevent.lifecycle.x-k8s.io/" + drainEv.Name},
		{[]string{"history", node, "-o", "name"}, "lifecycleevent.lifecycle.x-k8s.io/" + drainEv.Name},
		{[]string{"transitions", node, "-o", "name"}, "lifecycletransition.lifecycle.x-k8s.io/" + node + "-drain"},
		{[]string{"status", drainEv.Name, "-o", "name"}, "lifecycleevent.lifecycle.x-k8s.io/" + drainEv.Name},
	} {
		what := strings.Join(tc.args, " ")
		r = plugin(t, 30*time.Second, tc.args...)
		wantExit(t, r, 0, what)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if !slices.Contains(lines, tc.want) {
			t.Errorf("%s: no line %q in:\n%s", what, tc.want, r.stdout)
		}
		for _, l := range lines {
			if !strings.Contains(l, ".lifecycle.x-k8s.io/") || strings.ContainsAny(l, " \t") {
				t.Errorf("%s: line %q is not kind.group/name", what, l)
			}
		}
	}

	// status NODE lists every lifecycle condition the Node has, those a
	// queued event (MaintenancePlanned) and the GPU check write included.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := getNode(t, node)
		now := metav1.Now()
		n.Status.Conditions = append(n.Status.Conditions,
			corev1.NodeCondition{Type: v1alpha1.NodeConditionMaintenancePlanned, Status: corev1.ConditionFalse, Reason: "MaintenanceStarted", Message: "planted by the test", LastTransitionTime: now, LastHeartbeatTime: now},
			corev1.NodeCondition{Type: v1alpha1.NodeConditionGPUHealthy, Status: corev1.ConditionTrue, Reason: "AllGPUsHealthy", Message: "planted by the test", LastTransitionTime: now, LastHeartbeatTime: now})
		_, err := core.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r = plugin(t, 30*time.Second, "status", node)
	wantExit(t, r, 0, "status NODE")
	for _, s := range []string{"MaintenancePlanned", "MaintenanceStarted", "GPUHealthy", "AllGPUsHealthy"} {
		wantContains(t, r.stdout, s, "status NODE")
	}

	// run without --wait: the name, then cancel --wait.
	r = plugin(t, 30*time.Second, "run", "uncordon", node)
	wantExit(t, r, 0, "run without --wait")
	name := strings.TrimSpace(r.stdout)
	if !strings.HasPrefix(name, node+"-uncordon-") || strings.Contains(name, " ") {
		t.Fatalf("run without --wait printed %q, want the event name", name)
	}
	r = plugin(t, 60*time.Second, "cancel", name, "--wait")
	wantExit(t, r, 0, "cancel --wait")
	// "gone" when the agent ended the event before the cancel reached it
	// (its one step is quick), "cancelled" when the cancel came first:
	// the plugin's two documented words (docs/plugin.md). A machine under
	// load gives either.
	if !strings.Contains(r.stdout, "lifecycleevent "+name+" gone") && !strings.Contains(r.stdout, "lifecycleevent "+name+" cancelled") {
		t.Errorf("cancel --wait: want %q or %q in:\n%s", "lifecycleevent "+name+" gone", "lifecycleevent "+name+" cancelled", r.stdout)
	}
	if !eventGone(name) {
		t.Errorf("event %s still there after cancel --wait", name)
	}
}

// lastSucceeded is the newest Succeeded event of node for transition.
func lastSucceeded(t *testing.T, node, transition string) *v1alpha1.LifecycleEvent {
	t.Helper()
	var best *v1alpha1.LifecycleEvent
	for _, ev := range eventsOn(t, node) {
		if ev.Spec.TransitionName == transition && ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded &&
			(best == nil || !ev.CreationTimestamp.Before(&best.CreationTimestamp)) {
			ev := ev
			best = &ev
		}
	}
	if best == nil {
		t.Fatalf("no event for %s on %s", transition, node)
	}
	return best
}

// slotWatch records the disruption-slot leases <group>-<i> in
// lifecycle-system as the agents take and release them. It watches both
// kinds an agent may use: coordination.k8s.io Leases and the project's
// LifecycleLeases (lifecycle.x-k8s.io, the same LeaseSpec), whichever the
// API serves.
type slotWatch struct {
	mu      sync.Mutex
	held    map[string]string // kind/lease -> event
	maxHeld int
	events  map[string]bool // events that held a slot
	names   map[string]bool // slot leases seen
	sources int
}

func watchSlots(t *testing.T, group string) *slotWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dyn, err := dynamic.NewForConfig(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	s := &slotWatch{held: map[string]string{}, events: map[string]bool{}, names: map[string]bool{}}
	name := regexp.MustCompile("^" + regexp.QuoteMeta(group) + `-[0-9]+$`)
	for _, gvr := range []schema.GroupVersionResource{
		coordv1.SchemeGroupVersion.WithResource("leases"),
		v1alpha1.SchemeGroupVersion.WithResource("lifecycleleases"),
	} {
		ri := dyn.Resource(gvr).Namespace(v1alpha1.SystemNamespace)
		l, err := ri.List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue // this API does not serve that kind
		}
		if err != nil {
			t.Fatalf("list %s: %v", gvr.Resource, err)
		}
		w, err := ri.Watch(ctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
		if err != nil {
			t.Fatalf("watch %s: %v", gvr.Resource, err)
		}
		s.sources++
		go func(kind string) {
			defer w.Stop()
			for e := range w.ResultChan() {
				u, ok := e.Object.(*unstructured.Unstructured)
				if !ok || !name.MatchString(u.GetName()) {
					continue
				}
				holder, _, _ := unstructured.NestedString(u.Object, "spec", "holderIdentity")
				key := kind + "/" + u.GetName()
				s.mu.Lock()
				s.names[u.GetName()] = true
				if e.Type == watch.Deleted || holder == "" {
					delete(s.held, key)
				} else {
					ev := u.GetAnnotations()[leaseEventAnnotation]
					s.held[key] = ev
					s.events[ev] = true
				}
				distinct := map[string]bool{}
				for _, ev := range s.held {
					distinct[ev] = true
				}
				s.maxHeld = max(s.maxHeld, len(distinct))
				s.mu.Unlock()
			}
		}(gvr.Resource)
	}
	if s.sources == 0 {
		t.Fatal("the API serves neither leases nor lifecycleleases")
	}
	return s
}

// maxOverlap is the most events whose [claimTime, completionTime)
// intervals overlap at one instant (the API's times have 1 s resolution;
// half-open intervals never count an end and a start in the same second
// as an overlap).
func maxOverlap(evs []v1alpha1.LifecycleEvent) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, ev := range evs {
		if ev.Status.Holder == nil || ev.Status.Holder.ClaimTime == nil || ev.Status.CompletionTime == nil {
			continue
		}
		edges = append(edges, edge{ev.Status.Holder.ClaimTime.Time, +1}, edge{ev.Status.CompletionTime.Time, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].at.Equal(edges[j].at) {
			return edges[i].at.Before(edges[j].at)
		}
		return edges[i].delta < edges[j].delta // ends first
	})
	cur, most := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

func nodeNames(prefix string, n int) []string {
	var out []string
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// TestRolloutMaxConcurrent is a rolling reboot of five nodes with two pods
// each, --max-concurrent 2 (reboot: cordon, evict, wait-empty, reboot,
// wait-ready, uncordon; cordon, evict and reboot are disruptive and need a
// slot): never more than two disruptive at once, judged from the agents'
// slot leases and from the events' claim → completion intervals.
func TestRolloutMaxConcurrent(t *testing.T) {
	nodes := nodeNames("roll", 5)
	startNodes(t, nodes...)
	requireTransition(t, nodes[0], "reboot")
	for _, n := range nodes {
		addPods(t, "roll", n, 2) // each drain then takes over a second
	}
	const group = "roll-test"
	slots := watchSlots(t, group)

	r := plugin(t, 150*time.Second, append([]string{"rollout", "reboot", "--max-concurrent", "2", "--group", group, "--wait"}, nodes...)...)
	wantExit(t, r, 0, "rollout")
	wantContains(t, r.stdout, "done 5/5, running 0, waiting 0, failed 0", "rollout summary")
	wantContains(t, r.stdout, "rollout "+group+" complete: 5/5 nodes done", "rollout end")
	for _, line := range strings.Split(r.stdout, "\n") {
		if m := runningRE.FindStringSubmatch(line); m != nil && m[1] != "0" && m[1] != "1" && m[1] != "2" {
			t.Errorf("summary shows more than 2 running: %s", line)
		}
	}

	evs := eventsWithLabel(t, rolloutLabel+"="+group)
	if len(evs) != 5 {
		t.Fatalf("rollout created %d events, want 5", len(evs))
	}
	for _, ev := range evs {
		want := "rollout-" + group + "-" + ev.Spec.BindingNode + "-reboot"
		if ev.Name != want {
			t.Errorf("event %s: want name %s", ev.Name, want)
		}
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Errorf("event %s: %s (%s), want Succeeded", ev.Name, ev.Status.ClaimStatus, ev.Status.Message)
		}
		if d := ev.Spec.Disruption; d == nil || d.Group != group || d.MaxConcurrent != 2 {
			t.Errorf("event %s: spec.disruption %+v, want {%s 2}", ev.Name, d, group)
		}
		if !slotsHeldBy(slots, ev.Name) {
			t.Errorf("event %s never held a disruption slot of %s", ev.Name, group)
		}
	}
	for _, n := range nodes {
		if getNode(t, n).Spec.Unschedulable {
			t.Errorf("%s still cordoned after its reboot", n)
		}
		if left := podsOn(t, n); len(left) > 0 {
			t.Errorf("pods left on %s: %v", n, left)
		}
	}
	switch o := maxOverlap(evs); {
	case o > 2:
		t.Errorf("%d events ran at once (claim → completion), want at most 2", o)
	case o == 0:
		t.Errorf("no event lasted a second: the claim → completion check proved nothing")
	}
	slots.mu.Lock()
	defer slots.mu.Unlock()
	if slots.maxHeld > 2 {
		t.Errorf("%d disruption slots of %s held at once, want at most 2", slots.maxHeld, group)
	}
	if slots.maxHeld < 2 {
		t.Errorf("at most %d slot held at once: the rollout did not use its budget of 2", slots.maxHeld)
	}
	for name := range slots.names {
		if name != group+"-0" && name != group+"-1" {
			t.Errorf("unexpected slot lease %s (maxConcurrent 2 means %s-0 and %s-1)", name, group, group)
		}
	}
	t.Logf("slots held at once: at most %d; events overlapping: at most %d", slots.maxHeld, maxOverlap(evs))
}

// requireTransition fails the test when the node's agent does not offer
// the driver.
func requireTransition(t *testing.T, node, driver string) {
	t.Helper()
	if _, err := lc.Transitions.Get(context.Background(), node+"-"+driver, metav1.GetOptions{}); err != nil {
		t.Fatalf("the agent on %s publishes no %s-%s transition (%v): is driver lifecycle-agent.x-k8s.io/%s enabled?", node, node, driver, err, driver)
	}
}

func slotsHeldBy(s *slotWatch, event string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.events[event]
}

// TestRolloutMaxFailures rolls uncordon over five nodes after
// maintenance. Two of them were cordoned by a person, not by
// lifecycle-agent, so their agents refuse to uncordon them: with
// --max-failures 1 the rollout starts no further node after the first
// failure, exits 1 and names the nodes it did not start. Once the
// cordons are lifted, --retry-failed finishes the rollout.
func TestRolloutMaxFailures(t *testing.T) {
	nodes := nodeNames("fail", 5)
	startNodes(t, nodes...)
	cordonByHand(t, "fail-1")
	cordonByHand(t, "fail-2")
	const group = "fail-test"
	args := append([]string{"rollout", "uncordon", "--max-concurrent", "2", "--max-failures", "1", "--group", group, "--wait"}, nodes...)

	r := plugin(t, 120*time.Second, args...)
	wantExit(t, r, 1, "rollout with failures")
	wantContains(t, r.stderr, "2 of 5 node(s) failed: fail-1, fail-2", "rollout error")
	wantContains(t, r.stderr, "max-failures 1 reached, not started: fail-3, fail-4, fail-5", "rollout error")
	wantContains(t, r.stdout, "max-failures (1) reached", "rollout output")
	// No event was started after the first failure was reported.
	lines := strings.Split(r.stdout, "\n")
	firstFail := -1
	for i, l := range lines {
		if strings.Contains(l, ": Failed after") && firstFail < 0 {
			firstFail = i
		}
		if firstFail >= 0 && strings.Contains(l, "started lifecycleevent") {
			t.Errorf("an event was started after the first failure: %q", l)
		}
	}
	if firstFail < 0 {
		t.Errorf("no failure reported in the output")
	}
	evs := eventsWithLabel(t, rolloutLabel+"="+group)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Spec.BindingNode)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "cordoned by someone else") {
			t.Errorf("event %s: %s %q, want Failed because the node was cordoned by someone else", ev.Name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
	sort.Strings(got)
	if strings.Join(got, ",") != "fail-1,fail-2" {
		t.Fatalf("events exist for %v, want only fail-1 and fail-2 (no event after max-failures)", got)
	}
	for _, n := range []string{"fail-1", "fail-2"} {
		if !getNode(t, n).Spec.Unschedulable {
			t.Errorf("%s: a person's cordon was lifted", n)
		}
	}

	// The person lifts the cordons; the same rollout, retrying its failures, completes.
	for _, n := range []string{"fail-1", "fail-2"} {
		if _, err := core.CoreV1().Nodes().Patch(context.Background(), n, types.StrategicMergePatchType,
			[]byte(`{"spec":{"unschedulable":false}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r = plugin(t, 120*time.Second, append(args, "--retry-failed")...)
	wantExit(t, r, 0, "rollout --retry-failed")
	wantContains(t, r.stdout, "retrying fail-1", "rollout --retry-failed")
	wantContains(t, r.stdout, "done 5/5, running 0, waiting 0, failed 0", "rollout --retry-failed")
	if evs := eventsWithLabel(t, rolloutLabel+"="+group); len(evs) != 5 {
		t.Errorf("after --retry-failed: %d events, want 5", len(evs))
	}
}

// TestRolloutResumesAfterKill kills the plugin (SIGKILL) right after it
// started the first event of a rolling reboot, then runs the same command
// again: it adopts what exists, creates no duplicate, and finishes.
func TestRolloutResumesAfterKill(t *testing.T) {
	nodes := nodeNames("kill", 5)
	startNodes(t, nodes...)
	requireTransition(t, nodes[0], "reboot")
	args := append([]string{"rollout", "reboot", "--max-concurrent", "2", "--wait"}, nodes...)

	cmd := exec.Command(pluginBin, append(args, "--kubeconfig", adminKC)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	group := ""
	var seen []string
	sc := bufio.NewScanner(stdout)
	killed := false
	timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
	for sc.Scan() {
		line := sc.Text()
		seen = append(seen, line)
		if m := regexp.MustCompile(`^rollout (\S+): reboot on 5 node`).FindStringSubmatch(line); m != nil {
			group = m[1]
		}
		if strings.Contains(line, "started lifecycleevent") {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			killed = true
			break
		}
	}
	timer.Stop()
	_ = cmd.Wait()
	t.Logf("first run, killed after:\n%s", strings.Join(seen, "\n"))
	if !killed || group == "" {
		t.Fatalf("the first run never started an event (group %q)", group)
	}
	sel := rolloutLabel + "=" + group
	before := eventsWithLabel(t, sel)
	if len(before) == 0 || len(before) > 2 {
		t.Fatalf("after the kill: %d events, want 1 or 2 (max-concurrent 2)", len(before))
	}

	r := plugin(t, 150*time.Second, args...)
	wantExit(t, r, 0, "the same rollout again")
	wantContains(t, r.stdout, "already started by an earlier run", "second run")
	wantContains(t, r.stdout, "done 5/5, running 0, waiting 0, failed 0", "second run")

	evs := eventsWithLabel(t, sel)
	if len(evs) != 5 {
		t.Fatalf("after the second run: %d events, want 5 (no duplicates)", len(evs))
	}
	for _, ev := range evs {
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Errorf("event %s: %s (%s), want Succeeded", ev.Name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
	for _, b := range before {
		if now := getEvent(t, b.Name); now.UID != b.UID {
			t.Errorf("event %s was replaced, not adopted", b.Name)
		}
	}
	for _, n := range nodes {
		if got := eventsOn(t, n); len(got) != 1 {
			t.Errorf("node %s has %d events, want exactly 1", n, len(got))
		}
	}
	if o := maxOverlap(evs); o > 2 {
		t.Errorf("%d events ran at once, want at most 2", o)
	}
}

// Without a kubeconfig the plugin says so, naming where it looked, instead
// of client-go's fallback (a refused connection to localhost:8080, a
// server nobody named); --version works like kubectl's.
func TestNoKubeconfig(t *testing.T) {
	home := t.TempDir()
	for _, tc := range []struct {
		name, kubeconfigEnv, where string
	}{
		{name: "none", where: home + "/.kube/config"},
		{name: "KUBECONFIG names a missing file", kubeconfigEnv: home + "/absent", where: "$KUBECONFIG (" + home + "/absent)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(pluginBin, "status")
			cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "KUBECONFIG=" + tc.kubeconfigEnv}
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("status without a kubeconfig: %v, want exit 1\n%s", err, out)
			}
			want := "error: no cluster to talk to: no kubeconfig at " + tc.where + " names one; pass --kubeconfig FILE or set KUBECONFIG"
			if !strings.Contains(string(out), want) || strings.Contains(string(out), "localhost:8080") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
				t.Errorf("status without a kubeconfig said\n%s\nwant one line containing %q", out, want)
			}
		})
	}
	out, err := exec.Command(pluginBin, "--version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "kubectl-lifecycle ") || strings.Count(string(out), "\n") != 1 {
		t.Errorf("--version: %v\n%s\nwant one line: kubectl-lifecycle VERSION", err, out)
	}
}

// The manifests' ClusterRole lifecycle-agent:operator is all a plugin user
// needs: bound to a group, its member runs, follows, lists and cancels
// events and rolls one out; without the binding the same user gets one
// line naming what was refused.
func TestOperatorClusterRole(t *testing.T) {
	node := "ops-node"
	startNodes(t, node)
	requireTransition(t, node, "uncordon")
	kc := filepath.Join(t.TempDir(), "ops.kubeconfig")
	if err := testenv.WriteKubeconfig(kc, env.UserConfig("ops-user", "lifecycle-operators")); err != nil {
		t.Fatal(err)
	}
	if r := pluginAs(t, kc, 30*time.Second, "status"); r.code != 1 || !strings.Contains(r.stderr, "forbidden") || !strings.Contains(r.stderr, "needs the ClusterRole lifecycle-agent:operator") || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
		t.Errorf("status without the binding: exit %d, stderr %q; want exit 1 and one line saying forbidden and naming the ClusterRole", r.code, r.stderr)
	}
	ctx := context.Background()
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "lifecycle-operators-test"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "lifecycle-agent:operator"},
		Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "Group", Name: "lifecycle-operators"}}}
	if _, err := core.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = core.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
	})
	// RBAC caches: wait until the binding is in force.
	deadline := time.Now().Add(20 * time.Second)
	for r := pluginAs(t, kc, 30*time.Second, "transitions"); r.code != 0; r = pluginAs(t, kc, 30*time.Second, "transitions") {
		if time.Now().After(deadline) {
			t.Fatalf("transitions as ops-user with the binding: exit %d: %s", r.code, r.stderr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r := pluginAs(t, kc, 60*time.Second, "uncordon", node)
	wantExit(t, r, 0, "uncordon as ops-user")
	for _, args := range [][]string{{"status"}, {"status", node}, {"history", node}, {"transitions", "-o", "wide"}} {
		wantExit(t, pluginAs(t, kc, 30*time.Second, args...), 0, strings.Join(args, " ")+" as ops-user")
	}
	r = pluginAs(t, kc, 30*time.Second, "run", "uncordon", node)
	wantExit(t, r, 0, "run as ops-user")
	wantExit(t, pluginAs(t, kc, 60*time.Second, "cancel", strings.TrimSpace(r.stdout), "--wait"), 0, "cancel as ops-user")
	r = pluginAs(t, kc, 90*time.Second, "rollout", "uncordon", "--max-concurrent", "1", "--group", "ops-test", "--wait", node)
	wantExit(t, r, 0, "rollout as ops-user")
}

// A cluster without the CRDs (the manifests never applied): the real API
// server's 404, reached through a proxy that sends the plugin's requests for
// our group to a group the server does not serve, becomes one line saying
// what is missing and how to install it; a missing event keeps its own
// message.
func TestMissingCRDs(t *testing.T) {
	admin := env.AdminConfig()
	upstream, err := url.Parse(admin.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(upstream)
	proxy.Transport = rt
	director := proxy.Director
	proxy.Director = func(r *http.Request) {
		director(r)
		r.URL.Path = strings.Replace(r.URL.Path, "/apis/"+v1alpha1.GroupName+"/", "/apis/absent."+v1alpha1.GroupName+"/", 1)
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	kc := filepath.Join(t.TempDir(), "no-crds.kubeconfig")
	if err := testenv.WriteKubeconfig(kc, &rest.Config{Host: srv.URL}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"status"}, {"transitions"}, {"history"}} {
		r := pluginAs(t, kc, 30*time.Second, args...)
		want := "this cluster does not serve the lifecycle.x-k8s.io API (the CRDs LifecycleEvent and LifecycleTransition are not installed); install them with the manifests: lifecycle-agent manifests | kubectl apply -f -"
		if r.code != 1 || !strings.Contains(r.stderr, want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("kubectl lifecycle %s without the CRDs: exit %d\n%s\nwant exit 1 and one line containing %q", strings.Join(args, " "), r.code, r.stderr, want)
		}
	}
	// With the CRDs, a missing event is just that.
	r := plugin(t, 30*time.Second, "status", "no-such-event-or-node")
	if strings.Contains(r.stderr, "does not serve") {
		t.Errorf("a missing object was reported as a missing API:\n%s", r.stderr)
	}
}
