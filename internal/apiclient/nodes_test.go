package apiclient

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// After a reboot the Node keeps the previous boot's Ready=True (nothing
// but the node lifecycle controller, 40 s later, changes it): only the
// kubelet of this boot, reporting this boot's ID, makes the node Ready.
func TestReadyInBoot(t *testing.T) {
	node := func(bootID string, ready corev1.ConditionStatus) *corev1.Node {
		n := &corev1.Node{}
		n.Status.NodeInfo.BootID = bootID
		if ready != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: ready}}
		}
		return n
	}
	for _, c := range []struct {
		name   string
		node   *corev1.Node
		bootID string
		want   bool
	}{
		{"Ready in this boot", node("b2", corev1.ConditionTrue), "b2", true},
		{"stale Ready of the previous boot", node("b1", corev1.ConditionTrue), "b2", false},
		{"this boot's kubelet not Ready yet", node("b2", corev1.ConditionFalse), "b2", false},
		{"no Ready condition", node("b2", ""), "b2", false},
		{"no boot ID reported (no kubelet): Ready decides", node("", corev1.ConditionTrue), "b2", true},
		{"caller knows no boot ID", node("b1", corev1.ConditionTrue), "", true},
		{"Unknown", node("b2", corev1.ConditionUnknown), "b2", false},
	} {
		if got := ReadyInBoot(c.node, c.bootID); got != c.want {
			t.Errorf("%s: ReadyInBoot = %v, want %v", c.name, got, c.want)
		}
	}
}
