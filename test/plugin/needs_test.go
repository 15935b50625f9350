package plugin

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// rolloutFor is the rollout group the command printed ("rollout G: ...").
func rolloutFor(t *testing.T, stdout string) string {
	t.Helper()
	for _, line := range strings.Split(stdout, "\n") {
		if rest, ok := strings.CutPrefix(line, "rollout "); ok {
			if g, _, ok := strings.Cut(rest, ": "); ok {
				return g
			}
		}
	}
	t.Fatalf("no rollout line in:\n%s", stdout)
	return ""
}

// `rollout reboot --needs-reboot` (issue 15.1) reboots exactly the nodes
// whose agents report RebootRequired=True (their sentinel file exists), one
// at a time; run again it adopts its own events; a need that comes back
// after its reboot is work again; no need: nothing to do, exit 0.
func TestRolloutNeedsReboot(t *testing.T) {
	nodes := nodeNames("needs", 3)
	agents := startNodes(t, nodes...)
	requireTransition(t, nodes[0], "reboot")
	sel := "test=" + t.Name()
	reports := func(node string, status corev1.ConditionStatus) func() bool {
		return func() bool {
			n, err := core.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range n.Status.Conditions {
				if string(c.Type) == v1alpha1.NodeConditionRebootRequired {
					return c.Status == status
				}
			}
			return false
		}
	}
	need := func(a *agentProc, on bool) {
		t.Helper()
		if on {
			if err := os.WriteFile(a.sentinel, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			waitFor(t, a.node+" RebootRequired=True", 30*time.Second, reports(a.node, corev1.ConditionTrue))
			return
		}
		if err := os.Remove(a.sentinel); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		waitFor(t, a.node+" RebootRequired=False", 30*time.Second, reports(a.node, corev1.ConditionFalse))
	}
	need(agents[1], false)
	need(agents[0], true)
	need(agents[2], true)

	r := plugin(t, 150*time.Second, "rollout", "reboot", "--needs-reboot", "-l", sel, "--max-concurrent", "1", "--wait")
	wantExit(t, r, 0, "rollout --needs-reboot")
	wantContains(t, r.stdout, "reboot on 2 node(s)", "rollout --needs-reboot")
	group := rolloutFor(t, r.stdout)
	evs := eventsWithLabel(t, rolloutLabel+"="+group)
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Spec.BindingNode)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Errorf("event %s: %s (%s)", ev.Name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
	sort.Strings(got)
	if want := []string{nodes[0], nodes[2]}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events for %v; want exactly the nodes that need a reboot, %v", got, want)
	}
	first := map[string]string{}
	for _, ev := range evs {
		first[ev.Spec.BindingNode] = string(ev.UID)
	}

	// The simulated reboot leaves the sentinels: the same rollout again
	// adopts both events, done, and reboots nothing.
	r = plugin(t, 60*time.Second, "rollout", "reboot", "--needs-reboot", "-l", sel, "--max-concurrent", "1", "--wait")
	wantExit(t, r, 0, "the same rollout again")
	wantContains(t, r.stdout, "rollout "+group+":", "the same rollout again")
	wantContains(t, r.stdout, "done 2/2", "the same rollout again")

	// nodes[0] is fine now; nodes[2] needs a reboot again after its
	// reboot: only it runs again, with a new event.
	need(agents[0], false)
	need(agents[2], false)
	// Times on the API are whole seconds: a need that comes back within
	// the second its reboot ended counts as the same need (never two
	// reboots for one need), so come back a second later.
	time.Sleep(1100 * time.Millisecond)
	need(agents[2], true)
	r = plugin(t, 150*time.Second, "rollout", "reboot", "--needs-reboot", "-l", sel, "--max-concurrent", "1", "--wait")
	wantExit(t, r, 0, "the need came back")
	wantContains(t, r.stdout, "reboot on 1 node(s)", "the need came back")
	wantContains(t, r.stdout, "retrying "+nodes[2]+": it reports RebootRequired=True again", "the need came back")
	for _, ev := range eventsWithLabel(t, rolloutLabel+"="+group) {
		if ev.Spec.BindingNode == nodes[2] && (string(ev.UID) == first[nodes[2]] || ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded) {
			t.Errorf("%s: event %s (uid %s, %s); want a new one, Succeeded", nodes[2], ev.Name, ev.UID, ev.Status.ClaimStatus)
		}
	}

	need(agents[2], false)
	r = plugin(t, 30*time.Second, "rollout", "reboot", "--needs-reboot", "-l", sel)
	wantExit(t, r, 0, "no node needs a reboot")
	wantContains(t, r.stdout, "no selected node reports RebootRequired=True: nothing to do", "no node needs a reboot")
}

// `rollout gpu-reset --needs-gpu-reset` (issue 15.1) on agents whose NVML
// is go-nvml's mock of a DGX H100 with faults set at start (the test
// build's LIFECYCLE_AGENT_TEST_NVML_FAULTS): the real GPU monitor reports
// GPUResetRequired naming the GPUs, and GPU 6's NODE_REBOOT as
// RebootRequired; the rollout resets exactly the nodes that report the
// need, each event with gpus= the GPUs its node names (and drain=true for
// DRAIN_AND_RESET), one at a time; the
// healthy node gets none. Host actions are simulated, so the mock's GPUs
// keep their faults and the same rollout again adopts its done events.
func TestRolloutNeedsGPUReset(t *testing.T) {
	nodes := nodeNames("gpuneeds", 3)
	mock := "LIFECYCLE_AGENT_TEST_NVML=dgxh100"
	agents := startNodesEnv(t, map[string][]string{
		nodes[0]: {mock, "LIFECYCLE_AGENT_TEST_NVML_FAULTS=3:GPU_RESET"},
		nodes[1]: {mock},
		nodes[2]: {mock, "LIFECYCLE_AGENT_TEST_NVML_FAULTS=5:DRAIN_AND_RESET,6:NODE_REBOOT,1:REMAP_FAILURE"},
	}, nodes...)
	requireTransition(t, nodes[0], "gpu-reset")
	reports := func(node, typ string, status corev1.ConditionStatus, reason, msg string) func() bool {
		return func() bool {
			n, err := core.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			if err != nil {
				return false
			}
			c := nodeCondition(n, typ)
			return c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, msg)
		}
	}
	waitFor(t, nodes[0]+" GPUResetRequired=True", 30*time.Second, reports(nodes[0], v1alpha1.NodeConditionGPUResetRequired,
		corev1.ConditionTrue, "GPU3:RecoveryAction_GPU_RESET", "1 of 8 GPUs needs a reset"))
	waitFor(t, nodes[1]+" GPUResetRequired=False", 30*time.Second, reports(nodes[1], v1alpha1.NodeConditionGPUResetRequired,
		corev1.ConditionFalse, "NotRequired", "no GPU needs a reset (8 GPUs)"))
	waitFor(t, nodes[2]+" GPUResetRequired=True", 30*time.Second, reports(nodes[2], v1alpha1.NodeConditionGPUResetRequired,
		corev1.ConditionTrue, "GPU5:RecoveryAction_DRAIN_AND_RESET", "(index 5)"))
	waitFor(t, nodes[2]+" GPUReplacementRequired=True", 30*time.Second, reports(nodes[2], v1alpha1.NodeConditionGPUReplacementRequired,
		corev1.ConditionTrue, "GPU1:RemappedRowsFailure", "1 of 8 GPUs needs a replacement"))
	// The sentinel file is absent: the GPU alone asks for the reboot.
	waitFor(t, nodes[2]+" RebootRequired=True/GPUHealth", 30*time.Second, reports(nodes[2], v1alpha1.NodeConditionRebootRequired,
		corev1.ConditionTrue, "GPUHealth", "(index 6): RecoveryAction_NODE_REBOOT; "+agents[2].sentinel+" absent"))
	waitFor(t, nodes[0]+" RebootRequired=False", 30*time.Second, reports(nodes[0], v1alpha1.NodeConditionRebootRequired,
		corev1.ConditionFalse, "SentinelFile", "absent"))

	sel := "test=" + t.Name()
	r := plugin(t, 150*time.Second, "rollout", "gpu-reset", "--needs-gpu-reset", "-l", sel, "--max-concurrent", "1", "--wait")
	wantExit(t, r, 0, "rollout --needs-gpu-reset")
	wantContains(t, r.stdout, "gpu-reset on 2 node(s)", "rollout --needs-gpu-reset")
	group := rolloutFor(t, r.stdout)
	got := map[string]string{}
	for _, ev := range eventsWithLabel(t, rolloutLabel+"="+group) {
		got[ev.Spec.BindingNode] = fmt.Sprint(ev.Spec.Parameters)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Errorf("event %s: %s (%s)", ev.Name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
	if want := map[string]string{nodes[0]: "map[gpus:3]", nodes[2]: "map[drain:true gpus:5]"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events (node: parameters) %v; want exactly the nodes that need a reset, with their GPUs: %v", got, want)
	}

	r = plugin(t, 60*time.Second, "rollout", "gpu-reset", "--needs-gpu-reset", "-l", sel, "--max-concurrent", "1", "--wait")
	wantExit(t, r, 0, "the same rollout again")
	wantContains(t, r.stdout, "rollout "+group+":", "the same rollout again")
	wantContains(t, r.stdout, "done 2/2", "the same rollout again")
}
