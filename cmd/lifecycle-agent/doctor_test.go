package main

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
	"github.com/lifecycle-agent/lifecycle-agent/internal/notify"
)

func TestDoctorClock(t *testing.T) {
	tests := []struct {
		name   string
		offset time.Duration
		want   string
	}{
		{name: "in step", offset: 300 * time.Millisecond, want: "✓ clock: within 1s of the API server's (limit 5s)"},
		{name: "a little behind", offset: 3 * time.Second, want: "✓ clock: 3s behind the API server's (limit 5s)"},
		{name: "at the limit", offset: -5 * time.Second, want: "✓ clock: 5s ahead of the API server's (limit 5s)"},
		{
			name: "far ahead", offset: -42 * time.Second,
			want: "✗ clock: 42s ahead of the API server's (limit 5s) — fix: sync the clock: timedatectl set-ntp true (chrony or systemd-timesyncd), and check the API server's clock",
		},
		{
			name: "just behind the limit", offset: 5*time.Second + 600*time.Millisecond,
			want: "✗ clock: 6s behind the API server's (limit 5s) — fix: sync the clock: timedatectl set-ntp true (chrony or systemd-timesyncd), and check the API server's clock",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := doctorClock(tt.offset).String(); got != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestDoctorLogindDelay(t *testing.T) {
	const dropIn = "/etc/systemd/logind.conf.d/99-lifecycle-agent.conf"
	tests := []struct {
		name  string
		delay time.Duration
		sh    config.Shutdown
		want  string
	}{
		{name: "above budget", delay: 30 * time.Second, sh: config.Shutdown{Budget: 5 * time.Second}, want: "✓ logind: InhibitDelayMaxSec 30s ≥ shutdown budget 5s"},
		{name: "equal", delay: 5 * time.Second, sh: config.Shutdown{Budget: 5 * time.Second}, want: "✓ logind: InhibitDelayMaxSec 5s ≥ shutdown budget 5s"},
		{name: "infinite", delay: time.Duration(math.MaxInt64), sh: config.Shutdown{Budget: 5 * time.Second}, want: "✓ logind: InhibitDelayMaxSec infinity ≥ shutdown budget 5s"},
		{
			name: "below budget", delay: 2 * time.Second, sh: config.Shutdown{Budget: 5 * time.Second},
			want: "✗ logind: InhibitDelayMaxSec 2s is below the shutdown budget 5s — fix: set shutdown.manageLogindDropIn: true or raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/",
		},
		{
			name: "below budget with the drop-in managed", delay: 2 * time.Second, sh: config.Shutdown{Budget: 10 * time.Second, ManageLogindDropIn: true},
			want: "✗ logind: InhibitDelayMaxSec 2s is below the shutdown budget 10s — fix: restart the agent, which writes " + dropIn + " and reloads logind, or raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := doctorLogindDelay(tt.delay, tt.sh, dropIn).String(); got != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestDoctorRBAC(t *testing.T) {
	perms := apiclient.AgentPermissions("node-a")
	all := func(allowed func(apiclient.Permission) bool) []apiclient.Access {
		var acc []apiclient.Access
		for _, p := range perms {
			acc = append(acc, apiclient.Access{Permission: p, Allowed: allowed(p)})
		}
		return acc
	}
	tests := []struct {
		name string
		acc  []apiclient.Access
		want string
	}{
		{name: "all granted", acc: all(func(apiclient.Permission) bool { return true }), want: "✓ rbac: all 25 permissions the agent needs are granted"},
		{
			name: "no lease role and no status",
			acc: all(func(p apiclient.Permission) bool {
				return p.Resource != "lifecycleleases" && p.ResourcePath() != "lifecycleevents/status"
			}),
			want: "✗ rbac: missing lifecycleevents/status update, lifecycleleases get/create/update in lifecycle-system — fix: lifecycle-agent manifests | kubectl apply -f -",
		},
		{
			name: "only leases create",
			acc:  all(func(p apiclient.Permission) bool { return p.Resource != "lifecycleleases" || p.Verb != "create" }),
			want: "✗ rbac: missing lifecycleleases create in lifecycle-system — fix: lifecycle-agent manifests | kubectl apply -f -",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := doctorRBAC(tt.acc).String(); got != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestDoctorIdentity(t *testing.T) {
	cfg := &config.Config{NodeName: "node-a"}
	tests := []struct {
		name string
		id   apiclient.Identity
		want string
	}{
		{
			name: "this node", id: apiclient.Identity{Username: "system:node:node-a", Groups: []string{"system:nodes", "system:authenticated"}},
			want: "✓ identity: system:node:node-a (groups system:nodes, system:authenticated)",
		},
		{
			name: "another node", id: apiclient.Identity{Username: "system:node:node-b", Groups: []string{"system:nodes"}},
			want: "✗ identity: system:node:node-b (groups system:nodes), but nodeName is node-a — fix: use this node's kubelet kubeconfig, or set nodeName: node-b (--node-name) if this host is node-b",
		},
		{
			name: "node name without the group", id: apiclient.Identity{Username: "system:node:node-a", Groups: []string{"system:authenticated"}},
			want: "✗ identity: system:node:node-a (groups system:authenticated) is not system:node:node-a in group system:nodes — fix: use the kubelet's kubeconfig or set kubeconfig",
		},
		{
			name: "a user", id: apiclient.Identity{Username: "alice", Groups: []string{"system:authenticated"}},
			want: "✗ identity: alice (groups system:authenticated) is not system:node:node-a in group system:nodes — fix: use the kubelet's kubeconfig or set kubeconfig",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := doctorIdentity(tt.id, cfg).String(); got != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestDoctorOffline runs the real binary on this host without an API server:
// the checks that need none still give their verdicts, and the API check
// fails with a fix.
func TestDoctorOffline(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.db")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a journal\n", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	noBus := "DBUS_SYSTEM_BUS_ADDRESS=unix:path=" + filepath.Join(dir, "no-bus")
	kubeconfig := filepath.Join(dir, "absent.kubeconfig")
	apiLine := "✗ api: kubeconfig " + kubeconfig + ": stat " + kubeconfig + ": no such file or directory " +
		"(identity, rbac, crds, admission and clock not checked) — fix: set kubeconfig (--kubeconfig or LIFECYCLE_AGENT_KUBECONFIG) to the kubelet's kubeconfig"
	q := regexp.QuoteMeta
	tests := []struct {
		name   string
		env    []string
		want   []string // regexps of the lines, in order
		stderr string
	}{
		{
			name: "no logind and no journal yet",
			env:  []string{noBus, "LIFECYCLE_AGENT_JOURNAL_PATH=" + filepath.Join(dir, "absent.db")},
			want: []string{
				q("✓ config: ") + ".*config.yaml" + q(" (node smoke-node)"),
				q("✓ journal: " + filepath.Join(dir, "absent.db") + " not created yet (the agent creates it at start)"),
				q(apiLine),
				q("✗ logind: no logind: host: read InhibitDelayMaxUSec: ") + ".*no such file or directory" +
					q(" — fix: the agent needs systemd-logind on the system bus: systemctl status dbus systemd-logind"),
				`✓ nvml: .*`,
			},
			stderr: "lifecycle-agent: doctor: 2 of 5 checks failed",
		},
		{
			name: "garbage journal and logind below budget",
			env: []string{"LIFECYCLE_AGENT_JOURNAL_PATH=" + garbage,
				"DBUS_SYSTEM_BUS_ADDRESS=" + logindtest.Start(t, logindtest.Options{InhibitDelayMax: 3 * time.Second}).Address()},
			want: []string{
				q("✓ config: ") + ".*",
				q("✗ journal: journal: corrupt: "+garbage+": ") + ".+" +
					q(" — fix: restart the agent (systemctl restart lifecycle-agent): it moves the corrupt file aside and rebuilds from the API server"),
				q(apiLine),
				q("✗ logind: InhibitDelayMaxSec 3s is below the shutdown budget 5s — fix: set shutdown.manageLogindDropIn: true or raise InhibitDelayMaxSec in /etc/systemd/logind.conf.d/"),
				`✓ nvml: .*`,
			},
			stderr: "lifecycle-agent: doctor: 3 of 5 checks failed",
		},
		{
			name: "gates: a command that blocks, a Prometheus that does not answer",
			env: []string{noBus, "LIFECYCLE_AGENT_JOURNAL_PATH=" + filepath.Join(dir, "absent.db"),
				"LIFECYCLE_AGENT_GATES_COMMAND=echo backup running; exit 3", "LIFECYCLE_AGENT_GATES_PROMETHEUS_URL=http://127.0.0.1:1"},
			want: []string{
				q("✓ config: ") + ".*",
				q("✓ journal: ") + ".*",
				q(apiLine),
				q("✗ logind: ") + ".*",
				`✓ nvml: .*`,
				q("✓ gate command: evaluates; blocks disruptive events now: `echo backup running; exit 3` exited 3: backup running"),
				q("✗ gate prometheus: cannot be evaluated: http://127.0.0.1:1: ") + ".*connection refused" +
					q(" — fix: gates.prometheus.url must serve Prometheus' HTTP API (/api/v1/alerts) to this node; until it answers, disruptive events wait"),
			},
			stderr: "lifecycle-agent: doctor: 3 of 7 checks failed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := agent(t, append(tt.env, "LIFECYCLE_AGENT_KUBECONFIG="+kubeconfig), "doctor")
			if r.code != 1 {
				t.Errorf("exit code %d, want 1", r.code)
			}
			if r.stderr != tt.stderr+"\n" {
				t.Errorf("stderr %q, want %q", r.stderr, tt.stderr+"\n")
			}
			lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(tt.want), r.stdout)
			}
			for i, re := range tt.want {
				if !regexp.MustCompile("^" + re + "$").MatchString(lines[i]) {
					t.Errorf("line %d:\n got %s\nwant %s", i+1, lines[i], re)
				}
			}
		})
	}
}

// SelfSubjectReview is built in: its failures never point at the manifests.
func TestDoctorWhoAmIFailure(t *testing.T) {
	cfg := &config.Config{Kubeconfig: "/etc/kubernetes/kubelet.conf"}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{
			name: "not served", err: &apiclient.ProbeError{Kind: apiclient.FailNotFound, Op: "SelfSubjectReview", Msg: "the server could not find the requested resource"},
			want: "✗ api: https://k:6443 serves no SelfSubjectReview (authentication.k8s.io/v1, built in since Kubernetes 1.28): the server could not find the requested resource — fix: upgrade the control plane: the agent needs kube-apiserver 1.30 or newer (docs/install.md)",
		},
		{
			name: "forbidden", err: &apiclient.ProbeError{Kind: apiclient.FailForbidden, Op: "SelfSubjectReview", Msg: "forbidden: User \"x\" cannot create resource \"selfsubjectreviews\""},
			want: "✗ api: SelfSubjectReview: forbidden: User \"x\" cannot create resource \"selfsubjectreviews\" — fix: restore the built-in ClusterRoleBinding system:basic-user (it lets every authenticated user ask who it is), or set kubeconfig to the kubelet's",
		},
		{
			name: "unreachable: as every API check", err: &apiclient.ProbeError{Kind: apiclient.FailUnreachable, Op: "SelfSubjectReview", Msg: "connection refused"},
			want: "✗ api: https://k:6443 unreachable: connection refused — fix: check the server address in /etc/kubernetes/kubelet.conf and that the API server is up and reachable from this node",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := whoAmIFailure("https://k:6443", cfg, tt.err).String()
			if got != tt.want {
				t.Errorf("\n got %s\nwant %s", got, tt.want)
			}
			if strings.Contains(got, "manifests") {
				t.Errorf("SelfSubjectReview's failure points at the manifests: %s", got)
			}
		})
	}
}

func TestDoctorWindow(t *testing.T) {
	utc := time.UTC
	cfg := &config.Config{Maintenance: config.Maintenance{Windows: maintenance.Windows{
		{Days: []time.Weekday{time.Saturday}, Start: 2 * time.Hour, End: 6 * time.Hour, Loc: utc}}}}
	wed := time.Date(2026, 12, 2, 12, 0, 0, 0, utc)
	got := doctorMaintenance(context.Background(), cfg, wed)
	if len(got) != 1 || got[0].String() != "✓ window: closed now: the next opens Sat 2026-12-05 02:00 UTC (window sat 02:00-06:00 UTC)" {
		t.Errorf("Wednesday: %v", got)
	}
	got = doctorMaintenance(context.Background(), cfg, time.Date(2026, 12, 5, 3, 0, 0, 0, utc))
	if len(got) != 1 || got[0].String() != "✓ window: open now: disruptive events may start" {
		t.Errorf("Saturday 03:00: %v", got)
	}
	if got := doctorMaintenance(context.Background(), &config.Config{}, wed); len(got) != 0 {
		t.Errorf("nothing configured: %v", got)
	}
}

// doctor --notify-test sends one test message to each target and names a
// target by its service and ID, never by its URL (tokens).
func TestDoctorNotifyTest(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, r.URL.Path+" "+string(b))
		mu.Unlock()
	}))
	defer hook.Close()
	good := "generic+" + hook.URL + "/hook"
	bad := "generic+http://127.0.0.1:1/s3cr3t-token"
	env := []string{"DBUS_SYSTEM_BUS_ADDRESS=unix:path=" + filepath.Join(t.TempDir(), "no-bus"),
		"LIFECYCLE_AGENT_KUBECONFIG=" + filepath.Join(t.TempDir(), "absent"),
		"LIFECYCLE_AGENT_NOTIFICATIONS_URLS=" + good + "," + bad}
	q := regexp.QuoteMeta

	r := agent(t, env, "doctor")
	want := q("✓ notify: 2 target(s): generic " + notify.TargetID(good) + ", generic " + notify.TargetID(bad) +
		" (not contacted; --notify-test sends each a test message)")
	if last := lastLine(r.stdout); !regexp.MustCompile("^" + want + "$").MatchString(last) {
		t.Errorf("doctor's last line:\n got %s\nwant %s", last, want)
	}
	mu.Lock()
	if len(bodies) != 0 {
		t.Errorf("doctor without --notify-test sent %q", bodies)
	}
	mu.Unlock()

	r = agent(t, env, "doctor", "--notify-test")
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("doctor --notify-test printed %q", r.stdout)
	}
	got := lines[len(lines)-2:]
	wantLines := []string{
		q("✓ notify generic " + notify.TargetID(good) + ": test message sent"),
		q("✗ notify generic "+notify.TargetID(bad)+": test message not taken: ") + ".*connection refused.*" +
			q(" — fix: check the URL's credentials and that this node reaches the service; until then notices wait in the journal (24 h)"),
	}
	for i, re := range wantLines {
		if !regexp.MustCompile("^" + re + "$").MatchString(got[i]) {
			t.Errorf("line:\n got %s\nwant %s", got[i], re)
		}
	}
	if strings.Contains(r.stdout+r.stderr, "s3cr3t") {
		t.Errorf("a URL's token is in doctor's output:\n%s%s", r.stdout, r.stderr)
	}
	if r.code != 1 {
		t.Errorf("exit code %d, want 1 (a target refused)", r.code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || !strings.HasPrefix(bodies[0], "/hook lifecycle-agent doctor --notify-test on node smoke-node: ") {
		t.Errorf("the hook got %q, want one test message", bodies)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// TestDoctorConfigNamesDropIns: doctor's config line names every file the
// configuration came from, lowest layer first, so an admin sees which
// drop-in is in play (real files, loaded as the agent loads them).
func TestDoctorConfigNamesDropIns(t *testing.T) {
	dir, vendor := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, vendor} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	main := filepath.Join(dir, "config.yaml")
	write(filepath.Join(vendor, "50-package-defaults.yaml"), "# the package's defaults\n")
	write(main, "logLevel: info\n")
	write(filepath.Join(dir, "config.d", "50-site.yaml"), "logLevel: debug\n")
	cfg, err := config.Load(config.Options{DefaultPath: main, VendorDir: vendor, Hostname: func() (string, error) { return "node-a", nil }})
	if err != nil {
		t.Fatal(err)
	}
	want := "✓ config: " + filepath.Join(vendor, "50-package-defaults.yaml") + ", " + main + ", " + filepath.Join(dir, "config.d", "50-site.yaml") + " (node node-a)"
	if got := doctorConfig(cfg).String(); got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
}
