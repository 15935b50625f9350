package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

func heldDelayLocks(s *logindtest.Server) []logindtest.Inhibitor {
	var out []logindtest.Inhibitor
	for _, in := range s.Inhibitors() {
		if in.Mode == "delay" && in.What == "shutdown" && !in.Released {
			out = append(out, in)
		}
	}
	return out
}

func waitDelayLock(t *testing.T, s *logindtest.Server) logindtest.Inhibitor {
	t.Helper()
	var held []logindtest.Inhibitor
	waitFor(t, "the agent's delay lock", 30*time.Second, func() bool {
		held = heldDelayLocks(s)
		return len(held) == 1
	})
	return held[0]
}

// announce emits PrepareForShutdown(true) and waits (10 s) until the
// agent released its delay lock.
func announce(t *testing.T, s *logindtest.Server, lock logindtest.Inhibitor) {
	t.Helper()
	if err := s.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.WaitReleased(ctx, lock.ID); err != nil {
		t.Fatalf("the delay lock was not released after PrepareForShutdown(true): %v", err)
	}
}

// agentState is the state the agent's control socket reports (status).
func agentState(t *testing.T, a *testAgent) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := agent.StatusFromSocket(ctx, a.cfg.SocketPath)
	if err != nil {
		t.Fatalf("status over %s: %v", a.cfg.SocketPath, err)
	}
	return s.State
}

func shutdownConds(t *testing.T, node string) (lt, gns *corev1.NodeCondition, n *corev1.Node) {
	n = getNode(t, node)
	return nodeCondition(n, v1alpha1.NodeConditionLifecycleTransition), nodeCondition(n, v1alpha1.NodeConditionGracefulNodeShutdownInProgress), n
}

// The shutdown driver over a real (private) D-Bus with a test logind:
// delay lock held; PrepareForShutdown(true) journals, posts ShuttingDown,
// cordons and releases the lock; the next boot closes it out.
func TestShutdownAndNextBoot(t *testing.T) {
	node := "shutdown-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	rec := recordConditions(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address()})
	lock := waitDelayLock(t, srv)

	if err := srv.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitReleased(ctx, lock.ID); err != nil {
		t.Fatalf("the delay lock was not released after PrepareForShutdown(true): %v", err)
	}
	lt, gns, n := shutdownConds(t, node)
	if lt == nil || lt.Reason != "ShuttingDown" || lt.Status != corev1.ConditionTrue || gns == nil || gns.Status != corev1.ConditionTrue || gns.Reason != "NodeShutdown" {
		t.Fatalf("conditions when the lock was released: LifecycleTransition=%+v GracefulNodeShutdownInProgress=%+v", lt, gns)
	}
	if !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Fatalf("node not cordoned for the shutdown: %v %v", n.Spec.Unschedulable, n.Annotations)
	}
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if len(doc.Events) != 1 || doc.Events[0].Driver != "lifecycle-agent.x-k8s.io/shutdown" {
		t.Fatalf("journal should hold the shutdown under way: %+v", doc.Events)
	}

	// "Reboot": a new (simulated) boot ID, then the agent starts again.
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("3b0e3a3c-2f0b-4d9e-9a57-9f4c6b9d1e01\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	startAgent(t, node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir})
	waitFor(t, "ShutdownComplete and the node uncordoned", 30*time.Second, func() bool {
		lt, gns, n := shutdownConds(t, node)
		return lt != nil && lt.Reason == "ShutdownComplete" && lt.Status == corev1.ConditionFalse &&
			gns != nil && gns.Status == corev1.ConditionFalse && gns.Reason == "NodeStarted" && !n.Spec.Unschedulable
	})
	waitDelayLock(t, srv2)
	// The whole sequence, in the order the API server stored it
	// (docs/conditions.md): no drain, no maintenance of an event.
	rec.Expect(t, 0, []string{
		cLT + "=True/ShuttingDown", cGNS + "=True/NodeShutdown",
		cGNS + "=False/NodeStarted", cLT + "=False/ShutdownComplete",
	}, cDIP, cDrained, cMIP, cPlanned)
}

// Short names of the condition types for the sequences above and below.
const (
	cLT, cDIP, cDrained = v1alpha1.NodeConditionLifecycleTransition, v1alpha1.NodeConditionDrainInProgress, v1alpha1.NodeConditionDrained
	cPlanned, cMIP      = v1alpha1.NodeConditionMaintenancePlanned, v1alpha1.NodeConditionMaintenanceInProgress
	cGNS                = v1alpha1.NodeConditionGracefulNodeShutdownInProgress
)

// PrepareForShutdown(false): the lock is taken again and the cordon reverted.
func TestShutdownCancelled(t *testing.T) {
	node := "shutdown-cancel-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	rec := recordConditions(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), servers: true})
	waitFor(t, "the agent idle", 30*time.Second, func() bool { return agentState(t, a) == "idle" })
	announce(t, srv, waitDelayLock(t, srv))
	if st := agentState(t, a); st != "shutting down" {
		t.Errorf("status state after PrepareForShutdown(true): %q; want \"shutting down\"", st)
	}
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitDelayLock(t, srv)
	waitFor(t, "the cordon reverted", 30*time.Second, func() bool {
		lt, gns, n := shutdownConds(t, node)
		return !n.Spec.Unschedulable && lt != nil && lt.Reason == "ShutdownCancelled" && gns != nil && gns.Status == corev1.ConditionFalse && gns.Reason == "ShutdownCancelled"
	})
	// The node is back in service and status says so: not "shutting down"
	// for good (a cancelled shutdown left that state behind, found by the
	// fault schedules).
	waitFor(t, "status back to idle", 10*time.Second, func() bool { return agentState(t, a) == "idle" })
	rec.Expect(t, 0, []string{
		cLT + "=True/ShuttingDown", cGNS + "=True/NodeShutdown",
		cGNS + "=False/ShutdownCancelled", cLT + "=False/ShutdownCancelled",
	}, cDIP, cDrained, cMIP, cPlanned)
}

// With the API server down the journal is still written and the lock still
// released within the budget; the cordon and conditions follow when the
// server returns, and the next boot closes the shutdown out.
func TestShutdownWhileAPIDown(t *testing.T) {
	node := "shutdown-offline-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), budget: 3 * time.Second})
	lock := waitDelayLock(t, srv)
	restart, err := env.StopProcess("kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := srv.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err = srv.WaitReleased(ctx, lock.ID)
	took := time.Since(start)
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if rerr := restart(context.Background()); rerr != nil {
		t.Fatalf("restarting kube-apiserver: %v", rerr)
	}
	if err != nil {
		t.Fatalf("the delay lock was not released with the API server down: %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("lock released after %s; the budget is 3s", took)
	}
	if len(doc.Events) != 1 || doc.Events[0].Driver != "lifecycle-agent.x-k8s.io/shutdown" || len(doc.Outbox) == 0 {
		t.Fatalf("journal: events %+v outbox %d; want the shutdown and its queued conditions", doc.Events, len(doc.Outbox))
	}
	var sawIntent bool
	for _, s := range doc.Events[0].Steps {
		sawIntent = sawIntent || (s.Step == "shutdown" && s.Phase == journal.PhaseIntent)
	}
	if !sawIntent {
		t.Fatalf("no shutdown intent in the journal: %+v", doc.Events[0].Steps)
	}
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("7c1d2e3f-0000-4000-8000-000000000002\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The cordon could not be made at the shutdown: the node is still
	// schedulable. Its next boot comes up not Ready yet (the kubelet
	// starting): the agent cordons before it waits, so the node takes no
	// pods until it is ready, as the condition says ("kept cordoned").
	if getNode(t, node).Spec.Unschedulable {
		t.Fatal("the node was cordoned with the API server down")
	}
	if err := testenv.SetNodeReady(context.Background(), env.AdminConfig(), node, false); err != nil {
		t.Fatal(err)
	}
	// The next boot has a fresh logind (the old one still says "preparing").
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	startAgent(t, node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir})
	waitFor(t, "the node cordoned for the shutdown while the next boot waits for it to be ready", 60*time.Second, func() bool {
		lt, _, n := shutdownConds(t, node)
		return lt != nil && strings.Contains(lt.Message, "kept cordoned") && n.Spec.Unschedulable && n.Annotations[v1alpha1.AnnotationCordonedBy] == "shutdown"
	})
	if err := testenv.SetNodeReady(context.Background(), env.AdminConfig(), node, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shutdown closed out after the API server returned", 60*time.Second, func() bool {
		lt, _, n := shutdownConds(t, node)
		return lt != nil && lt.Reason == "ShutdownComplete" && !n.Spec.Unschedulable
	})
}

// drivers.shutdown.enabled=false: no delay lock, a shutdown is not handled.
func TestShutdownDriverDisabled(t *testing.T) {
	node := "shutdown-off-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	off := false
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), configure: func(c *config.Config) { c.Drivers.Shutdown.Enabled = &off }})
	time.Sleep(2 * time.Second)
	if held := heldDelayLocks(srv); len(held) != 0 {
		t.Fatalf("the disabled shutdown driver holds a delay lock: %+v", held)
	}
	if err := srv.EmitPrepareForShutdown(true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if _, gns, n := shutdownConds(t, node); n.Spec.Unschedulable || gns != nil {
		t.Fatalf("the disabled shutdown driver acted: unschedulable=%v GracefulNodeShutdownInProgress=%+v", n.Spec.Unschedulable, gns)
	}
	if !strings.Contains(a.logBuf.String(), "drivers.shutdown.enabled=false") {
		t.Errorf("the log does not say the shutdown driver is off:\n%s", a.logBuf.String())
	}
}

// An agent that (re)starts while logind is already preparing the shutdown
// (it crashed in the delay window and systemd restarted it; or it started
// just after the signal) never saw PrepareForShutdown(true): it must not
// take a delay lock logind would wait on, and it must still journal, post
// and cordon.
func TestShutdownAgentStartsWhilePreparing(t *testing.T) {
	node := "shutdown-late-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	srv.SetPreparingForShutdown(true) // the signal went out before the agent listened
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address()})
	waitFor(t, "ShuttingDown posted and the node cordoned", 30*time.Second, func() bool {
		lt, gns, n := shutdownConds(t, node)
		return lt != nil && lt.Reason == "ShuttingDown" && gns != nil && gns.Status == corev1.ConditionTrue && n.Spec.Unschedulable
	})
	// The agent may take its lock at start before it reads that logind is
	// already preparing; it must let go once the shutdown is prepared, well
	// before logind's InhibitDelayMaxSec (30 s here) would end the wait.
	// (Asserting "none held" the instant the conditions appear raced the
	// release by milliseconds under load.)
	waitFor(t, "no delay lock held by the agent started during the shutdown", 10*time.Second, func() bool {
		return len(heldDelayLocks(srv)) == 0
	})
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if len(doc.Events) != 1 || doc.Events[0].Driver != "lifecycle-agent.x-k8s.io/shutdown" {
		t.Fatalf("journal should hold the shutdown under way: %+v", doc.Events)
	}
}

// logind cancels the shutdown while the agent is down (PrepareForShutdown
// (false) is a signal: nobody replays it). The next start, in the same
// boot, finds the shutdown journaled and logind no longer preparing: it
// reverts, as if it had seen the cancel.
func TestShutdownCancelledWhileAgentDown(t *testing.T) {
	node := "shutdown-cancel-down-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address()})
	announce(t, srv, waitDelayLock(t, srv))
	a.stop(t)
	if err := srv.EmitPrepareForShutdown(false); err != nil { // nobody listening
		t.Fatal(err)
	}
	startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), dir: a.dir})
	waitFor(t, "the cordon reverted after the missed cancel", 30*time.Second, func() bool {
		lt, gns, n := shutdownConds(t, node)
		return !n.Spec.Unschedulable && n.Annotations[v1alpha1.AnnotationCordonedBy] == "" &&
			lt != nil && lt.Reason == "ShutdownCancelled" && lt.Status == corev1.ConditionFalse && gns != nil && gns.Status == corev1.ConditionFalse
	})
	waitDelayLock(t, srv)
}

// logind cancels the shutdown while the API server is unreachable, then
// starts another: the revert (uncordon, conditions) needs the API and is
// retried until the server answers, and meanwhile the new shutdown is
// still journaled and its delay lock released within the budget (a revert
// blocked on the API must not hold the next shutdown up); the last cancel
// is reverted once the server returns.
func TestShutdownCancelledDuringOutage(t *testing.T) {
	node := "shutdown-cancel-offline-node"
	newNode(t, node)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	budget := 3 * time.Second
	startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), budget: budget, rest: proxy.Config(env.NodeConfig(node))})
	released := func(what string) {
		t.Helper()
		lock := waitDelayLock(t, srv)
		start := time.Now()
		if err := srv.EmitPrepareForShutdown(true); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.WaitReleased(ctx, lock.ID); err != nil {
			t.Fatalf("%s: the delay lock was not released: %v", what, err)
		}
		if took := time.Since(start); took > budget+2*time.Second {
			t.Fatalf("%s: the delay lock was released after %s; the budget is %s", what, took, budget)
		}
	}
	released("the first shutdown")
	waitFor(t, "the node cordoned for the shutdown", 30*time.Second, func() bool {
		_, _, n := shutdownConds(t, node)
		return n.Spec.Unschedulable
	})
	proxy.Cut()
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the revert fails meanwhile
	released("a second shutdown during the outage, after a cancel not yet reverted")
	if err := srv.EmitPrepareForShutdown(false); err != nil {
		t.Fatal(err)
	}
	waitDelayLock(t, srv)
	time.Sleep(2 * time.Second)
	proxy.Heal()
	waitFor(t, "the cordon reverted once the API server answered", 30*time.Second, func() bool {
		lt, gns, n := shutdownConds(t, node)
		return !n.Spec.Unschedulable && lt != nil && lt.Reason == "ShutdownCancelled" && gns != nil && gns.Status == corev1.ConditionFalse
	})
}

// A shutdown while the API server does not answer at all (a blackholed
// link: requests hang until the shutdown budget runs out, as when the
// control plane was powered off first): the delay lock is released within
// the budget, and the cordon the shutdown could not make is journaled as
// its own before any API call, so the next boot makes it before its wait.
// (In this session's first version of the close-out's serialisation the
// record came after the conditions' API call, and a budget spent there
// skipped it.)
func TestShutdownWhileAPIBlackholed(t *testing.T) {
	node := "shutdown-blackhole-node"
	newNode(t, node)
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	budget := 2 * time.Second
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), budget: budget, rest: proxy.Config(env.NodeConfig(node))})
	lock := waitDelayLock(t, srv)
	proxy.Blackhole()
	start := time.Now()
	announce(t, srv, lock)
	if took := time.Since(start); took > budget+2*time.Second {
		t.Errorf("the delay lock was released after %s; the budget is %s", took, budget)
	}
	a.stop(t)
	proxy.Heal()
	doc := exportJournal(t, a.Journal)
	if len(doc.Owned) != 1 || doc.Owned[0].Name != "shutdown" {
		t.Fatalf("journal after a shutdown with the API server blackholed: owned %+v, want the shutdown's cordon", doc.Owned)
	}
	if getNode(t, node).Spec.Unschedulable {
		t.Fatal("the node was cordoned with the API server blackholed")
	}
	if err := testenv.SetNodeReady(context.Background(), env.AdminConfig(), node, false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile), []byte("8c5f4a01-3d7e-4f60-9b2c-4d5e6f7a8b9c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	startAgent(t, node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir})
	waitFor(t, "the node cordoned for the shutdown while the next boot waits for it to be ready", 60*time.Second, func() bool {
		n := getNode(t, node)
		return n.Spec.Unschedulable && n.Annotations[v1alpha1.AnnotationCordonedBy] == "shutdown"
	})
	if err := testenv.SetNodeReady(context.Background(), env.AdminConfig(), node, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shutdown closed out", 60*time.Second, func() bool {
		lt, _, n := shutdownConds(t, node)
		return lt != nil && lt.Reason == "ShutdownComplete" && !n.Spec.Unschedulable
	})
}
