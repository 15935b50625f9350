package engine

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// newOfflineEngine is an engine for node n on a real journal in a temp
// dir, a simulated host and an API client that reaches nothing: for tests
// of its own bookkeeping (outbox, status, health), driven by clk.
func newOfflineEngine(t *testing.T, clk *clocktesting.FakeClock) *Engine {
	t.Helper()
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
	return e
}
