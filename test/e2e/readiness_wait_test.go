package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// maintenanceMessages records, from a watch on the Node, every change of
// its MaintenanceInProgress condition as "Status/Reason: message", in the
// order the API server stored them.
type maintenanceMessages struct {
	mu   sync.Mutex
	seen []string
}

func watchMaintenance(t *testing.T, r *readinessNode) *maintenanceMessages {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := r.cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", r.node).String()})
	if err != nil {
		t.Fatal(err)
	}
	m := &maintenanceMessages{}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			c := nodeCondition(n, v1alpha1.NodeConditionMaintenanceInProgress)
			if c == nil {
				continue
			}
			v := string(c.Status) + "/" + c.Reason + ": " + c.Message
			m.mu.Lock()
			if len(m.seen) == 0 || m.seen[len(m.seen)-1] != v {
				m.seen = append(m.seen, v)
			}
			m.mu.Unlock()
		}
	}()
	return m
}

func (m *maintenanceMessages) all() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.seen...)
}

// last is the condition as the API server holds it now (as last watched).
func (m *maintenanceMessages) last() string {
	s := m.all()
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// TestReadinessWaitOnNodeCondition: while the event waits for the node's
// workloads, the Node's MaintenanceInProgress condition (what `kubectl
// describe node` shows) names what is not back yet, as the event's status
// does, and follows it as it changes: both missing, then only the GPUs,
// then complete. It is written when the missing set changes, not at every
// poll: each waiting message the Node ever held is one of those two.
func TestReadinessWaitOnNodeCondition(t *testing.T) {
	node := "ready-cond"
	r := newReadinessNode(t, node)
	m := watchMaintenance(t, r)
	startAgent(t, node, agentOpts{retention: time.Hour})
	r.startReboot("ready-cond-1")
	r.setPodReady(false)
	r.setGPUs(0)
	r.setReady(true)
	ds := "DaemonSet ready-cond/device-plugin has no Ready pod on the node"
	gpus := "allocatable nvidia.com/gpu is 0 of 8"
	both := "True/AdminRequested: event ready-cond-1 (transition ready-cond-reboot): in progress: " + drivers.ReadinessWaiting + ds + "; " + gpus
	onlyGPUs := "True/AdminRequested: event ready-cond-1 (transition ready-cond-reboot): in progress: " + drivers.ReadinessWaiting + gpus
	waitFor(t, "MaintenanceInProgress naming the DaemonSet and the GPUs", time.Minute, func() bool { return m.last() == both })
	lc := clients(t, env.AdminConfig())
	ev, err := lc.Events.Get(context.Background(), "ready-cond-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Status.Message != drivers.ReadinessWaiting+ds+"; "+gpus {
		t.Errorf("the event's status %q, want it to name what the Node's condition names", ev.Status.Message)
	}
	r.setPodReady(true)
	waitFor(t, "MaintenanceInProgress naming only the GPUs", time.Minute, func() bool { return m.last() == onlyGPUs })
	r.setGPUs(8)
	ev = waitEvent(t, "ready-cond-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("reboot ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	waitFor(t, "MaintenanceInProgress False/MaintenanceCompleted", 30*time.Second, func() bool {
		return strings.HasPrefix(m.last(), "False/MaintenanceCompleted: ")
	})
	var waiting []string
	for _, s := range m.all() {
		if strings.Contains(s, drivers.ReadinessWaiting) {
			waiting = append(waiting, s)
		}
	}
	if len(waiting) != 2 || waiting[0] != both || waiting[1] != onlyGPUs {
		t.Errorf("MaintenanceInProgress while waiting:\n  %s\nwant exactly\n  %s\n  %s", strings.Join(waiting, "\n  "), both, onlyGPUs)
	}
}
