package engine

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// While the readiness step runs, the Node's MaintenanceInProgress names
// what it waits for (its progress message); each change of that message
// queues one Node write, a repeat none, and another step's progress none.
func TestReadinessWaitInMaintenanceCondition(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	e := newOfflineEngine(t, clk)
	j := e.cfg.Journal
	a := &active{name: "ev", uid: "uid-1", tn: "n-reboot",
		steps: []drivers.Step{{Name: "reboot", Disruptive: true}, {Name: "wait-ready"}, {Name: drivers.StepWaitWorkloads}, {Name: "uncordon"}}}
	a.status.Driver.Start, a.status.Driver.End = "Running", "Running"
	for _, s := range a.steps {
		a.status.Steps = append(a.status.Steps, v1alpha1.StepStatus{Name: s.Name, State: v1alpha1.StepDone})
	}
	a.status.Steps[2].State, a.status.Steps[3].State = v1alpha1.StepRunning, v1alpha1.StepPending
	a.status.CurrentStep = drivers.StepWaitWorkloads
	rt := &stepRuntime{e: e, a: a}

	// written is MaintenanceInProgress's message in every Node write
	// queued so far: progress delivers (acks) each as it is queued, as the
	// flush loop does while the API server answers (a newer entry replaces
	// one still queued).
	var written []string
	progress := func(msg string) {
		t.Helper()
		rt.Progress(msg)
		pending, err := j.OutboxPending()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pending {
			if err := j.OutboxAck(p.Seq); err != nil {
				t.Fatal(err)
			}
			if p.Kind != journal.OutboxNodeCondition {
				continue
			}
			var np nodePayload
			if err := json.Unmarshal(p.Payload, &np); err != nil {
				t.Fatal(err)
			}
			for _, c := range np.Conditions {
				if c.Type == v1alpha1.NodeConditionMaintenanceInProgress {
					written = append(written, c.Message)
				}
			}
		}
	}
	gpus := drivers.ReadinessWaiting + "allocatable nvidia.com/gpu is 0 of 8"
	progress("checking the node's workloads before the uncordon (daemonsets, resources)")
	progress(gpus)
	progress(gpus)
	progress(drivers.ReadinessWaiting + "DaemonSet kube-system/cni has no Ready pod on the node")
	progress("the node's workloads are ready: daemonsets, resources")
	want := []string{
		"event ev (transition n-reboot): in progress",
		"event ev (transition n-reboot): in progress: " + gpus,
		"event ev (transition n-reboot): in progress: " + drivers.ReadinessWaiting + "DaemonSet kube-system/cni has no Ready pod on the node",
		"event ev (transition n-reboot): in progress",
	}
	if !slices.Equal(written, want) {
		t.Fatalf("MaintenanceInProgress written as\n  %q\nwant\n  %q", written, want)
	}

	// Another step's progress (the drain's evictions) is not the Node's.
	a.status.Steps[2].State, a.status.Steps[3].State = v1alpha1.StepDone, v1alpha1.StepRunning
	a.status.CurrentStep = "uncordon"
	progress(drivers.ReadinessWaiting + "as if")
	if len(written) != len(want) {
		t.Errorf("another step's progress queued a Node write: %q", written[len(want):])
	}
}
