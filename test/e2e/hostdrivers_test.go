package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
)

func bootID(t *testing.T, a *testAgent) string {
	b, err := os.ReadFile(filepath.Join(a.dir, hostops.SimulatedBootIDFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func waitTransition(t *testing.T, name string) {
	t.Helper()
	waitFor(t, "transition "+name, 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil
	})
}

func setReady(t *testing.T, node string, status corev1.ConditionStatus) {
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	n, err := cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = status
		}
	}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// The reboot driver in simulate mode: drain, reboot (a new simulated boot
// ID), Ready, uncordon; and two ways to fail.
func TestRebootDriver(t *testing.T) {
	node, spare := "reboot-node", "reboot-spare"
	newNode(t, node)
	newNode(t, spare)
	startWorkload(t, "reboot-ns", node, spare, 2, 1)
	a := startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) { c.Reboot.ReadyTimeout = 4 * time.Second }})
	waitTransition(t, transitionName(node, "reboot"))
	before := bootID(t, a)
	createEvent(t, "reboot-1", node, transitionName(node, "reboot"), nil, nil)
	ev := waitEvent(t, "reboot-1", 2*time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("reboot: %s %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if got := stepStates(ev); got != "cordon=Done,evict=Done,wait-empty=Done,reboot=Done,wait-ready=Done,wait-workloads-ready=Done,uncordon=Done" {
		t.Fatalf("steps = %s", got)
	}
	if after := bootID(t, a); after == before {
		t.Fatal("the simulated reboot did not change the boot ID")
	}
	if n := getNode(t, node); n.Spec.Unschedulable {
		t.Fatal("node still cordoned after RebootComplete")
	}
	if c := nodeCondition(getNode(t, node), v1alpha1.NodeConditionLifecycleTransition); c == nil || c.Reason != "RebootComplete" {
		t.Fatalf("LifecycleTransition = %+v", c)
	}

	t.Run("kubelet never Ready", func(t *testing.T) {
		setReady(t, node, corev1.ConditionFalse)
		defer setReady(t, node, corev1.ConditionTrue)
		createEvent(t, "reboot-notready", node, transitionName(node, "reboot"), map[string]string{"drain": "false"}, nil)
		ev := waitEvent(t, "reboot-notready", 2*time.Minute)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "wait-ready") {
			t.Fatalf("got %s %q; want Failed in wait-ready", ev.Status.ClaimStatus, ev.Status.Message)
		}
	})
	t.Run("bad rebootAttempts", func(t *testing.T) {
		createEvent(t, "reboot-badparam", node, transitionName(node, "reboot"), map[string]string{"rebootAttempts": "0"}, nil)
		ev := waitEvent(t, "reboot-badparam", time.Minute)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "rebootAttempts") {
			t.Fatalf("got %s %q; want Failed naming rebootAttempts", ev.Status.ClaimStatus, ev.Status.Message)
		}
		if getNode(t, node).Spec.Unschedulable {
			t.Fatal("a refused reboot touched the node")
		}
	})
}

// The os-upgrade driver in simulate mode: a profile from local config, the
// version verified after the (simulated) reboot; a mismatch and an unknown
// profile fail with the reason.
func TestOSUpgradeDriver(t *testing.T) {
	node := "upgrade-node"
	newNode(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		c.Reboot.ReadyTimeout = 10 * time.Second
		c.OSUpgrade.Profiles = map[string]config.OSUpgradeProfile{
			"debian-full-upgrade": {Command: []string{"/usr/bin/apt-get", "-y", "full-upgrade"}, Timeout: time.Minute, RebootPolicy: config.RebootAlways},
		}
	}})
	if err := os.WriteFile(filepath.Join(a.dir, hostops.SimulatedOSReleaseFile), []byte("VERSION_ID=\"13\"\nKERNEL_RELEASE=6.12.0-1-amd64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitTransition(t, transitionName(node, "os-upgrade"))
	rec := recordConditions(t, node)
	const (
		lt, dip, drained = v1alpha1.NodeConditionLifecycleTransition, v1alpha1.NodeConditionDrainInProgress, v1alpha1.NodeConditionDrained
		planned, mip     = v1alpha1.NodeConditionMaintenancePlanned, v1alpha1.NodeConditionMaintenanceInProgress
	)
	tests := []struct {
		name   string
		params map[string]string
		want   v1alpha1.LifecycleEventClaimStatus
		says   string
		// the Node conditions it writes, in order (docs/conditions.md),
		// and prefixes it must never write
		conds []string
		never []string
	}{
		{name: "profile", params: map[string]string{"profile": "debian-full-upgrade", "targetVersionID": "13", "targetKernel": "6.12.0-1-amd64"}, want: v1alpha1.LifecycleEventSucceeded,
			conds: []string{lt + "=True/OSUpgradeStarted", dip + "=True/AdminRequested", dip + "=False/DrainCompleted", drained + "=True/DrainCompleted",
				mip + "=True/AdminRequested", drained + "=False/ReturnedToService", mip + "=False/MaintenanceCompleted", lt + "=False/OSUpgradeComplete"},
			never: []string{planned}},
		// The version check after the boot fails: the node is returned to
		// service all the same, and the conditions say the event failed.
		{name: "version mismatch", params: map[string]string{"profile": "debian-full-upgrade", "targetVersionID": "14"}, want: v1alpha1.LifecycleEventFailed, says: "14",
			conds: []string{lt + "=True/OSUpgradeStarted", drained + "=True/DrainCompleted", mip + "=True/AdminRequested",
				drained + "=False/ReturnedToService", mip + "=False/EventFailed", lt + "=False/Failed"},
			never: []string{planned, lt + "=False/OSUpgradeComplete"}},
		// Refused before any step: no drain, no maintenance.
		{name: "unknown profile", params: map[string]string{"profile": "rm-rf"}, want: v1alpha1.LifecycleEventFailed, says: "debian-full-upgrade",
			never: []string{dip, mip, planned, drained + "=True"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := rec.Mark()
			name := "upgrade-" + strings.ReplaceAll(tc.name, " ", "-")
			createEvent(t, name, node, transitionName(node, "os-upgrade"), tc.params, nil)
			ev := waitEvent(t, name, 2*time.Minute)
			if ev.Status.ClaimStatus != tc.want || !strings.Contains(ev.Status.Message, tc.says) {
				t.Fatalf("got %s %q; want %s saying %q", ev.Status.ClaimStatus, ev.Status.Message, tc.want, tc.says)
			}
			if getNode(t, node).Spec.Unschedulable {
				t.Fatal("node left cordoned")
			}
			rec.Expect(t, m, tc.conds, tc.never...)
		})
	}
}

// An exec driver from local config: parameters reach it only when declared.
func TestExecDriver(t *testing.T) {
	node := "exec-node"
	newNode(t, node)
	startAgent(t, node, agentOpts{retention: time.Hour, configure: func(c *config.Config) {
		c.Exec.Drivers = []config.ExecDriver{{
			Name: "example.com/bios-update", Start: "BiosUpdateStarted", End: "BiosUpdateComplete", SLA: time.Minute,
			Params: []string{"version"},
			Steps: []config.ExecStep{
				{Name: "flash", Command: []string{"/usr/bin/true"}, Timeout: 10 * time.Second},
				{Name: "verify", Command: []string{"/usr/bin/true"}, Timeout: 10 * time.Second},
			},
		}}
	}})
	waitTransition(t, transitionName(node, "bios-update"))
	createEvent(t, "exec-1", node, transitionName(node, "bios-update"), map[string]string{"version": "2.1"}, nil)
	ev := waitEvent(t, "exec-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || stepStates(ev) != "flash=Done,verify=Done" {
		t.Fatalf("exec: %s %s (%s)", ev.Status.ClaimStatus, ev.Status.Message, stepStates(ev))
	}
	createEvent(t, "exec-undeclared", node, transitionName(node, "bios-update"), map[string]string{"cmd": "rm -rf /"}, nil)
	ev = waitEvent(t, "exec-undeclared", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, "parameters.cmd") {
		t.Fatalf("undeclared parameter: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
}
