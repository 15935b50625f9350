//go:build prometheus

package maintenance

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPrometheusGateRealServer runs the alert gate against a real
// Prometheus (hack/prombin.sh builds it from the module proxy and caches
// it): rules that fire, one that is still pending (for: 1h), one the
// ignore list names; then the firing rule is removed and Prometheus
// reloaded (SIGHUP), and the gate passes. `make test-prometheus` runs it;
// make test does not (see alertsServer in gates_test.go for why).
func TestPrometheusGateRealServer(t *testing.T) {
	out, err := exec.Command("../../hack/prombin.sh").Output()
	if err != nil {
		t.Fatalf("hack/prombin.sh: %v", err)
	}
	bin := strings.TrimSpace(string(out))
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yml")
	writeRules := func(firing bool) {
		r := "groups:\n  - name: gate\n    interval: 1s\n    rules:\n" +
			"      - {alert: Watchdog, expr: vector(1)}\n" +
			"      - {alert: SlowBurn, expr: vector(1), for: 1h}\n"
		if firing {
			r += "      - {alert: NodeDown, expr: vector(1), labels: {severity: page}}\n"
		}
		if err := os.WriteFile(rules, []byte(r), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeRules(true)
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte("global:\n  evaluation_interval: 1s\nrule_files: ["+rules+"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := "http://" + addr
	ctx := context.Background()
	waitFor := func(what string, f func() (bool, string)) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			var ok bool
			if ok, last = f(); ok {
				return
			}
		}
		t.Fatalf("%s: last %s\nprometheus log:\n%s", what, last, logs.String())
	}
	waitFor("prometheus ready", func() (bool, string) {
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	g := newGate(t, url, "", "^Watchdog$")
	waitFor("NodeDown blocks", func() (bool, string) {
		b, err := g.Check(ctx)
		return err == nil && strings.Join(b, "|") == "alert NodeDown is firing", fmt.Sprintf("%q %v", b, err)
	})
	// Without the ignore list Watchdog blocks too; SlowBurn is only pending.
	if b, err := newGate(t, url, "", "").Check(ctx); err != nil || strings.Join(b, "|") != "alert NodeDown is firing|alert Watchdog is firing" {
		t.Fatalf("no ignore list: %q, %v", b, err)
	}
	writeRules(false)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor("the gate passes once NodeDown is gone", func() (bool, string) {
		b, err := g.Check(ctx)
		return err == nil && len(b) == 0, fmt.Sprintf("%q %v", b, err)
	})
}
