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
	"k8s.io/client-go/util/retry"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

// TestSimulateModeRealReboot: an operator tries the agent in host.mode
// simulate on a real node ("to try the agent on a node safely"), and the
// machine is shut down for real — by an admin, or a power cut after the
// announcement. The agent cordons for the shutdown as in real mode. At the
// next boot the machine's boot ID is new, and the kubelet reports it:
//   - the simulated host starts a new boot too, so the shutdown is closed
//     out (before, the simulated boot ID, kept in the state directory, was
//     the one the shutdown was journaled in: "the shutdown did not happen",
//     and the node stayed cordoned for good);
//   - wait-ready does not compare the kubelet's boot ID with the simulated
//     one (before, it never matched: the node stayed cordoned after
//     reboot.readyTimeout, NotReadyAfterShutdown).
func TestSimulateModeRealReboot(t *testing.T) {
	node := "simulate-real-reboot"
	newNode(t, node)
	const bootA, bootB = "6a1b2c3d-0000-4000-8000-00000000000a", "6a1b2c3d-0000-4000-8000-00000000000b"
	hostBoot := filepath.Join(t.TempDir(), "boot_id")
	setBoot := func(id string) {
		t.Helper()
		if err := os.WriteFile(hostBoot, []byte(id+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		setNodeBootID(t, node, id) // the kubelet of that boot reports it
	}
	setBoot(bootA)
	srv := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	a := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv.Address(), hostBootID: hostBoot})
	announce(t, srv, waitDelayLock(t, srv))
	if n := getNode(t, node); !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "shutdown" {
		t.Fatalf("simulate mode: the node is not cordoned for the shutdown: %v %v", n.Spec.Unschedulable, n.Annotations)
	}
	a.stop(t)

	// The machine's next boot: only the real boot ID changes (nothing
	// writes the simulated one).
	setBoot(bootB)
	srv2 := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	b := startAgent(t, node, agentOpts{retention: time.Hour, logind: srv2.Address(), dir: a.dir, hostBootID: hostBoot})
	waitFor(t, "ShutdownComplete and the node uncordoned after the machine's reboot", 30*time.Second, func() bool {
		lt, _, n := shutdownConds(t, node)
		return lt != nil && lt.Reason == "ShutdownComplete" && lt.Status == corev1.ConditionFalse && !n.Spec.Unschedulable
	})
	if n := getNode(t, node); n.Annotations[v1alpha1.AnnotationCordonedBy] != "" {
		t.Errorf("cordon annotation left: %v", n.Annotations)
	}
	log := b.logBuf.String()
	for _, want := range []string{"the machine rebooted since the simulated boot began", "simulate: its boot ID is not compared"} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's log has no %q:\n%s", want, log)
		}
	}
}

// setNodeBootID writes status.nodeInfo.bootID, as the node's kubelet does
// when it starts in a boot.
func setNodeBootID(t *testing.T, node, id string) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n := getNode(t, node)
		n.Status.NodeInfo.BootID = id
		_, err := cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}
