package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// testAgent is a real agent (internal/agent, the code `lifecycle-agent run`
// runs) in this process, as system:node:<node>, host actions simulated.
type testAgent struct {
	node    string
	dir     string
	cfg     *config.Config
	cancel  context.CancelFunc
	done    chan error
	logBuf  *syncBuffer
	Journal string
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type agentOpts struct {
	retention time.Duration
	extra     []drivers.Driver
	dir       string // reuse a journal directory (restart)
	servers   bool   // serve the control socket (and metrics on a free port)
	logind    string // D-Bus address of a test logind: enables the shutdown guard
	budget    time.Duration
	configure func(*config.Config)
	// rest replaces the node's own client config (e.g. through a CutProxy).
	rest *rest.Config
	// hostBootID, when set, is the file the simulated host reads as the
	// machine's boot ID (/proc/sys/kernel/random/boot_id otherwise).
	hostBootID string
}

// exe is the test binary itself, re-executed as the journal's integrity
// checker (see TestMain).
func checkCommand() []string {
	exe, _ := os.Executable()
	return []string{exe, "journal-check-file"}
}

func startAgent(t *testing.T, node string, o agentOpts) *testAgent {
	t.Helper()
	dir := o.dir
	if dir == "" {
		dir = t.TempDir()
	}
	cfg, err := config.Load(config.Options{DefaultPath: filepath.Join(dir, "absent.yaml"), Hostname: func() (string, error) { return node, nil }})
	if err != nil {
		t.Fatal(err)
	}
	cfg.NodeName = node
	cfg.JournalPath = filepath.Join(dir, "journal.db")
	cfg.SocketPath = filepath.Join(dir, "agent.sock")
	cfg.EventRetention = o.retention
	cfg.Host.Mode = config.HostModeSimulate
	cfg.Drain.EvictRetryDelay = 500 * time.Millisecond
	// The reboot-required sentinel of this agent's own (the host's
	// /var/run/reboot-required would make the tests depend on the machine).
	cfg.Needs.Reboot.SentinelFile = filepath.Join(dir, "reboot-required")
	cfg.MetricsAddress = "127.0.0.1:0"
	if o.budget > 0 {
		cfg.Shutdown.Budget = o.budget
	}
	if o.configure != nil {
		o.configure(cfg)
	}
	buf := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(buf), &slog.HandlerOptions{Level: slog.LevelDebug}))
	host, err := hostops.NewSimulated(hostops.SimulatedConfig{StateDir: dir, Logger: log, Paths: hostPaths(o.hostBootID)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &testAgent{node: node, dir: dir, cfg: cfg, cancel: cancel, done: make(chan error, 1), logBuf: buf, Journal: cfg.JournalPath}
	ready := make(chan struct{})
	rc := o.rest
	if rc == nil {
		rc = env.NodeConfig(node)
	}
	go func() {
		a.done <- agent.Run(ctx, agent.Options{Config: cfg, Log: log, RestConfig: rc, Host: host,
			CheckCommand: checkCommand(), NoServers: !o.servers, NoLogind: o.logind == "", LogindAddress: o.logind, NoGPU: true, ExtraDrivers: o.extra, Ready: ready})
	}()
	select {
	case <-ready:
	case err := <-a.done:
		t.Fatalf("agent for %s did not start: %v\n%s", node, err, buf.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("agent for %s not ready after 60s\n%s", node, buf.String())
	}
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *testAgent) stop(t *testing.T) {
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil && !strings.Contains(err.Error(), "context canceled") {
			t.Errorf("agent %s: %v", a.node, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("agent %s did not stop within 30s", a.node)
	}
	if t.Failed() {
		t.Logf("agent %s log:\n%s", a.node, a.logBuf.String())
	}
}

// newNode registers a Ready node with a kubelet stand-in.
func newNode(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := testenv.CreateNode(ctx, env.AdminConfig(), name, map[string]string{"e2e": "true"}); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	if _, err := testenv.RunKubeletStandIn(kctx, env.AdminConfig(), name); err != nil {
		t.Fatal(err)
	}
}

func createEvent(t *testing.T, name, node, transition string, params map[string]string, d *v1alpha1.DisruptionBudget) {
	t.Helper()
	lc := clients(t, env.AdminConfig())
	ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.LifecycleEventSpec{TransitionName: transition, BindingNode: node, Parameters: params, Disruption: d}}
	if _, err := lc.Events.Create(context.Background(), ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits until the event reaches an end state and returns it.
func waitEvent(t *testing.T, name string, timeout time.Duration) *v1alpha1.LifecycleEvent {
	t.Helper()
	lc := clients(t, env.AdminConfig())
	deadline := time.Now().Add(timeout)
	var last *v1alpha1.LifecycleEvent
	for time.Now().Before(deadline) {
		ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			last = ev
			if ev.Status.ClaimStatus.Finished() && len(ev.Finalizers) == 0 {
				return ev
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if last != nil {
		t.Fatalf("event %s not finished after %s: status %+v", name, timeout, last.Status)
	}
	t.Fatalf("event %s not found", name)
	return nil
}

func waitFor(t *testing.T, what string, timeout time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if f() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", timeout, what)
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := kubernetes.NewForConfigOrDie(env.AdminConfig()).CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
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
	l, err := kubernetes.NewForConfigOrDie(env.AdminConfig()).CoreV1().Pods("").List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range l.Items {
		names = append(names, p.Namespace+"/"+p.Name)
	}
	return names
}

func transitionName(node, short string) string { return node + "-" + short }

var _ = engine.TransitionName
var _ = apiclient.BindingNodeSelector
var _ = fmt.Sprintf

// hostPaths reads the machine's boot ID from bootID when set.
func hostPaths(bootID string) host.Paths { return host.Paths{BootIDFile: bootID} }
