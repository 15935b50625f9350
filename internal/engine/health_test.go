package engine

import (
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The watchdog and /healthz see a wedged engine: Healthy passes while the
// engine shows progress and fails, naming how long and the state, once it
// has shown none for stallAfter.
func TestHealthyFollowsProgress(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	e := newOfflineEngine(t, clk)
	if err := e.Healthy(); err != nil {
		t.Fatalf("before the engine started: %v", err)
	}
	e.alive()
	e.setState("event x: step evict")
	clk.Step(stallAfter - time.Second)
	if err := e.Healthy(); err != nil {
		t.Fatalf("%s after the last progress: %v", stallAfter-time.Second, err)
	}
	clk.Step(2 * time.Second)
	err := e.Healthy()
	if err == nil || !strings.Contains(err.Error(), "no progress for 3m1s") || !strings.Contains(err.Error(), "event x: step evict") {
		t.Fatalf("wedged for %s: %v, want an error naming the time and the state", stallAfter+time.Second, err)
	}
	e.alive()
	if err := e.Healthy(); err != nil {
		t.Fatalf("after progress again: %v", err)
	}
}
