package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The Node Lifecycle Conditions are upstream's types, not look-alikes.
func TestNodeLifecycleConditionTypes(t *testing.T) {
	for ours, theirs := range map[string]corev1.NodeConditionType{
		NodeConditionDrainInProgress:                corev1.NodeDrainInProgress,
		NodeConditionDrained:                        corev1.NodeDrained,
		NodeConditionMaintenancePlanned:             corev1.NodeMaintenancePlanned,
		NodeConditionMaintenanceInProgress:          corev1.NodeMaintenanceInProgress,
		NodeConditionGracefulNodeShutdownInProgress: corev1.NodeGracefulNodeShutdownInProgress,
	} {
		if ours != string(theirs) {
			t.Errorf("condition type %q, k8s.io/api says %q", ours, theirs)
		}
	}
}

// Every upstream type is in the list tools show.
func TestNodeConditionTypesListed(t *testing.T) {
	listed := map[string]bool{}
	for _, c := range NodeConditionTypes {
		if listed[c] {
			t.Errorf("%s listed twice", c)
		}
		listed[c] = true
	}
	for _, c := range []corev1.NodeConditionType{corev1.NodeDrainInProgress, corev1.NodeDrained, corev1.NodeMaintenancePlanned,
		corev1.NodeMaintenanceInProgress, corev1.NodeGracefulNodeShutdownInProgress} {
		if !listed[string(c)] {
			t.Errorf("NodeConditionTypes lacks %s", c)
		}
	}
	for _, c := range []string{NodeConditionLifecycleTransition, NodeConditionGPUHealthy} {
		if !listed[c] {
			t.Errorf("NodeConditionTypes lacks %s", c)
		}
	}
}
