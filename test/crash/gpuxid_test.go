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
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
)

// TestGPUXIDsAcrossCrash: the real agent on go-nvml's mock of a DGX H100
// reads an XID the NVIDIA module logged before it started from the kernel
// log (a file in /dev/kmsg's format: the test build never reads the
// host's) and publishes GPUHealthy False for that GPU. It is SIGKILLed;
// while it is down the kernel's ring buffer wraps (the first XID's record
// is overwritten) and another XID is logged; started again, it publishes
// both: the first from its journal, the second from the kernel log, and
// it logs that records were lost before it could read them.
func TestGPUXIDsAcrossCrash(t *testing.T) {
	ctx := context.Background()
	node := "gpu-xid-node"
	kubelet := chaosNode(t, node)
	c := chaosCase(t, node, "gpu-xid", chaosConfig, env.NodeConfig(node))
	c.kubelet = kubelet
	klog := filepath.Join(c.dir, "kmsg")
	bus := devicestest.New(devicestest.DGXH100).PCIBusID
	line := func(seq uint64, gpu int, xid uint64) string {
		return fmt.Sprintf("4,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=4242, name=train, test\n", seq, seq*1000, devices.BusKey(bus(gpu)), xid)
	}
	if err := os.WriteFile(klog, []byte("6,1,100,-;Linux version 6.1.0\n"+line(2, 2, 79)), 0o600); err != nil {
		t.Fatal(err)
	}
	c.extraEnv = append(c.extraEnv, "LIFECYCLE_AGENT_TEST_NVML=dgxh100", "LIFECYCLE_AGENT_TEST_KERNEL_LOG="+klog)
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	health := func() string { return gpuHealthy(ctx, cs, node) }
	a := c.start(t, "")
	waitFor(t, "GPUHealthy False for the XID in the kernel log", 60*time.Second, a, func() bool {
		return health() == string(corev1.ConditionFalse)+"/GPU2:XID79"
	}, health)
	a.kill()
	wrapped := "6,40,9000,-;usb 1-1: new high-speed USB device\n" + line(41, 4, 48)
	if err := os.WriteFile(klog, []byte(wrapped), 0o600); err != nil {
		t.Fatal(err)
	}
	a = c.start(t, "")
	waitFor(t, "GPUHealthy with both XIDs after the crash", 60*time.Second, a, func() bool {
		return health() == string(corev1.ConditionFalse)+"/GPU2:XID79,GPU4:XID48"
	}, health)
	if err := a.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(a.log); !strings.Contains(string(b), "kernel log records were overwritten before the agent read them") {
		t.Errorf("the restarted agent did not log the lost kernel log records:\n%s", tail(a.log, 40))
	}
}

// gpuHealthy is the node's GPUHealthy condition as Status/Reason, "(none)"
// or the read error.
func gpuHealthy(ctx context.Context, cs kubernetes.Interface, node string) string {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "error: " + err.Error()
	}
	for _, cond := range n.Status.Conditions {
		if cond.Type == devices.ConditionType {
			return string(cond.Status) + "/" + cond.Reason
		}
	}
	return "(none)"
}
