package engine

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The watchdog and /healthz see a wedged engine: Healthy passes while the
// engine shows progress and fails, naming how long and the state, once it
// has shown none for stallAfter.
func TestHealthyFollowsProgress(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	j, _, err := journal.Open(context.Background(), filepath.Join(t.TempDir(), "journal.db"), journal.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	host, err := hostops.NewSimulated(hostops.SimulatedConfig{StateDir: t.TempDir(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Node: "n", API: &apiclient.Client{}, Journal: j, Clock: clk, Log: log, Host: host})
	if err != nil {
		t.Fatal(err)
	}
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
	err = e.Healthy()
	if err == nil || !strings.Contains(err.Error(), "no progress for 3m1s") || !strings.Contains(err.Error(), "event x: step evict") {
		t.Fatalf("wedged for %s: %v, want an error naming the time and the state", stallAfter+time.Second, err)
	}
	e.alive()
	if err := e.Healthy(); err != nil {
		t.Fatalf("after progress again: %v", err)
	}
}
