package engine

import "testing"

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
