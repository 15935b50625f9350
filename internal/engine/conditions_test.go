package engine

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// conditionOf matches the two message forms eventConditions writes, for
// that event only (an orphan's release must not end another event's).
func TestConditionOf(t *testing.T) {
	for _, tc := range []struct {
		msg, event string
		want       bool
	}{
		{"Lifecycle Transition 'n-drain' (event drain-a)", "drain-a", true},
		{"event drain-a (transition n-drain): draining", "drain-a", true},
		{"Lifecycle Transition 'n-drain' (event drain-ab)", "drain-a", false},
		{"event drain-ab (transition n-drain): draining", "drain-a", false},
		{"event drain-a: no longer waits", "drain-a", false},
		{"the kubelet's own message about event drain-a", "drain-a", false},
	} {
		if got := conditionOf(tc.msg, tc.event); got != tc.want {
			t.Errorf("conditionOf(%q, %q) = %v, want %v", tc.msg, tc.event, got, tc.want)
		}
	}
}

// An event whose drain found the node cordoned already (the drain event's
// cordon in drain → reboot → uncordon) leaves that cordon however it ends:
// Drained stays True. Before, its end said Drained=False/ReturnedToService
// ("back in service") on a cordoned node, or, after a failure,
// DrainIncomplete though the drain's criteria were met.
func TestDrainedWhenTheCordonWasNotOurs(t *testing.T) {
	steps := []drivers.Step{{Name: "cordon", Cordons: true}, {Name: "evict"}, {Name: "wait-empty"},
		{Name: "reboot", Disruptive: true}, {Name: "uncordon", UncordonsOwn: true}}
	for _, tc := range []struct {
		name       string
		end        journal.Outcome
		cordonMsg  string
		last       v1alpha1.StepState // the reboot's and the uncordon's state
		returned   bool
		wantStatus corev1.ConditionStatus
		wantReason string
	}{
		{"succeeded, the cordon found", journal.OutcomeSucceeded, drivers.CordonNotOurs, v1alpha1.StepDone, false, corev1.ConditionTrue, ReasonDrainCompleted},
		{"failed, the cordon found", journal.OutcomeFailed, drivers.CordonNotOurs, v1alpha1.StepFailed, true, corev1.ConditionTrue, ReasonDrainCompleted},
		{"cancelled, the cordon found", journal.OutcomeCancelled, drivers.CordonNotOurs, v1alpha1.StepPending, false, corev1.ConditionTrue, ReasonDrainCompleted},
		{"succeeded, its own cordon", journal.OutcomeSucceeded, "", v1alpha1.StepDone, false, corev1.ConditionFalse, ReasonReturnedToService},
		{"failed, its own cordon lifted by the abort", journal.OutcomeFailed, "", v1alpha1.StepFailed, true, corev1.ConditionFalse, ReasonReturnedToService},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &active{name: "ev", tn: "n-reboot", steps: steps, returned: tc.returned,
				ev: &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: "ev"}}}
			a.status.Driver = v1alpha1.LifecycleDriverStatus{Start: "RebootStarted", End: "RebootComplete"}
			a.status.Steps = []v1alpha1.StepStatus{
				{Name: "cordon", State: v1alpha1.StepDone, Message: tc.cordonMsg},
				{Name: "evict", State: v1alpha1.StepDone}, {Name: "wait-empty", State: v1alpha1.StepDone},
				{Name: "reboot", State: tc.last}, {Name: "uncordon", State: tc.last},
			}
			var got *apiclient.NodeCondition
			for _, c := range a.eventConditions(tc.end) {
				if c.Type == v1alpha1.NodeConditionDrained {
					c := c
					got = &c
				}
			}
			if got == nil || got.Status != tc.wantStatus || got.Reason != tc.wantReason {
				t.Errorf("Drained = %+v, want %s/%s", got, tc.wantStatus, tc.wantReason)
			}
		})
	}
}

// A reboot without its drain made no cordon and lifts none: it does not
// write Drained (it wrote False/ReturnedToService, "back in service").
func TestDrainedUntouchedByARebootWithoutDrain(t *testing.T) {
	a := &active{name: "ev", tn: "n-reboot", steps: []drivers.Step{{Name: "reboot", Disruptive: true}, {Name: "uncordon", UncordonsOwn: true}},
		ev: &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: "ev"}}}
	a.status.Driver = v1alpha1.LifecycleDriverStatus{Start: "RebootStarted", End: "RebootComplete"}
	a.status.Steps = []v1alpha1.StepStatus{{Name: "reboot", State: v1alpha1.StepDone}, {Name: "uncordon", State: v1alpha1.StepDone}}
	for _, c := range a.eventConditions(journal.OutcomeSucceeded) {
		if c.Type == v1alpha1.NodeConditionDrained {
			t.Errorf("a reboot with drain=false wrote %+v", c)
		}
	}
}
