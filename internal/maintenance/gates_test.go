package maintenance

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

// alertsServer serves Prometheus' /api/v1/alerts in the wire format its
// HTTP API documents (https://prometheus.io/docs/prometheus/latest/querying/api/#alerts),
// with the alerts the test sets. make test uses it: a real Prometheus
// costs about 12 CPU-minutes to build from the module proxy, more than the
// CI budget leaves; `make test-prometheus` runs the same checks against a
// real one (prometheus_real_test.go).
type alertsServer struct {
	mu     sync.Mutex
	alerts string // JSON list
	srv    *httptest.Server
	hits   int
}

func newAlertsServer(t *testing.T) *alertsServer {
	a := &alertsServer{alerts: "[]"}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		a.hits++
		if r.URL.Path != "/api/v1/alerts" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"status":"error","errorType":"not_found","error":"not found"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"success","data":{"alerts":` + a.alerts + `}}`))
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *alertsServer) set(alerts string) {
	a.mu.Lock()
	a.alerts = alerts
	a.mu.Unlock()
}

func alert(name, state string) string {
	return `{"labels":{"alertname":"` + name + `","severity":"page"},"annotations":{"summary":"x"},` +
		`"state":"` + state + `","activeAt":"2026-12-02T10:00:00Z","value":"1e+00"}`
}

func newGate(t *testing.T, url, names, ignore string) *Prometheus {
	t.Helper()
	cfg := PrometheusConfig{URL: url, Timeout: 2 * time.Second}
	if names != "" {
		cfg.Names = regexp.MustCompile(names)
	}
	if ignore != "" {
		cfg.Ignore = regexp.MustCompile(ignore)
	}
	g, err := NewPrometheus(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestPrometheusGate(t *testing.T) {
	ctx := context.Background()
	srv := newAlertsServer(t)
	g := newGate(t, srv.srv.URL, "", "^(Watchdog|RebootRequired)$")
	if b, err := g.Check(ctx); err != nil || len(b) != 0 {
		t.Fatalf("no alerts: blockers %v, err %v; want a pass", b, err)
	}
	srv.set("[" + strings.Join([]string{alert("Watchdog", "firing"), alert("NodeDown", "firing"), alert("NodeDown", "firing"),
		alert("DiskFilling", "pending"), alert("RebootRequired", "firing"), alert("APIErrors", "firing")}, ",") + "]")
	b, err := g.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Pending alerts and ignored ones do not block; one line per name.
	if want := []string{"alert APIErrors is firing", "alert NodeDown is firing"}; strings.Join(b, "|") != strings.Join(want, "|") {
		t.Fatalf("blockers %q, want %q", b, want)
	}
	// alertNames narrows what blocks.
	if b, err := newGate(t, srv.srv.URL, "^Node", "").Check(ctx); err != nil || strings.Join(b, "|") != "alert NodeDown is firing" {
		t.Fatalf("alertNames ^Node: %q, %v", b, err)
	}
}

// A Prometheus that does not answer, or answers nonsense, blocks: the gate
// cannot say "no alerts".
func TestPrometheusGateUnreachableBlocks(t *testing.T) {
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	got := Blockers(ctx, []Gate{newGate(t, "http://"+addr, "", "")})
	if len(got) != 1 || !strings.HasPrefix(got[0], "prometheus gate cannot be evaluated: http://"+addr) || !strings.Contains(got[0], "connection refused") {
		t.Fatalf("unreachable: %q", got)
	}
	srv := newAlertsServer(t)
	got = Blockers(ctx, []Gate{newGate(t, srv.srv.URL+"/wrong-prefix", "", "")})
	if len(got) != 1 || !strings.Contains(got[0], "prometheus gate cannot be evaluated") {
		t.Fatalf("a 404: %q", got)
	}
	// A Prometheus that hangs is cut off at the timeout.
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(hang.Close)
	g := newGate(t, hang.URL, "", "")
	g.cfg.Timeout = 200 * time.Millisecond
	start := time.Now()
	if got = Blockers(ctx, []Gate{g}); len(got) != 1 || !strings.Contains(got[0], "deadline exceeded") {
		t.Fatalf("a hanging Prometheus: %q", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the check took %s with a 200ms timeout", d)
	}
}

func TestCommandGate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok")
	r := host.NewRunner(host.RunnerConfig{})
	g := &Command{Command: "echo checking; test -e " + ok + " || { echo 'backup still running' >&2; exit 3; }", Timeout: 5 * time.Second, Runner: r}
	got := Blockers(ctx, []Gate{g})
	if len(got) != 1 || !strings.HasPrefix(got[0], "command: `echo checking;") || !strings.HasSuffix(got[0], "exited 3: backup still running") {
		t.Fatalf("blocked: %q", got)
	}
	if err := os.WriteFile(ok, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := Blockers(ctx, []Gate{g}); len(got) != 0 {
		t.Fatalf("passing: %q", got)
	}
	slow := &Command{Command: "sleep 30", Timeout: 300 * time.Millisecond, Runner: r}
	if got := Blockers(ctx, []Gate{slow}); len(got) != 1 || got[0] != "command gate cannot be evaluated: `sleep 30` did not finish within 300ms (killed)" {
		t.Fatalf("slow: %q", got)
	}
	missing := &Command{Command: "/nonexistent/gate", Timeout: time.Second, Runner: r}
	if got := Blockers(ctx, []Gate{missing}); len(got) != 1 || !strings.Contains(got[0], "exited 127") {
		t.Fatalf("missing command: %q", got)
	}
}
