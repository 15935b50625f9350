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
