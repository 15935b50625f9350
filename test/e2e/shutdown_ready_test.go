package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
)

// shutdownAndPowerOn shuts r's node down through a test logind (the
// agent's delay lock released), checks what the shutdown journaled of the
// node (its DaemonSet and 8 GPUs), leaves the node as a power-off leaves
// it (off, given: the Node NotReady or not, the DaemonSet pod not Ready,
// the GPUs unregistered) and starts the agent again in a new boot. It
// returns the agent of the new boot and its logind.
func shutdownAndPowerOn(t *testing.T, r *readinessNode, configure func(*config.Config), off func()) (*testAgent, *logindtest.Server) {
	t.Helper()
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a := startAgent(t, r.node, agentOpts{retention: time.Hour, logind: srv.Address(), configure: configure})
	announce(t, srv, waitDelayLock(t, srv))
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if len(doc.Events) != 1 || doc.Events[0].Driver != "lifecycle-agent.x-k8s.io/shutdown" {
		t.Fatalf("journal should hold the shutdown under way: %+v", doc.Events)
	}
	snap, err := readiness.Decode(doc.Events[0].Attrs[drivers.ResolvedReadiness])
	if err != nil || snap.Allocatable["nvidia.com/gpu"] != 8 || !slices.Contains(snap.DaemonSets, r.ns+"/device-plugin") {
		t.Fatalf("what the shutdown journaled of the node: %+v (%v), want 8 GPUs and the DaemonSet %s/device-plugin", snap, err, r.ns)
	}
	off()
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("5f2c1d7e-0a4b-4c3d-8e9f-1a2b3c4d5e6f\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	return startAgent(t, r.node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir, configure: configure}), srv2
}

// waitShutdownCondition waits (a minute) until LifecycleTransition has
// status and reason and its message holds every one of want.
func waitShutdownCondition(t *testing.T, node string, status corev1.ConditionStatus, reason string, want ...string) (*corev1.NodeCondition, *corev1.Node) {
	t.Helper()
	var lt *corev1.NodeCondition
	var n *corev1.Node
	waitFor(t, "LifecycleTransition "+string(status)+"/"+reason+" naming "+strings.Join(want, ", "), time.Minute, func() bool {
		lt, _, n = shutdownConds(t, node)
		return lt != nil && lt.Status == status && lt.Reason == reason &&
			!slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(lt.Message, w) })
	})
	return lt, n
}

// DESIGN §3, "Ready means ready", for the shutdown's next-boot uncordon:
// the node comes back from a power-off with its kubelet not Ready yet, then
// Ready with its DaemonSet pod not Ready and its GPUs not registered. The
// agent keeps it cordoned, LifecycleTransition naming what it waits for,
// across a restart of its own during the wait (which resumes what is left
// of readiness.timeout), and gives it back only once the kubelet, the
// DaemonSet and the GPUs are back. Before, the next boot uncordoned as soon
// as the API server answered: in the VM, before the new kubelet was Ready.
func TestShutdownNextBootWaitsUntilReady(t *testing.T) {
	node := "shutdown-ready-node"
	r := newReadinessNode(t, node)
	rec := recordConditions(t, node)
	a, _ := shutdownAndPowerOn(t, r, nil, func() {
		r.setReady(false)
		r.setPodReady(false)
		r.setGPUs(0)
	})
	_, n := waitShutdownCondition(t, node, corev1.ConditionTrue, "ShuttingDown", "node restarted after a shutdown", "for the kubelet to report the node Ready")
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Fatalf("uncordoned before the kubelet reported the node Ready: unschedulable=%v %v", n.Spec.Unschedulable, n.Annotations)
	}
	r.setReady(true)
	missing := []string{"DaemonSet " + node + "/device-plugin has no Ready pod on the node", "allocatable nvidia.com/gpu is 0 of 8"}
	_, n = waitShutdownCondition(t, node, corev1.ConditionTrue, "ShuttingDown", missing...)
	if !n.Spec.Unschedulable {
		t.Fatal("uncordoned while the DaemonSet pod and the GPUs were not back")
	}

	// A restart during the wait (same boot) resumes it.
	a.stop(t)
	srv3 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a = startAgent(t, node, agentOpts{retention: time.Hour, logind: srv3.Address(), dir: a.dir})
	waitFor(t, "the resumed wait in the agent's log", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "resumed after a restart")
	})
	if !getNode(t, node).Spec.Unschedulable {
		t.Fatal("uncordoned after a restart during the wait")
	}

	r.setPodReady(true)
	r.setGPUs(8)
	_, n = waitShutdownCondition(t, node, corev1.ConditionFalse, "ShutdownComplete", "shutdown complete; node back")
	waitFor(t, "the node uncordoned", 30*time.Second, func() bool {
		n = getNode(t, node)
		return !n.Spec.Unschedulable
	})
	if _, ok := n.Annotations[v1alpha1.AnnotationCordonedBy]; ok {
		t.Errorf("the cordon's annotation is left: %v", n.Annotations)
	}
	rec.Expect(t, 0, []string{
		cLT + "=True/ShuttingDown", cGNS + "=True/NodeShutdown",
		cGNS + "=False/NodeStarted", cLT + "=False/ShutdownComplete",
	}, cDIP, cDrained, cMIP, cPlanned)
	stopAfterCloseOut(t, a, 1)
	doc := exportJournal(t, a.Journal)
	h := shutdownHistory(t, doc)
	if h.Outcome != journal.OutcomeSucceeded || !strings.Contains(stepsOf(h), "wait-ready=Done") || !strings.Contains(stepsOf(h), "wait-workloads-ready=Done") {
		t.Errorf("the shutdown's history: %s %q steps %s", h.Outcome, h.Message, stepsOf(h))
	}
	if len(doc.Owned) != 0 || len(doc.Events) != 0 {
		t.Errorf("journal after the close-out: owned %+v, events %+v", doc.Owned, doc.Events)
	}
}

// The GPUs never come back after the power-on: the shutdown is closed out
// Failed (LifecycleTransition=False, reason NotReadyAfterShutdown, naming
// them) at readiness.timeout, the node cordoned by default and given back
// with readiness.onTimeout uncordon; the journal keeps nothing owned.
func TestShutdownNextBootNotReady(t *testing.T) {
	for _, tc := range onTimeoutCases {
		t.Run(tc.name, func(t *testing.T) {
			node := "shutdown-notready-" + strings.ToLower(tc.name)
			r := newReadinessNode(t, node)
			configure := func(c *config.Config) {
				c.Readiness.Timeout = 3 * time.Second
				c.Readiness.OnTimeout = tc.onTimeout
			}
			a, _ := shutdownAndPowerOn(t, r, configure, func() { r.setGPUs(0) })
			lt, _ := waitShutdownCondition(t, node, corev1.ConditionFalse, "NotReadyAfterShutdown",
				"not ready within 3s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8")
			var n *corev1.Node
			waitFor(t, "the node's cordon as readiness.onTimeout says", 30*time.Second, func() bool {
				n = getNode(t, node)
				return n.Spec.Unschedulable == tc.cordoned
			})
			if tc.cordoned && (n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" || !strings.Contains(lt.Message, "stays cordoned")) {
				t.Errorf("kept cordoned: annotation %q, message %q; want the shutdown's and the message saying so", n.Annotations[v1alpha1.AnnotationCordonedBy], lt.Message)
			}
			stopAfterCloseOut(t, a, 1)
			doc := exportJournal(t, a.Journal)
			if h := shutdownHistory(t, doc); h.Outcome != journal.OutcomeFailed || !strings.Contains(h.Message, "allocatable nvidia.com/gpu is 0 of 8") {
				t.Errorf("the shutdown's history: %s %q", h.Outcome, h.Message)
			}
			if len(doc.Owned) != 0 || len(doc.Events) != 0 {
				t.Errorf("journal after the close-out: owned %+v, events %+v", doc.Owned, doc.Events)
			}
		})
	}
}

// Another shutdown is announced while the boot after the first one still
// waits for the node's GPUs, and then cancelled. The wait stops: nothing
// of it is written over the new shutdown's conditions, and the new
// shutdown does not take over the cordon, so its cancel does not give the
// node back. After the cancel the first shutdown's close-out resumes and
// gives the node back once its GPUs are back. Before, the new shutdown
// took the cordon's record over and its cancel uncordoned the node with 0
// of its 8 GPUs.
func TestShutdownDuringTheReturnWait(t *testing.T) {
	node := "shutdown-again-node"
	r := newReadinessNode(t, node)
	a, srv := shutdownAndPowerOn(t, r, nil, func() { r.setGPUs(0) })
	waitShutdownCondition(t, node, corev1.ConditionTrue, "ShuttingDown", "allocatable nvidia.com/gpu is 0 of 8")
	announce(t, srv, waitDelayLock(t, srv))
	_, gns, _ := shutdownConds(t, node)
	if gns == nil || gns.Status != corev1.ConditionTrue {
		t.Fatalf("GracefulNodeShutdownInProgress after the second announcement: %+v, want True", gns)
	}
	waitFor(t, "the wait stopped by the new shutdown, in the agent's log", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "shutdown prepared")
	})
	time.Sleep(2 * time.Second) // what a wait still running would write
	if _, gns, _ := shutdownConds(t, node); gns == nil || gns.Status != corev1.ConditionTrue {
		t.Fatalf("GracefulNodeShutdownInProgress went back during the second shutdown: %+v", gns)
	}

	// logind cancels the second shutdown: the node stays cordoned, its GPUs
	// still missing, until the first shutdown's close-out gives it back.
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second shutdown closed out as cancelled", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "reason=ShutdownCancelled")
	})
	if n := getNode(t, node); !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Fatalf("the cancel of the second shutdown gave the node back with its GPUs missing: unschedulable=%v %v", n.Spec.Unschedulable, n.Annotations)
	}
	waitFor(t, "the first shutdown's wait resumed after the cancel", 30*time.Second, func() bool {
		return strings.Count(a.logBuf.String(), "allocatable nvidia.com/gpu is 0 of 8") >= 2
	})
	if !getNode(t, node).Spec.Unschedulable {
		t.Fatal("uncordoned while the first shutdown's wait resumed, its GPUs missing")
	}
	r.setGPUs(8)
	waitShutdownCondition(t, node, corev1.ConditionFalse, "ShutdownComplete", "shutdown complete; node back")
	waitFor(t, "the node uncordoned", 30*time.Second, func() bool { return !getNode(t, node).Spec.Unschedulable })
	stopAfterCloseOut(t, a, 2) // the cancelled one and the first
	doc := exportJournal(t, a.Journal)
	outcomes := map[journal.Outcome]int{}
	for _, h := range doc.History {
		if h.Event.Driver == "lifecycle-agent.x-k8s.io/shutdown" {
			outcomes[h.Outcome]++
		}
	}
	if outcomes[journal.OutcomeSucceeded] != 1 || outcomes[journal.OutcomeCancelled] != 1 || len(doc.Owned) != 0 || len(doc.Events) != 0 {
		t.Errorf("journal: shutdown outcomes %v (want one Succeeded, one Cancelled), owned %+v, events %+v", outcomes, doc.Owned, doc.Events)
	}
}

// shutdownHistory is the shutdown's record in the journal's history.
// stopAfterCloseOut stops the agent once it has closed n shutdowns out
// (a cancel's revert closes one out too). The end conditions on the Node
// come before that: the close-out waits until the outbox has them
// delivered, then moves the record to the history. Stopped in between (a
// loaded machine: make test with other tests beside it), the record stays
// journaled for the next start.
func stopAfterCloseOut(t *testing.T, a *testAgent, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d shutdowns closed out in the agent's log", n), 30*time.Second, func() bool {
		return strings.Count(a.logBuf.String(), "shutdown closed out") >= n
	})
	a.stop(t)
}

func shutdownHistory(t *testing.T, doc journal.ExportDoc) journal.HistoryRecord {
	t.Helper()
	for _, h := range doc.History {
		if h.Event.Driver == "lifecycle-agent.x-k8s.io/shutdown" {
			return h
		}
	}
	t.Fatalf("no shutdown in the journal's history: %+v", doc.History)
	return journal.HistoryRecord{}
}

// stepsOf is a history record's steps as "name=State,…", the last record
// of each.
func stepsOf(h journal.HistoryRecord) string {
	var names []string
	last := map[string]string{}
	for _, s := range h.Steps {
		if _, ok := last[s.Step]; !ok {
			names = append(names, s.Step)
		}
		last[s.Step] = s.State.String()
	}
	var out []string
	for _, n := range names {
		out = append(out, n+"="+last[n])
	}
	return strings.Join(out, ",")
}

// An earlier boot's shutdown closes out, its waits done, and its uncordon
// is refused (an admission policy stands in for a failing API server: the
// close-out retries every 2 s); logind announces a new shutdown then, which
// finds the node cordoned by the earlier shutdown and leaves the cordon to
// it. When the uncordon would go through again, the earlier close-out must
// not give the node back: it is going down again. Before, the retried
// uncordon lifted the cordon: the node went down schedulable, and its next
// boot had nothing to wait for (the new shutdown owned no cordon).
func TestShutdownDuringTheCloseOut(t *testing.T) {
	node := "shutdown-closeout-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address()})
	announce(t, srv, waitDelayLock(t, srv))
	a.stop(t)
	if n := getNode(t, node); !n.Spec.Unschedulable {
		t.Fatal("the first shutdown did not cordon the node")
	}
	allow := refuseNodeUpdates(t, node)
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("6a3d2e8f-1b5c-4d4e-9f0a-2b3c4d5e6f7a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a2 := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir})
	waitFor(t, "the close-out's uncordon refused and retried", 60*time.Second, func() bool {
		return strings.Contains(a2.logBuf.String(), "closing out the last shutdown failed; retrying")
	})
	announce(t, srv2, waitDelayLock(t, srv2))
	waitFor(t, "the new shutdown prepared", 30*time.Second, func() bool {
		return strings.Contains(a2.logBuf.String(), "shutdown prepared")
	})
	allow()
	time.Sleep(3 * time.Second) // the close-out's next retry, 2 s after its last
	if n := getNode(t, node); !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Fatalf("the earlier shutdown's close-out gave the node back during the new shutdown: unschedulable=%v %v", n.Spec.Unschedulable, n.Annotations)
	}
	if lt, gns, _ := shutdownConds(t, node); lt == nil || lt.Reason == "ShutdownComplete" || gns == nil || gns.Status != corev1.ConditionTrue {
		t.Errorf("conditions during the new shutdown: LifecycleTransition %+v, GracefulNodeShutdownInProgress %+v; want it shutting down", lt, gns)
	}
	if !strings.Contains(a2.logBuf.String(), "the node is shutting down again") {
		t.Errorf("the agent's log does not say the close-out waits for the new shutdown:\n%s", a2.logBuf.String())
	}
}

// refuseNodeUpdates installs an admission policy that refuses every update
// of node (not its status), and returns the function that removes it; both
// wait until the API server applies the change.
func refuseNodeUpdates(t *testing.T, node string) (allow func()) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	name := "refuse-" + node
	fail := admissionregistrationv1.Fail
	pol := &admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"}}},
			}}},
			Validations: []admissionregistrationv1.Validation{{Expression: "object.metadata.name != '" + node + "'", Message: "test: updates of " + node + " refused"}},
		}}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bind := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}}}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, bind, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused := func() bool {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "refused")
	}
	waitFor(t, "the policy refusing updates of "+node, 30*time.Second, refused)
	removed := false
	allow = func() {
		if removed {
			return
		}
		removed = true
		_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
		waitFor(t, "the policy refusing updates of "+node+" gone", 30*time.Second, func() bool { return !refused() })
	}
	t.Cleanup(allow)
	return allow
}

// A cordon kept by an earlier shutdown for an admin (the node not back in
// time: NotReadyAfterShutdown, cordoned-by: shutdown, no longer the
// agent's) stays when another shutdown is announced in that boot and then
// cancelled. Before, the new shutdown took the cordon as its own (it found
// the node cordoned for "shutdown") and its cancel uncordoned the node at
// once, with 0 of its 8 GPUs.
func TestShutdownLeavesAKeptCordon(t *testing.T) {
	node := "shutdown-kept-node"
	r := newReadinessNode(t, node)
	configure := func(c *config.Config) { c.Readiness.Timeout = 3 * time.Second }
	a, srv := shutdownAndPowerOn(t, r, configure, func() { r.setGPUs(0) })
	waitShutdownCondition(t, node, corev1.ConditionFalse, "NotReadyAfterShutdown", "allocatable nvidia.com/gpu is 0 of 8")
	waitFor(t, "the node kept cordoned", 30*time.Second, func() bool {
		n := getNode(t, node)
		return n.Spec.Unschedulable && n.Annotations[v1alpha1.AnnotationCordonedBy] == "shutdown"
	})
	announce(t, srv, waitDelayLock(t, srv))
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new shutdown closed out as cancelled", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "reason=ShutdownCancelled")
	})
	if n := getNode(t, node); !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Fatalf("the cancelled shutdown lifted the cordon kept for an admin: unschedulable=%v %v", n.Spec.Unschedulable, n.Annotations)
	}
	if !strings.Contains(a.logBuf.String(), "kept by an earlier shutdown for an admin") {
		t.Errorf("the agent's log does not say the kept cordon is left:\n%s", a.logBuf.String())
	}
}

// A shutdown cancelled while the API server does not answer stays
// journaled (the cancel's uncordon is retried); announced again before the
// server answers, what its first announcement read of the node stands.
// Before, the second announcement replaced the shutdown's record: its read
// of the node failed (or, with the server up, read a node whose kubelet
// was stopping its pods), the next boot compared against nothing, and the
// node was given back with 0 of its 8 GPUs.
func TestShutdownAnnouncedAgainKeepsWhatTheNodeHad(t *testing.T) {
	node := "shutdown-again-snap-node"
	r := newReadinessNode(t, node)
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), budget: 3 * time.Second, rest: proxy.Config(env.NodeConfig(node))})
	announce(t, srv, waitDelayLock(t, srv))
	proxy.Cut()
	r.setGPUs(0)
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the cancel's revert failing with the API server cut off", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "reverting the shutdown failed; retrying")
	})
	announce(t, srv, waitDelayLock(t, srv))
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if len(doc.Events) != 1 {
		t.Fatalf("journal: events %+v, want the shutdown", doc.Events)
	}
	snap, err := readiness.Decode(doc.Events[0].Attrs[drivers.ResolvedReadiness])
	if err != nil || snap.Allocatable["nvidia.com/gpu"] != 8 {
		t.Fatalf("what the shutdown journaled of the node after the second announcement: %+v (%v), want the first's 8 GPUs", snap, err)
	}
	proxy.Heal()
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("7b4e3f90-2c6d-4e5f-8a1b-3c4d5e6f7a8b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	startAgent(t, node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir})
	waitShutdownCondition(t, node, corev1.ConditionTrue, "ShuttingDown", "allocatable nvidia.com/gpu is 0 of 8")
	if !getNode(t, node).Spec.Unschedulable {
		t.Error("the node is not cordoned while its GPUs are missing")
	}
}

// While a shutdown is under way (here announced during the boot after
// an earlier one, whose close-out waits for the node's GPUs), no new event
// is claimed: it waits, Pending, naming the shutdown, and is claimed once
// the shutdown is cancelled and the earlier one's close-out gave the node
// back. Before, the close-out cut short by the new shutdown went straight
// on to claim it: a drain during the kubelet's graceful shutdown, on a
// node whose return no one had checked.
func TestShutdownHoldsNewEvents(t *testing.T) {
	node := "shutdown-holds-node"
	r := newReadinessNode(t, node)
	a, srv := shutdownAndPowerOn(t, r, nil, func() { r.setGPUs(0) })
	waitShutdownCondition(t, node, corev1.ConditionTrue, "ShuttingDown", "allocatable nvidia.com/gpu is 0 of 8")
	announce(t, srv, waitDelayLock(t, srv))
	waitFor(t, "the new shutdown prepared", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "shutdown prepared")
	})
	waitTransition(t, transitionName(node, "drain"))
	name := node + "-drain"
	createEvent(t, name, node, transitionName(node, "drain"), nil, nil)
	lc := clients(t, env.AdminConfig())
	waitFor(t, "the event Pending, naming the shutdown", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventPending && strings.Contains(ev.Status.Message, "the node is shutting down")
	})
	time.Sleep(2 * time.Second) // a claim still to come would be here by now
	if ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{}); err != nil || ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
		t.Fatalf("during the shutdown the event is %v (%v), want Pending", ev.Status.ClaimStatus, err)
	}
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	r.setGPUs(8)
	if ev := waitEvent(t, name, time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("the drain after the shutdown ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	log := a.logBuf.String()
	closed, claimed := strings.Index(log, "reason=ShutdownComplete"), strings.Index(log, "msg=claimed")
	if closed < 0 || claimed < closed {
		t.Errorf("the event was claimed before the first shutdown's close-out gave the node back (log offsets %d, %d)", claimed, closed)
	}
}
