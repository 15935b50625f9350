package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// doctorBinary is the real lifecycle-agent, built once for the doctor tests.
var doctorBinary struct {
	once sync.Once
	path string
	err  error
}

func doctorBuild(t *testing.T) string {
	t.Helper()
	doctorBinary.once.Do(func() {
		dir := filepath.Join(env.Dir, "doctor-bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			doctorBinary.err = err
			return
		}
		doctorBinary.path = filepath.Join(dir, "lifecycle-agent")
		cmd := exec.Command("go", "build", "-tags", "kustomize_disable_go_plugin_support", "-o", doctorBinary.path, "./cmd/lifecycle-agent")
		cmd.Dir = testenv.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			doctorBinary.err = fmt.Errorf("build lifecycle-agent: %v\n%s", err, out)
		}
	})
	if doctorBinary.err != nil {
		t.Fatal(doctorBinary.err)
	}
	return doctorBinary.path
}

// closedPortKubeconfig writes a kubeconfig for an API server address where
// nothing listens.
func closedPortKubeconfig(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := filepath.Join(t.TempDir(), "closed.kubeconfig")
	cfg := &rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{CAData: env.CAPEM()}, BearerToken: "nobody"}
	if err := testenv.WriteKubeconfig(p, cfg); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDoctor runs `lifecycle-agent doctor` against the real control plane,
// as the node, as users without the node's permissions and against a closed
// port, with a private logind (or none) and a missing, healthy or garbage
// journal, and checks the lines a user sees and the exit code.
func TestDoctor(t *testing.T) {
	const node = "doctor-node"
	ctx := context.Background()
	if err := testenv.CreateNode(ctx, env.AdminConfig(), node, nil); err != nil {
		t.Fatal(err)
	}
	bin := doctorBuild(t)
	nodeKC, err := env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		t.Fatal(err)
	}
	aliceKC, err := env.WriteKubeconfigFor("alice")
	if err != nil {
		t.Fatal(err)
	}
	adminKC, err := env.WriteKubeconfigFor("admin")
	if err != nil {
		t.Fatal(err)
	}
	closedKC := closedPortKubeconfig(t)

	const fixManifests = " — fix: lifecycle-agent manifests | kubectl apply -f -"
	q := regexp.QuoteMeta
	okAPI := map[string]string{
		"identity":  q("✓ identity: system:node:" + node + " (groups system:nodes, system:authenticated)"),
		"rbac":      q("✓ rbac: all 25 permissions the agent needs are granted"),
		"crds":      q("✓ crds: lifecycleevents, lifecycletransitions, lifecycleleases (lifecycle.x-k8s.io/v1alpha1) are served"),
		"admission": q("✓ admission: ValidatingAdmissionPolicy lifecycle-agent-node-scope refuses writes for other nodes (dry run)"),
		"clock":     q("✓ clock: within 1s of the API server's (limit 5s)"),
	}
	tests := []struct {
		name       string
		kubeconfig string
		journal    string        // "" (none), "healthy", "held" (open in this process) or "garbage"
		logind     time.Duration // InhibitDelayMax of the private logind; 0: no system bus
		code       int
		want       map[string]string // check name → regexp of the whole line; FILE, KC, URL replaced
		stderr     string
	}{
		{
			name: "node identity with everything in place", kubeconfig: nodeKC, logind: 30 * time.Second,
			want: doctorMerge(okAPI, map[string]string{
				"config":  q("✓ config: FILE (node " + node + ")"),
				"journal": q("✓ journal: JOURNAL not created yet (the agent creates it at start)"),
				"api":     q("✓ api: URL answers (kubeconfig KC)"),
				"logind":  q("✓ logind: InhibitDelayMaxSec 30s ≥ shutdown budget 5s"),
				"nvml":    `✓ nvml: (no NVML: gpu-reset driver off|\d+ GPUs?; gpu-reset driver on)`,
			}),
		},
		{
			name: "healthy journal", kubeconfig: nodeKC, journal: "healthy", logind: 5 * time.Second,
			want: doctorMerge(okAPI, map[string]string{
				"journal": q("✓ journal: JOURNAL: schema ") + `\d+` + q(", 0 events, 0 steps, 0 outbox, 0 history (") + `\d+` + q(" bytes)"),
				"logind":  q("✓ logind: InhibitDelayMaxSec 5s ≥ shutdown budget 5s"),
			}),
		},
		{
			name: "journal held by the agent", kubeconfig: nodeKC, journal: "held", logind: 30 * time.Second,
			want: doctorMerge(okAPI, map[string]string{
				"journal": q("✓ journal: JOURNAL is locked by another process (the running agent, which checked it when it opened it)"),
			}),
		},
		{
			name: "garbage journal", kubeconfig: nodeKC, journal: "garbage", logind: 30 * time.Second, code: 1,
			want: map[string]string{
				"journal": q("✗ journal: journal: corrupt: JOURNAL: ") + ".+" +
					q(" — fix: restart the agent (systemctl restart lifecycle-agent): it moves the corrupt file aside and rebuilds from the API server"),
			},
			stderr: "lifecycle-agent: doctor: 1 of 10 checks failed",
		},
		{
			name: "user without RBAC", kubeconfig: aliceKC, logind: 30 * time.Second, code: 1,
			want: map[string]string{
				"api": q("✓ api: URL answers (kubeconfig KC)"),
				"identity": q("✗ identity: alice (groups system:authenticated) is not system:node:" + node +
					" in group system:nodes — fix: use the kubelet's kubeconfig or set kubeconfig"),
				"rbac": q("✗ rbac: missing lifecycleevents get/list/watch/update/patch/delete, lifecycleevents/status update, "+
					"lifecycletransitions get/create/delete/list/watch, lifecycleleases get/create/update in lifecycle-system, nodes get/patch, "+
					"nodes/status patch, pods list/watch, pods/eviction create, daemonsets get, poddisruptionbudgets list/watch, events create in default") + q(fixManifests),
				// alice may not list them, but discovery shows them.
				"crds": okAPI["crds"],
				"admission": q("✗ admission: cannot check policy lifecycle-agent-node-scope as alice: ") + ".*forbidden.*" +
					q(" — fix: run doctor with the kubelet's kubeconfig: the probe needs a node identity (or read access to ValidatingAdmissionPolicies)"),
				"clock": okAPI["clock"],
			},
			stderr: "lifecycle-agent: doctor: 3 of 10 checks failed",
		},
		{
			name: "admin identity", kubeconfig: adminKC, logind: 30 * time.Second, code: 1,
			want: map[string]string{
				"identity":  q("✗ identity: test-admin (groups system:masters, system:authenticated) is not system:node:" + node + " in group system:nodes — fix: use the kubelet's kubeconfig or set kubeconfig"),
				"rbac":      okAPI["rbac"],
				"crds":      okAPI["crds"],
				"admission": q("✓ admission: ValidatingAdmissionPolicy lifecycle-agent-node-scope and its binding are installed"),
			},
			stderr: "lifecycle-agent: doctor: 1 of 10 checks failed",
		},
		{
			name: "API server on a closed port", kubeconfig: closedKC, logind: 30 * time.Second, code: 1,
			want: map[string]string{
				"api": q("✗ api: ") + `https://127\.0\.0\.1:\d+` + q(" unreachable: ") + `dial tcp 127\.0\.0\.1:\d+: connect: connection refused` +
					q(" (identity, rbac, crds, admission and clock not checked) — fix: check the server address in KC and that the API server is up and reachable from this node"),
				"identity": "", "rbac": "", "crds": "", "admission": "", "clock": "",
			},
			stderr: "lifecycle-agent: doctor: 1 of 5 checks failed",
		},
		{
			name: "logind delay below the shutdown budget", kubeconfig: nodeKC, logind: 2 * time.Second, code: 1,
			want: doctorMerge(okAPI, map[string]string{
				"logind": q("✗ logind: InhibitDelayMaxSec 2s is below the shutdown budget 5s — fix: set shutdown.manageLogindDropIn: true or raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/"),
			}),
			stderr: "lifecycle-agent: doctor: 1 of 10 checks failed",
		},
		{
			name: "no logind", kubeconfig: nodeKC, code: 1,
			want: doctorMerge(okAPI, map[string]string{
				"logind": q("✗ logind: no logind: host: read InhibitDelayMaxUSec: ") + ".*no such file or directory" +
					q(" — fix: the agent needs systemd-logind on the system bus: systemctl status dbus systemd-logind"),
			}),
			stderr: "lifecycle-agent: doctor: 1 of 10 checks failed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			jpath := filepath.Join(dir, "journal.db")
			switch tt.journal {
			case "healthy", "held":
				j, _, err := journal.Open(ctx, jpath, journal.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if tt.journal == "held" {
					defer j.Close() // bbolt's file lock, as the running agent holds it
					break
				}
				if err := j.Close(); err != nil {
					t.Fatal(err)
				}
			case "garbage":
				if err := os.WriteFile(jpath, bytes.Repeat([]byte("not a journal\n"), 512), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			bus := "unix:path=" + filepath.Join(dir, "no-bus")
			if tt.logind > 0 {
				bus = logindtest.Start(t, logindtest.Options{InhibitDelayMax: tt.logind}).Address()
			}
			cfgPath := filepath.Join(dir, "config.yaml")
			cfg := fmt.Sprintf("nodeName: %s\nkubeconfig: %s\njournalPath: %s\napiTimeout: 10s\nshutdown:\n  budget: 5s\n", node, tt.kubeconfig, jpath)
			if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}

			r := doctorExec(t, bin, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir,
				"LIFECYCLE_AGENT_CONFIG=" + cfgPath, "DBUS_SYSTEM_BUS_ADDRESS=" + bus})
			if r.code != tt.code {
				t.Errorf("exit code %d, want %d", r.code, tt.code)
			}
			want := ""
			if tt.stderr != "" {
				want = tt.stderr + "\n"
			}
			if r.stderr != want {
				t.Errorf("stderr %q, want %q", r.stderr, want)
			}
			lines := map[string]string{}
			for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
				name, _, _ := strings.Cut(strings.TrimLeft(l, "✓✗ "), ":")
				if _, dup := lines[name]; dup {
					t.Errorf("check %s printed twice", name)
				}
				lines[name] = l
			}
			repl := strings.NewReplacer("FILE", q(cfgPath), "JOURNAL", q(jpath), "KC", q(tt.kubeconfig), "URL", q(env.URL))
			for name, re := range tt.want {
				got, printed := lines[name]
				switch {
				case re == "" && printed:
					t.Errorf("%s: printed %q, want no line", name, got)
				case re == "":
				case !printed:
					t.Errorf("%s: no line", name)
				case !regexp.MustCompile("^" + repl.Replace(re) + "$").MatchString(got):
					t.Errorf("%s:\n got %s\nwant %s", name, got, repl.Replace(re))
				}
			}
			t.Logf("stdout:\n%s", r.stdout)
		})
	}
}

// TestDoctorJSON: --json prints the same checks as one document.
func TestDoctorJSON(t *testing.T) {
	bin := doctorBuild(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	cfg := fmt.Sprintf("nodeName: doctor-node\nkubeconfig: %s\njournalPath: %s\n", closedPortKubeconfig(t), filepath.Join(dir, "journal.db"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := doctorExec(t, bin, []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "LIFECYCLE_AGENT_CONFIG=" + cfgPath,
		"DBUS_SYSTEM_BUS_ADDRESS=unix:path=" + filepath.Join(dir, "no-bus")}, "--json")
	if r.code != 1 {
		t.Errorf("exit code %d, want 1", r.code)
	}
	for _, want := range []string{`"ok": false`, `"name": "api"`, `"fix": "check the server address in`, `"name": "nvml"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %s:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "✗") {
		t.Errorf("--json printed text lines:\n%s", r.stdout)
	}
}

type doctorResult struct {
	code           int
	stdout, stderr string
}

// doctorExec runs `lifecycle-agent doctor args...` with exactly the
// environment environ.
func doctorExec(t *testing.T, bin string, environ []string, args ...string) doctorResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"doctor"}, args...)...)
	cmd.Env = environ
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run doctor: %v", err)
	}
	return doctorResult{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func doctorMerge(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}
