package crash

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// TestGPUDriverUpgradeReleasesNVML: while the GPU Operator replaces the
// NVIDIA driver (its upgrade state label on the Node at
// pod-restart-required) the running agent — the real binary, on go-nvml's
// mock with device node files its NVML session holds open as libnvidia-ml
// holds /dev/nvidia* — lets go of every node, so that the driver manager
// can unload nvidia.ko; a gpu-reset asked for meanwhile is refused naming
// the upgrade; when the state moves on (validation-required) the agent
// opens NVML again on its own and GPUHealthy is True, without a restart.
func TestGPUDriverUpgradeReleasesNVML(t *testing.T) {
	ctx := context.Background()
	node := "gpu-upgrade"
	kubelet := chaosNode(t, node)
	c := chaosCase(t, node, node+"-reset", "", env.NodeConfig(node))
	c.kubelet = kubelet
	devDir := filepath.Join(c.dir, "dev")
	if err := os.Mkdir(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c.extraEnv = append(c.extraEnv, "LIFECYCLE_AGENT_TEST_NVML=dgxh100", "LIFECYCLE_AGENT_TEST_GPU_DEVICES="+devDir)
	lc, err := apiclient.NewLifecycleClients(env.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	health := func() string { return gpuHealthy(ctx, cs, node) }
	a := c.start(t, "")
	defer func() { _ = a.stop(30 * time.Second) }()
	pid := a.cmd.Process.Pid
	held := func() string { return fmt.Sprint(heldNodes(pid, devDir), " device nodes held") }
	waitFor(t, "GPUHealthy True", 60*time.Second, a, func() bool {
		return strings.HasPrefix(health(), string(corev1.ConditionTrue)+"/")
	}, health)
	if n := heldNodes(pid, devDir); n != 8 {
		t.Fatalf("the agent holds %d of the 8 device nodes before the upgrade; the test's premise is that its NVML session holds them all", n)
	}

	setLabel(t, cs, node, agent.DriverUpgradeLabel, "drain-required")
	setLabel(t, cs, node, agent.DriverUpgradeLabel, "pod-restart-required")
	waitFor(t, "the agent to let go of every device node", 30*time.Second, a, func() bool {
		return heldNodes(pid, devDir) == 0
	}, held)
	waitFor(t, "GPUHealthy Unknown/DriverUpgrade while the driver is replaced", 30*time.Second, a, func() bool {
		return health() == string(corev1.ConditionUnknown)+"/"+agent.ReasonDriverUpgrade
	}, health)

	tn := node + "-gpu-reset"
	got := runGPUReset(t, lc, c, a, tn, "0")
	if got.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(got.Status.Message, "replacing the NVIDIA driver") {
		t.Errorf("gpu-reset during the driver upgrade ended %s: %q; want Failed naming the upgrade", got.Status.ClaimStatus, got.Status.Message)
	}
	if n := heldNodes(pid, devDir); n != 0 {
		t.Errorf("after the refused gpu-reset the agent holds %d device nodes during the upgrade", n)
	}

	setLabel(t, cs, node, agent.DriverUpgradeLabel, "validation-required")
	waitFor(t, "the agent to open NVML again on the new driver", 30*time.Second, a, func() bool {
		return heldNodes(pid, devDir) == 8
	}, held)
	waitFor(t, "GPUHealthy True after the upgrade", 60*time.Second, a, func() bool {
		return strings.HasPrefix(health(), string(corev1.ConditionTrue)+"/")
	}, health)
	if a.exited() {
		t.Fatalf("the agent exited: %s", a.exit())
	}
	for _, w := range []string{"releasing NVML so that the module can unload", "opening NVML on the new driver", "GPU monitor resumed"} {
		if !strings.Contains(a.logText(), w) {
			t.Errorf("the agent did not log %q", w)
		}
	}
}

// heldNodes counts the files under dir that process pid holds open.
func heldNodes(pid int, dir string) int {
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fds)
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range ents {
		if p, err := os.Readlink(filepath.Join(fds, e.Name())); err == nil && filepath.Dir(p) == dir {
			n++
		}
	}
	return n
}

// setLabel sets a label on node as an admin (the GPU Operator's upgrade
// controller does).
func setLabel(t *testing.T, cs kubernetes.Interface, node, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
