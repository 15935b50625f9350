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
	if rerr := restart(context.Background()); rerr != nil {
		t.Fatalf("restarting kube-apiserver: %v", rerr)
	}
	if code != 0 || !strings.Contains(out, "queued") {
		t.Fatalf("offline request: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	name := strings.Fields(out)[0]
	ev := waitEvent(t, name, 2*time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("queued request %s ended %s: %s", name, ev.Status.ClaimStatus, ev.Status.Message)
	}
}
