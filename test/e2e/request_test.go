package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// agentBinary builds the real lifecycle-agent once per test binary.
func agentBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lifecycle-agent-e2e-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "lifecycle-agent")
		cmd := exec.Command("go", "build", "-tags", "kustomize_disable_go_plugin_support", "-o", binPath, "./cmd/lifecycle-agent")
		cmd.Dir = testenv.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// cli runs `lifecycle-agent <args>` against an agent's socket.
func cli(t *testing.T, a *testAgent, timeout time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentBinary(t), append(args, "--socket", a.cfg.SocketPath)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LIFECYCLE_AGENT_CONFIG=" + filepath.Join(a.dir, "config.yaml")}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), o.String(), e.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, o.String(), e.String()
}

// The pipeline's command: request through the local agent, with --wait.
func TestRequest(t *testing.T) {
	node := "request-node"
	newNode(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour, servers: true})
	if err := os.WriteFile(filepath.Join(a.dir, "config.yaml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, a, 2*time.Minute, "request", "drain", "--wait", "--timeout", "90s")
	if code != 0 || !strings.Contains(out, "Succeeded") {
		t.Fatalf("request drain --wait: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if !getNode(t, node).Spec.Unschedulable {
		t.Fatal("the requested drain did not cordon the node")
	}
	tests := []struct {
		name string
		args []string
		code int
		says string
	}{
		{name: "unknown driver", args: []string{"request", "frobnicate"}, code: 2, says: `no such enabled driver: "frobnicate"`},
		{name: "bad parameter", args: []string{"request", "drain", "--param", "gracePeriodSeconds=soon"}, code: 2, says: "parameters.gracePeriodSeconds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := cli(t, a, time.Minute, tc.args...)
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if code != tc.code || len(lines) != 1 || !strings.Contains(errOut, tc.says) {
				t.Fatalf("exit %d, stderr %q; want exit %d and one line saying %q", code, errOut, tc.code, tc.says)
			}
		})
	}
	code, out, errOut = cli(t, a, 2*time.Minute, "request", "uncordon", "--wait")
	if code != 0 || getNode(t, node).Spec.Unschedulable {
		t.Fatalf("request uncordon --wait: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = cli(t, a, time.Minute, "status")
	if code != 0 || !strings.Contains(out, "node:") || !strings.Contains(out, node) {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
}

// A request while the API server is down is journaled and published when
// it returns.
func TestRequestOffline(t *testing.T) {
	node := "request-offline-node"
	newNode(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour, servers: true})
	if err := os.WriteFile(filepath.Join(a.dir, "config.yaml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "uncordon"), metav1.GetOptions{})
		return err == nil
	})
	restart, err := env.StopProcess("kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, a, time.Minute, "request", "uncordon")
	// Followed while still queued: the running agent's own record, not
	// "the agent is not running" (the API server is what does not answer).
	wcode, wout, werr := -1, "", ""
	if code == 0 && len(strings.Fields(out)) > 0 {
		wcode, wout, werr = cli(t, a, time.Minute, "wait", strings.Fields(out)[0], "--timeout", "2s")
	}
	if rerr := restart(context.Background()); rerr != nil {
		t.Fatalf("restarting kube-apiserver: %v", rerr)
	}
	if code != 0 || !strings.Contains(out, "queued") {
		t.Fatalf("offline request: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if wcode != 4 || !strings.Contains(wout, "queued [the API server does not answer: the agent's own view]") || strings.Contains(wout+werr, "not running") {
		t.Errorf("wait on the queued request: exit %d (want 4, timed out while queued)\nstdout: %s\nstderr: %s", wcode, wout, werr)
	}
	name := strings.Fields(out)[0]
	ev := waitEvent(t, name, 2*time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("queued request %s ended %s: %s", name, ev.Status.ClaimStatus, ev.Status.Message)
	}
}

// `lifecycle-agent unpublish` (the package's prerm): the node's published
// transitions are withdrawn, except one an unfinished event in the journal
// uses (kept, exit 1, named) unless --force; while the agent runs it
// refuses (the journal is in use).
func TestUnpublish(t *testing.T) {
	node := "unpublish-node"
	newNode(t, node)
	a := startAgent(t, node, agentOpts{retention: time.Hour})
	if err := os.WriteFile(filepath.Join(a.dir, "config.yaml"), []byte("nodeName: "+node+"\njournalPath: "+a.cfg.JournalPath+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		t.Fatal(err)
	}
	waitTransition(t, transitionName(node, "drain"))
	run := func(args ...string) (int, string, string) {
		return cli(t, a, time.Minute, append([]string{"unpublish", "--kubeconfig", kc}, args...)...)
	}
	if code, out, errOut := run(); code == 0 || !strings.Contains(errOut, "stop it first") {
		t.Fatalf("unpublish while the agent runs: exit %d\n%s%s", code, out, errOut)
	}
	// An unfinished event in the journal: a drain held by a budget.
	startWorkload(t, "unpublish-ns", node, "", 1, 1)
	createEvent(t, "unpublish-drain", node, transitionName(node, "drain"), nil, nil)
	waitFor(t, "the drain running", 30*time.Second, func() bool {
		ev, err := clients(t, env.AdminConfig()).Events.Get(context.Background(), "unpublish-drain", metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "evict"
	})
	a.stop(t)
	code, out, errOut := run()
	if code != 1 || !strings.Contains(errOut, transitionName(node, "drain")+" (used by unfinished event unpublish-drain)") || !strings.Contains(out, "withdrew lifecycletransition "+transitionName(node, "uncordon")) {
		t.Fatalf("unpublish with an unfinished drain: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	lc := clients(t, env.AdminConfig())
	if _, err := lc.Transitions.Get(context.Background(), transitionName(node, "drain"), metav1.GetOptions{}); err != nil {
		t.Fatalf("the transition the unfinished drain uses was withdrawn: %v", err)
	}
	if code, out, errOut := run("--force"); code != 0 || !strings.Contains(out, "withdrew lifecycletransition "+transitionName(node, "drain")) {
		t.Fatalf("unpublish --force: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	list, err := lc.Transitions.List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("%d transitions of %s left after unpublish --force", len(list.Items), node)
	}
}
