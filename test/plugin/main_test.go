// Package plugin tests the kubectl plugin (cmd/kubectl-lifecycle) end to
// end: the real plugin binary against a real kube-apiserver (test/testenv),
// with a real lifecycle-agent binary per node (`lifecycle-agent run
// --host-mode simulate`, the node's own identity) and kubelet stand-ins.
// The assertions are what a user sees: exit codes, output lines, the
// events' status, the Nodes, and the agents' disruption-slot Leases.
package plugin

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
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

var (
	env       *testenv.Env
	agentBin  string
	pluginBin string
	adminKC   string
	lc        *apiclient.LifecycleClients
	core      kubernetes.Interface
)

func TestMain(m *testing.M) {
	code, err := setup(m)
	if err != nil {
		// Never skip: a test that cannot run fails and says why.
		fmt.Fprintf(os.Stderr, "FAIL: test/plugin setup: %v\n", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "kubectl-lifecycle-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	agentBin, pluginBin = filepath.Join(dir, "lifecycle-agent"), filepath.Join(dir, "kubectl-lifecycle")

	// Build both binaries while the control plane starts.
	var wg sync.WaitGroup
	var buildErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		buildErr = errors.Join(build(ctx, agentBin, "./cmd/lifecycle-agent"), build(ctx, pluginBin, "./cmd/kubectl-lifecycle"))
	}()
	env, err = testenv.Start(ctx, testenv.Options{ControllerManager: true, Log: os.Stderr})
	wg.Wait()
	if err != nil {
		return 0, err
	}
	defer env.Stop()
	if buildErr != nil {
		return 0, buildErr
	}
	if err := env.InstallManifests(ctx); err != nil {
		return 0, err
	}
	if adminKC, err = env.WriteKubeconfigFor("admin"); err != nil {
		return 0, err
	}
	if lc, err = apiclient.NewLifecycleClients(env.AdminConfig()); err != nil {
		return 0, err
	}
	if core, err = kubernetes.NewForConfig(env.AdminConfig()); err != nil {
		return 0, err
	}
	return m.Run(), nil
}

// build builds a binary with the test build's tags: lifecycle_testnvml
// lets an agent use go-nvml's mock when its environment asks for it
// (internal/agent/testnvml.go); without that environment it has no GPUs,
// as on a host without the NVIDIA library.
func build(ctx context.Context, out, pkg string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-tags", "kustomize_disable_go_plugin_support,lifecycle_testnvml", "-o", out, pkg)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// ---- nodes and agents ----

// agentProc is bin/lifecycle-agent running as one node.
type agentProc struct {
	node string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	// sentinel is this agent's needs.reboot.sentinelFile (checked every
	// 200ms): create it and the node reports RebootRequired=True.
	sentinel string
}

// startNodes registers Ready nodes with kubelet stand-ins, starts an agent
// for each (system:node:<name>, host actions simulated) and waits until
// every agent has published its transitions. Everything stops at cleanup.
func startNodes(t *testing.T, nodes ...string) []*agentProc {
	t.Helper()
	return startNodesEnv(t, nil, nodes...)
}

// startNodesEnv is startNodes with extra environment for some agents (the
// test build's NVML mock: agent.EnvTestNVML, EnvTestNVMLFaults).
func startNodesEnv(t *testing.T, agentEnv map[string][]string, nodes ...string) []*agentProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var agents []*agentProc
	for _, n := range nodes {
		if err := testenv.CreateNode(ctx, env.AdminConfig(), n, map[string]string{"test": t.Name()}); err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.RunKubeletStandIn(ctx, env.AdminConfig(), n); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, startAgent(t, n, agentEnv[n]...))
	}
	for _, a := range agents {
		waitFor(t, "agent "+a.node+" to publish its transitions", 60*time.Second, func() bool {
			select {
			case <-a.done:
				t.Fatalf("agent %s exited:\n%s", a.node, tail(a.log, 40))
			default:
			}
			_, err := lc.Transitions.Get(ctx, a.node+"-uncordon", metav1.GetOptions{})
			return err == nil
		})
	}
	return agents
}

func startAgent(t *testing.T, node string, extraEnv ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	kc, err := env.WriteKubeconfigFor(agentIdentity(node))
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	sentinel := filepath.Join(dir, "reboot-required")
	// gpu.resetMethod nvml: the test build's NVML mock resets by PCI
	// remove and rediscover (there is no nvidia-smi here); agents without
	// the mock have no GPUs and no gpu-reset driver.
	if err := os.WriteFile(cfg, []byte("logLevel: debug\ndrain:\n  evictRetryDelay: 500ms\n"+
		"needs:\n  reboot:\n    sentinelFile: "+sentinel+"\n    interval: 200ms\ngpu:\n  resetMethod: nvml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	a := &agentProc{node: node, log: filepath.Join(dir, "agent.log"), done: make(chan struct{}), sentinel: sentinel}
	lf, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(agentBin, "run", "--node-name", node, "--kubeconfig", kc,
		"--journal", filepath.Join(dir, "journal.db"), "--socket", filepath.Join(dir, "agent.sock"),
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "--host-mode", "simulate", "--config", cfg)
	a.cmd.Stdout, a.cmd.Stderr = lf, lf
	a.cmd.Env = append(os.Environ(), extraEnv...)
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.cmd.Wait(); lf.Close(); close(a.done) }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-a.done:
		case <-time.After(20 * time.Second):
			_ = a.cmd.Process.Kill()
			<-a.done
			t.Errorf("agent %s did not stop within 20s of SIGTERM", node)
		}
		if t.Failed() {
			t.Logf("agent %s log (last lines):\n%s", node, tail(a.log, 30))
		}
	})
	return a
}

// agentIdentity is who the agents run as: the node's own identity
// (system:node:<name>, as with the kubelet's kubeconfig), or — with
// LIFECYCLE_PLUGIN_TEST_AGENTS_AS=admin — the test admin, to test the
// plugin apart from the agents' permissions.
func agentIdentity(node string) string {
	if os.Getenv("LIFECYCLE_PLUGIN_TEST_AGENTS_AS") == "admin" {
		return "admin"
	}
	return "node:" + node
}

// addPods puts n pods of a StatefulSet on node (a drain evicts them).
func addPods(t *testing.T, ns, node string, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &testenv.Workload{Namespace: ns, Name: "web-" + node, Node: node, Replicas: n}
	if err := w.Start(ctx, env.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, env.AdminConfig(), node, n); err != nil {
		t.Fatalf("pods on %s not running: %v", node, err)
	}
}

// cordonByHand marks a node unschedulable as a person would, without
// lifecycle-agent's ownership annotation.
func cordonByHand(t *testing.T, node string) {
	t.Helper()
	_, err := core.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType,
		[]byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := core.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func nodeCondition(n *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if string(n.Status.Conditions[i].Type) == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func podsOn(t *testing.T, node string) []string {
	t.Helper()
	l, err := core.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range l.Items {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return names
}

func eventsWithLabel(t *testing.T, selector string) []v1alpha1.LifecycleEvent {
	t.Helper()
	l, err := lc.Events.List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func eventsOn(t *testing.T, node string) []v1alpha1.LifecycleEvent {
	t.Helper()
	l, err := lc.Events.List(context.Background(), apiclient.BindingNodeSelector(node))
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func getEvent(t *testing.T, name string) *v1alpha1.LifecycleEvent {
	t.Helper()
	ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get event %s: %v", name, err)
	}
	return ev
}

func eventGone(name string) bool {
	_, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// ---- the plugin ----

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %s\n--- stdout\n%s--- stderr\n%s", r.code, r.took.Round(time.Millisecond), r.stdout, r.stderr)
}

// plugin runs kubectl-lifecycle as the admin, as `kubectl lifecycle ARGS`
// would, and returns its exit code and output.
func plugin(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	return pluginAs(t, adminKC, timeout, args...)
}

// pluginAs is plugin with the kubeconfig kc.
func pluginAs(t *testing.T, kc string, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, pluginBin, append(args, "--kubeconfig", kc)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		t.Fatalf("kubectl lifecycle %s: still running after %s\n%s", strings.Join(args, " "), timeout, r)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("kubectl lifecycle %s: %v", strings.Join(args, " "), err)
	}
	transcript(t, fmt.Sprintf("$ kubectl lifecycle %s\n%s", strings.Join(args, " "), r))
	return r
}

// transcripts holds each test's plugin commands and their output, logged
// once the test has ended and only if it failed: after its error lines,
// not before them, so that a log cut short (make test's summary keeps a
// dozen lines after "--- FAIL") still names what failed (CI at d22993f
// showed only the first two commands' output of TestDrainRebootUncordon).
var transcripts sync.Map // *testing.T -> *transcriptLog

type transcriptLog struct {
	mu  sync.Mutex
	buf strings.Builder
}

func transcript(t *testing.T, entry string) {
	v, loaded := transcripts.LoadOrStore(t, &transcriptLog{})
	l := v.(*transcriptLog)
	if !loaded {
		t.Cleanup(func() {
			transcripts.Delete(t)
			if t.Failed() {
				l.mu.Lock()
				defer l.mu.Unlock()
				t.Logf("the plugin commands it ran, in order:\n%s", l.buf.String())
			}
		})
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.WriteString(entry + "\n")
}

func wantExit(t *testing.T, r result, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: exit %d, want %d\n%s", what, r.code, code, r)
	}
}

func wantContains(t *testing.T, s, sub, what string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Errorf("%s: want %q in:\n%s", what, sub, s)
	}
}

// ---- small helpers ----

func waitFor(t *testing.T, what string, timeout time.Duration, f func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	for !f() {
		select {
		case <-deadline:
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
