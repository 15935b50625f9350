package docs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

const (
	quickstartFile = "docs/quickstart.md"
	// minCommands guards against a quick start whose sh blocks were lost
	// (renamed to another language, say): the test would pass vacuously.
	minCommands = 8
	// commandTimeout bounds one command of the quick start.
	commandTimeout = 5 * time.Minute
	qsNode         = "worker-1"
	qsSpare        = "worker-2"
)

// command is one command of the quick start.
type command struct {
	line     int    // 1-based line in the file where it starts
	text     string // as bash gets it (continuations joined)
	wantExit int
}

var (
	exitsComment = regexp.MustCompile(`\s#.*\bexits\s+(\d+)\b`)
	assignment   = regexp.MustCompile(`^(export\s+)?[A-Za-z_][A-Za-z0-9_]*=`)
)

// quickstartCommands extracts the commands of the ```sh blocks of a
// Markdown file, in order. A line ending in a backslash continues on the
// next; blank lines and lines starting with # are not commands.
func quickstartCommands(md []byte) ([]command, error) {
	var (
		out     []command
		inSh    bool
		inOther bool
		cur     *command
	)
	sc := bufio.NewScanner(bytes.NewReader(md))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case !inSh && !inOther && strings.HasPrefix(trimmed, "```"):
			if strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) == "sh" {
				inSh = true
			} else {
				inOther = true
			}
			continue
		case (inSh || inOther) && trimmed == "```":
			if cur != nil {
				return nil, fmt.Errorf("%s:%d: the block ends inside a continued command", quickstartFile, n)
			}
			inSh, inOther = false, false
			continue
		case !inSh:
			continue
		}
		if cur == nil {
			if trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			cur = &command{line: n}
		}
		if strings.HasSuffix(line, "\\") {
			cur.text += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		cur.text = strings.TrimSpace(cur.text + line)
		if m := exitsComment.FindStringSubmatch(cur.text); m != nil {
			cur.wantExit, _ = strconv.Atoi(m[1])
		}
		switch {
		case strings.HasPrefix(cur.text, "$ "):
			return nil, fmt.Errorf("%s:%d: %q: no prompts in sh blocks: the line must be the command itself", quickstartFile, cur.line, cur.text)
		case assignment.MatchString(cur.text):
			return nil, fmt.Errorf("%s:%d: %q: each command runs in its own shell, so a variable set here is lost; use a variable the reader is told to set (NODE) or inline the value", quickstartFile, cur.line, cur.text)
		}
		out = append(out, *cur)
		cur = nil
	}
	if inSh || inOther {
		return nil, fmt.Errorf("%s: unterminated code block", quickstartFile)
	}
	return out, sc.Err()
}

func TestQuickStartParse(t *testing.T) {
	md := []byte("text\n```sh\n# comment\nfoo --a \\\n  --b\n\nbar   # exits 2: why\n```\n```text\nnot a command\n```\n```sh\nbaz | qux\n```\n")
	got, err := quickstartCommands(md)
	if err != nil {
		t.Fatal(err)
	}
	want := []command{{line: 4, text: "foo --a    --b"}, {line: 7, text: "bar   # exits 2: why", wantExit: 2}, {line: 13, text: "baz | qux"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	for _, bad := range []string{"```sh\nX=1\n```\n", "```sh\nexport X=1\n```\n", "```sh\n$ ls\n```\n", "```sh\nls\n"} {
		if _, err := quickstartCommands([]byte(bad)); err == nil {
			t.Errorf("%q: accepted; want an error", bad)
		}
	}
}

// TestQuickStart runs every command of docs/quickstart.md (see the package
// doc for the environment it builds).
func TestQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane and builds the binaries; skipped in -short mode")
	}
	root := testenv.RepoRoot()
	md, err := os.ReadFile(filepath.Join(root, quickstartFile))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := quickstartCommands(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < minCommands {
		t.Fatalf("%s has %d commands in ```sh blocks; want at least %d", quickstartFile, len(cmds), minCommands)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")

	// The binaries build while the control plane starts.
	var (
		wg       sync.WaitGroup
		buildErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		buildErr = buildBinaries(ctx, root, bin)
	}()
	env, err := testenv.Start(ctx, testenv.Options{ControllerManager: true, Log: os.Stderr})
	if err == nil {
		t.Cleanup(env.Stop)
		err = env.InstallManifests(ctx)
	}
	wg.Wait()
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, filepath.Join(bin, shimName)); err != nil {
		t.Fatal(err)
	}

	// The cluster: the node, a spare, kubelet stand-ins, a workload.
	admin := env.AdminConfig()
	for _, n := range []string{qsNode, qsSpare} {
		if err := testenv.CreateNode(ctx, admin, n, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.RunKubeletStandIn(ctx, admin, n); err != nil {
			t.Fatal(err)
		}
	}
	w := &testenv.Workload{Namespace: "shop", Name: "web", Node: qsNode, Spare: qsSpare, Replicas: 3, MinAvailable: 2}
	if err := w.Start(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, admin, qsNode, 3); err != nil {
		t.Fatalf("pods on %s not running: %v", qsNode, err)
	}

	// The node: its configuration, a logind, the agent.
	nodeKC, err := env.WriteKubeconfigFor("node:" + qsNode)
	if err != nil {
		t.Fatal(err)
	}
	adminKC, err := env.WriteKubeconfigFor("admin")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"etc", "state", "run"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cfgPath := filepath.Join(dir, "etc", "config.yaml")
	cfg := fmt.Sprintf(`# test/docs: the node's /etc/lifecycle-agent/config.yaml
nodeName: %s
kubeconfig: %s
journalPath: %s
socketPath: %s
host:
  mode: simulate
drain:
  evictRetryDelay: 1s
`, qsNode, nodeKC, filepath.Join(dir, "state", "journal.db"), filepath.Join(dir, "run", "agent.sock"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logind := logindtest.Start(t, logindtest.Options{})
	// For the docs' samples of failing checks (checkOutputs): a logind
	// whose delay is below the budget, and a configuration whose journal is
	// corrupt.
	shortLogind := logindtest.Start(t, logindtest.Options{InhibitDelayMax: 2 * time.Second})
	corruptCfg, err := writeCorruptJournalConfig(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	offline, err := writeOfflineAgent(dir, filepath.Join(bin, "lifecycle-agent"))
	if err != nil {
		t.Fatal(err)
	}
	budgetScenario, err := writeBudgetScenario(dir)
	if err != nil {
		t.Fatal(err)
	}
	environ := cleanEnviron(
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HOME="+dir,
		"KUBECONFIG="+adminKC,
		"NODE="+qsNode,
		"LIFECYCLE_AGENT_CONFIG="+cfgPath,
		"DBUS_SYSTEM_BUS_ADDRESS="+logind.Address(),
		"DOCS_LOGIND_SHORT="+shortLogind.Address(),
		"DOCS_CONFIG_CORRUPT_JOURNAL="+corruptCfg,
		"DOCS_OFFLINE_AGENT="+offline,
		"DOCS_BUDGET_SCENARIO="+budgetScenario,
	)
	agentLog := filepath.Join(dir, "agent.log")
	stopAgent := startAgent(t, filepath.Join(bin, "lifecycle-agent"), environ, agentLog)
	defer stopAgent()
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, 60*time.Second, func() bool {
		_, err := lc.Transitions.Get(ctx, qsNode+"-drain", metav1.GetOptions{})
		return err == nil
	}); err != nil {
		t.Fatalf("the agent published no transitions within 60s; its log:\n%s", tail(agentLog))
	}

	// The quick start, command by command.
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	outputs := map[int]string{}
	for i, c := range cmds {
		code, out := runCommand(ctx, c.text, work, environ)
		outputs[c.line] = out
		t.Logf("[%d/%d] %s:%d\n$ %s\n%s(exit %d)", i+1, len(cmds), quickstartFile, c.line, c.text, out, code)
		if code != c.wantExit {
			t.Fatalf("%s:%d: %q exited %d, want %d\noutput:\n%s\nagent log (tail):\n%s", quickstartFile, c.line, c.text, code, c.wantExit, out, tail(agentLog))
		}
	}

	// What an operator would see afterwards.
	events, err := lc.Events.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	succeeded := map[string]int{}
	for _, ev := range events.Items {
		if ev.Spec.BindingNode != qsNode {
			continue
		}
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Errorf("event %s (%s) ended %q: %s", ev.Name, ev.Spec.TransitionName, ev.Status.ClaimStatus, ev.Status.Message)
			continue
		}
		succeeded[strings.TrimPrefix(ev.Spec.TransitionName, qsNode+"-")]++
	}
	if succeeded["drain"] == 0 || succeeded["uncordon"] == 0 {
		t.Errorf("succeeded events by driver: %v; want a drain and an uncordon", succeeded)
	}
	if w.Replaced() < 3 {
		t.Errorf("%d of 3 pods were evicted and replaced on %s; want all 3", w.Replaced(), qsSpare)
	}
	core := kubernetes.NewForConfigOrDie(admin)
	n, err := core.CoreV1().Nodes().Get(ctx, qsNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Spec.Unschedulable {
		t.Errorf("node %s is still cordoned (cordoned-by %q)", qsNode, n.Annotations[v1alpha1.AnnotationCordonedBy])
	}

	// The docs' sample outputs.
	lastEnd := time.Now() // the quick start's last command ended
	nextSecond := func() {
		if next := lastEnd.Truncate(time.Second).Add(time.Second); time.Now().Before(next) {
			time.Sleep(time.Until(next))
		}
	}
	present := strings.NewReplacer(
		cfgPath, "/etc/lifecycle-agent/config.yaml",
		corruptCfg, "/etc/lifecycle-agent/config.yaml",
		filepath.Join(dir, "offline", "config.yaml"), "/etc/lifecycle-agent/config.yaml",
		filepath.Join(dir, "offline", "journal.db"), "/var/lib/lifecycle-agent/journal.db",
		filepath.Join(dir, "offline", "agent.sock"), "/run/lifecycle-agent/agent.sock",
		filepath.Join(dir, "offline", "kubeconfig"), "/etc/kubernetes/kubelet.conf",
		filepath.Join(dir, "state", "journal.db"), "/var/lib/lifecycle-agent/journal.db",
		filepath.Join(dir, "corrupt", "journal.db"), "/var/lib/lifecycle-agent/journal.db",
		filepath.Join(dir, "run", "agent.sock"), "/run/lifecycle-agent/agent.sock",
		nodeKC, "/etc/kubernetes/kubelet.conf",
		adminKC, "/etc/kubernetes/admin.conf",
		admin.Host, "https://10.0.0.10:6443",
	).Replace
	checkOutputs(t, root, outputRun{
		quickstart: cmds,
		outputs:    outputs,
		run: func(text string) string {
			// kubectl lifecycle history orders by whole-second completion
			// times, then by name: an event completing in the second the
			// previous command's event completed in would be listed by
			// name, not in the order it ran (the quick start's uncordon,
			// then docs/pipelines.md's drain, swapped now and then in
			// docs/plugin.md's history). Each command starts in a second
			// of its own.
			nextSecond()
			defer func() { lastEnd = time.Now() }()
			code, out := runCommand(ctx, text, work, environ)
			t.Logf("docs sample: $ %s\n%s(exit %d)", text, out, code)
			return out
		},
		node:    qsNode,
		present: present,
	})
}

// writeCorruptJournalConfig writes a copy of the node's configuration
// whose journal is a corrupt file, for the docs' sample of doctor's
// journal check failing, and returns its path.
func writeCorruptJournalConfig(dir, cfg string) (string, error) {
	d := filepath.Join(dir, "corrupt")
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", err
	}
	journal := filepath.Join(d, "journal.db")
	// A bbolt file whose meta pages are garbage.
	if err := os.WriteFile(journal, bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 4096), 0o600); err != nil {
		return "", err
	}
	var out []string
	for _, l := range strings.Split(cfg, "\n") {
		if strings.HasPrefix(l, "journalPath:") {
			l = "journalPath: " + journal
		}
		out = append(out, l)
	}
	p := filepath.Join(d, "config.yaml")
	return p, os.WriteFile(p, []byte(strings.Join(out, "\n")), 0o600)
}

// writeOfflineAgent writes a script that runs its arguments against a
// second agent for the same node whose API server never answers (a closed
// port), for the docs' sample of a queued request: it starts that agent
// (its own configuration, journal and socket under dir/offline, the same
// logind), waits for its socket, runs "$@" with LIFECYCLE_AGENT_CONFIG set
// to that agent's, and stops the agent. It returns the script's path.
func writeOfflineAgent(dir, agent string) (string, error) {
	d := filepath.Join(dir, "offline")
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", err
	}
	port, err := testenv.FreePort() // nothing listens there once it returns
	if err != nil {
		return "", err
	}
	metrics, err := testenv.FreePort()
	if err != nil {
		return "", err
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: offline
  cluster:
    server: https://127.0.0.1:%d
    insecure-skip-tls-verify: true
users:
- name: offline
  user:
    token: offline
contexts:
- name: offline
  context: {cluster: offline, user: offline}
current-context: offline
`, port)
	if err := os.WriteFile(filepath.Join(d, "kubeconfig"), []byte(kc), 0o600); err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`nodeName: %s
kubeconfig: %s
journalPath: %s
socketPath: %s
host:
  mode: simulate
`, qsNode, filepath.Join(d, "kubeconfig"), filepath.Join(d, "journal.db"), filepath.Join(d, "agent.sock"))
	if err := os.WriteFile(filepath.Join(d, "config.yaml"), []byte(cfg), 0o600); err != nil {
		return "", err
	}
	script := fmt.Sprintf(`#!/bin/bash
# test/docs: run "$@" against an agent whose API server does not answer.
export LIFECYCLE_AGENT_CONFIG=%[1]s/config.yaml
# timeout: the agent never outlives a killed test by long.
timeout 120 %[2]s run --metrics-address 127.0.0.1:%[3]d >>%[1]s/agent.log 2>&1 </dev/null &
agent=$!
trap 'kill -TERM $agent 2>/dev/null; wait $agent 2>/dev/null' EXIT
for _ in $(seq 300); do
  [ -S %[1]s/agent.sock ] && break
  sleep 0.1
done
"$@"
`, d, agent, metrics)
	p := filepath.Join(d, "run.sh")
	return p, os.WriteFile(p, []byte(script), 0o700)
}

// writeBudgetScenario writes a script for the docs' samples of a drain
// held by a PodDisruptionBudget until its SLA passes: on its first run it
// applies a ReplicaSet db (one pod, bound to the node; the test control
// plane runs the replicaset controller, not the statefulset one) with a budget
// minAvailable 1, a transition worker-1-drain-short (the drain driver, SLA
// 15s) and an event for it, then follows the event with kubectl lifecycle
// status until it ends, keeping the first message that says the budget
// blocked an eviction (file "blocked") and the end's message ("expired").
// Each run prints the file its argument names. It returns the script's
// path.
func writeBudgetScenario(dir string) (string, error) {
	d := filepath.Join(dir, "budget")
	if err := os.Mkdir(d, 0o700); err != nil {
		return "", err
	}
	script := fmt.Sprintf(`#!/bin/bash
# test/docs: a drain held by a PodDisruptionBudget until its SLA passes.
d=%[1]s
node=%[2]s
if [ ! -f "$d/expired" ]; then
  kubectl apply -f - >/dev/null <<YAML || exit 1
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: db, namespace: shop}
spec:
  replicas: 1
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      nodeName: $node
      containers: [{name: db, image: registry.k8s.io/pause:3.9}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: db, namespace: shop}
spec:
  minAvailable: 1
  selector: {matchLabels: {app: db}}
---
apiVersion: lifecycle.x-k8s.io/v1alpha1
kind: LifecycleTransition
metadata: {name: $node-drain-short}
spec: {start: DrainStarted, end: DrainComplete, nodeName: $node, sla: 15s, driver: lifecycle-agent.x-k8s.io/drain}
YAML
  sleep 5 # the pod Running and Ready, the budget's status computed
  kubectl apply -f - >/dev/null <<YAML || exit 1
apiVersion: lifecycle.x-k8s.io/v1alpha1
kind: LifecycleEvent
metadata: {name: $node-drain-sla}
spec: {transitionName: $node-drain-short, bindingNode: $node}
YAML
  for _ in $(seq 120); do
    st=$(kubectl lifecycle status $node-drain-sla -o jsonpath='{.status.claimStatus}')
    msg=$(kubectl lifecycle status $node-drain-sla -o jsonpath='{.status.message}')
    case "$msg" in *"blocked: PodDisruptionBudget"*) [ -f "$d/blocked" ] || echo "$msg" >"$d/blocked" ;; esac
    case "$st" in Succeeded|Failed|SlaExpired) echo "$msg" >"$d/expired"; break ;; esac
    sleep 0.5
  done
fi
cat "$d/$1"
`, d, qsNode)
	p := filepath.Join(d, "run.sh")
	return p, os.WriteFile(p, []byte(script), 0o700)
}

// buildBinaries builds the agent and the kubectl plugin into bin.
func buildBinaries(ctx context.Context, root, bin string) error {
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, b := range []struct{ pkg, out string }{
		{"./cmd/lifecycle-agent", "lifecycle-agent"},
		{"./cmd/kubectl-lifecycle", "kubectl-lifecycle"},
	} {
		cmd := exec.CommandContext(ctx, "go", "build", "-tags", "kustomize_disable_go_plugin_support", "-o", filepath.Join(bin, b.out), b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

// cleanEnviron is this process's environment without the variables the
// quick start's commands read (the agent's own, kubectl's, D-Bus's, NODE),
// plus extra.
func cleanEnviron(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "LIFECYCLE_AGENT_"), strings.HasPrefix(k, "GOFAIL_"),
			k == "KUBECONFIG", k == "NODE", k == "PATH", k == "HOME", k == "DBUS_SYSTEM_BUS_ADDRESS", k == "NOTIFY_SOCKET":
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

// startAgent runs `lifecycle-agent run` in the background, as systemd
// would, and returns a function that stops it (SIGTERM, then SIGKILL).
func startAgent(t *testing.T, bin string, environ []string, logPath string) func() {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port))
	cmd.Env = environ
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); lf.Close(); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// runCommand runs one quick-start command with bash and returns its exit
// code and combined output.
func runCommand(ctx context.Context, text, dir string, environ []string) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", text)
	cmd.Dir = dir
	cmd.Env = environ
	cmd.Stdin = nil
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), out.String()
	}
	return -1, out.String() + fmt.Sprintf("(did not finish: %v)\n", err)
}

func waitFor(ctx context.Context, d time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// tail returns the last lines of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}
