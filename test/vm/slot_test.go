package vm_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
	vm "github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// hostAgent is the package's agent binary run on the host in simulate mode
// for another node of the cluster.
type hostAgent struct {
	node, log string
	cmd       *exec.Cmd
	done      chan struct{}
}

// startHostAgent runs the agent of the package under test (extracted with
// dpkg-deb) on the host for node (created, with a kubelet stand-in), in
// simulate host mode, and waits for its reboot transition.
func startHostAgent(t *testing.T, c *vm.Cluster, deb, node string) *hostAgent {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, filepath.Join(dir, "root")).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	admin := c.Env.AdminConfig()
	if err := testenv.CreateNode(ctx, admin, node, nil); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if _, err := testenv.RunKubeletStandIn(kctx, admin, node); err != nil {
		t.Fatal(err)
	}
	kc, err := c.Env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(conf, []byte("logLevel: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock, err := os.MkdirTemp("", "lavh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sock) })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	h := &hostAgent{node: node, log: filepath.Join(c.Dir, "host-agent-"+node+".log"), done: make(chan struct{})}
	lf, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	h.cmd = exec.Command(filepath.Join(dir, "root", "usr", "bin", "lifecycle-agent"), "run", "--host-mode", "simulate",
		"--node-name", node, "--kubeconfig", kc, "--journal", filepath.Join(dir, "journal.db"),
		"--socket", filepath.Join(sock, "agent.sock"), "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "--config", conf)
	h.cmd.Stdout, h.cmd.Stderr = lf, lf
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.cmd.Wait(); lf.Close(); close(h.done) }()
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.done:
		case <-time.After(20 * time.Second):
			_ = h.cmd.Process.Kill()
		}
		if t.Failed() {
			b, _ := os.ReadFile(h.log)
			t.Logf("---- host agent %s:\n%s", node, lastLines(string(b), 40))
		}
	})
	c.WaitTransition(t, node+"-reboot", time.Minute)
	return h
}

func createBudgetedReboot(t *testing.T, c *vm.Cluster, name, node string, budget *v1alpha1.DisruptionBudget) {
	t.Helper()
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: node + "-reboot", BindingNode: node, Disruption: budget}}
	if _, err := c.Lifecycle.Events.Create(context.Background(), ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// slotHoldOff is how long the guest stays powered off in its reboot: longer
// than any Lease the agent writes (40 s), as a bare-metal POST can be.
const slotHoldOff = 60 * time.Second

// (f) The disruption budget across a reboot that outlasts every Lease: the
// VM guest and a second node (the same package's agent on the host, in
// simulate mode) share a group with maxConcurrent 1. The guest takes the
// slot and reboots for real; QEMU holds it powered off for slotHoldOff
// before it boots. The host node's event must not get the slot — run no
// step — until the guest's event has ended.
func TestScenarioSlotHeldWhilePoweredOff(t *testing.T) {
	defer vm.Scenario(t)()
	a := startAgentNodeWith(t, vm.Options{NoReboot: true})
	peer := startHostAgent(t, a.c, a.deb, "vm-peer")
	budget := &v1alpha1.DisruptionBudget{Group: "vm-rack", MaxConcurrent: 1}

	createBudgetedReboot(t, a.c, "slot-guest", vm.NodeName, budget)
	a.c.WatchEvent(t, "slot-guest", 3*time.Minute, "the guest's reboot step running", stepRunning("reboot"))
	createBudgetedReboot(t, a.c, "slot-peer", peer.node, budget)
	off := time.Now()
	a.v.WaitPoweredOff(off)
	t.Logf("guest powered off in its reboot; holding it off for %s", slotHoldOff)
	for time.Since(off) < slotHoldOff {
		if e := a.c.Event(t, "slot-peer"); e.Status.CurrentStep != "" || e.Status.ClaimStatus.Finished() {
			t.Fatalf("while the guest (slot holder) is powered off %s, the other node's event went on: %s", time.Since(off).Round(time.Second), vm.DescribeEvent(e))
		}
		time.Sleep(time.Second)
	}
	if e := a.c.Event(t, "slot-peer"); meta(e, v1alpha1.ConditionWaitingForDisruptionBudget) == nil || meta(e, v1alpha1.ConditionWaitingForDisruptionBudget).Status != metav1.ConditionTrue {
		t.Errorf("the other node's event does not say it waits for the budget: %s", vm.DescribeEvent(e))
	}
	a.v.PowerOn()
	guest := a.checkSucceeded(t, "slot-guest")
	peerEv := a.c.WaitEvent(t, "slot-peer", 3*time.Minute, "the other node's event to end", finished)
	if peerEv.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("the other node's event: %s", vm.DescribeEvent(peerEv))
	}
	first := peerEv.Status.Steps[0].StartTime
	if first == nil || guest.Status.CompletionTime == nil || first.Before(guest.Status.CompletionTime) {
		t.Errorf("the other node's first step started at %v, before the guest's event ended at %v: two nodes of a group of 1 disrupted at once", first, guest.Status.CompletionTime)
	}
	t.Logf("guest ended %s; the other node's first step started %s", guest.Status.CompletionTime, first)
}
