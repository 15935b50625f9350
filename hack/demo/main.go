// Command demo is `make demo`: the agent's main job on an embedded local
// control plane, with host actions simulated.
//
// It starts a real etcd and kube-apiserver (the same ones the tests use;
// no kube-controller-manager, whose build is minutes of its own on a cold
// machine: runControllerStandIn does the two things of it the demo needs),
// installs the manifests, registers Node
// demo-node with a few pods behind a PodDisruptionBudget and a DaemonSet
// pod, runs bin/lifecycle-agent as that node (host.mode=simulate, the
// kubelet's identity system:node:demo-node), creates a drain event and then
// an uncordon event, prints their progress live; then a reboot event: at
// the (simulated) reboot the demo kills the agent as a real reboot would,
// starts it again on the same journal, and the event resumes from the
// journal, whose record of it (intent and done of each step, with the boot
// it happened in) it prints at the end with a summary. Everything it
// started is stopped on exit.
//
// With -sandbox it does not run the script: it starts the control plane
// and three nodes, each with its own agent (simulate mode), prints the
// admin kubeconfig and commands to try, and runs until Ctrl-C.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

const node = "demo-node"

func main() {
	sandbox := flag.Bool("sandbox", false, "start the control plane and three nodes with their agents, print how to use them, run until Ctrl-C")
	flag.Parse()
	restore := func() {}
	if *sandbox {
		restore = ownForeground() // Ctrl-C: the sandbox's alone (make sandbox ends with status 0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if *sandbox {
		// Ctrl-C is how the sandbox ends, even while it starts.
		if err = runSandbox(ctx); ctx.Err() != nil {
			err = nil
		}
	} else {
		err = run(ctx)
	}
	stop()
	restore()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

func run(ctx context.Context) error {
	t0 := time.Now()
	root := testenv.RepoRoot()
	bin := filepath.Join(root, "bin", "lifecycle-agent")
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s not found: run make build", bin)
	}
	say("starting etcd and kube-apiserver (built by make demo before, cached)")
	env, err := testenv.Start(ctx, testenv.Options{Log: os.Stderr})
	if err != nil {
		return err
	}
	defer env.Stop()
	if err := runControllerStandIn(ctx, env.AdminConfig()); err != nil {
		return err
	}
	if err := env.InstallManifests(ctx); err != nil {
		return err
	}
	say("control plane ready at %s; manifests installed (CRDs, RBAC, admission policy)", env.URL)

	admin := env.AdminConfig()
	for _, n := range []string{node, "demo-spare"} {
		if err := testenv.CreateNode(ctx, admin, n, map[string]string{"demo": "true"}); err != nil {
			return err
		}
		if _, err := testenv.RunKubeletStandIn(ctx, admin, n); err != nil {
			return err
		}
	}
	w := &testenv.Workload{Namespace: "shop", Name: "web", Node: node, Spare: "demo-spare", Replicas: 3, MinAvailable: 2}
	if err := w.Start(ctx, admin); err != nil {
		return err
	}
	if err := daemonSetPod(ctx, admin); err != nil {
		return err
	}
	if err := testenv.WaitPodsRunning(ctx, admin, node, 4); err != nil {
		return fmt.Errorf("pods not running: %w", err)
	}
	say("node %s registered with pods shop/web-0..2 (PodDisruptionBudget minAvailable=2) and kube-system/node-exporter (DaemonSet)", node)

	dir, err := os.MkdirTemp("", "lifecycle-agent-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	a, err := newAgent(env, bin, dir, node)
	if err != nil {
		return err
	}
	if err := a.start(); err != nil {
		return err
	}
	defer a.stop(syscall.SIGTERM)
	say("agent started as system:node:%s, host actions simulated (log: %s)", node, a.log)

	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		return err
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	if err := waitTransitions(ctx, lc); err != nil {
		return err
	}

	results := []string{}
	for _, step := range []struct{ name, transition string }{{"demo-drain", node + "-drain"}, {"demo-uncordon", node + "-uncordon"}, {"demo-reboot", node + "-reboot"}} {
		ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: step.name},
			Spec: v1alpha1.LifecycleEventSpec{TransitionName: step.transition, BindingNode: node}}
		if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			return err
		}
		say("created LifecycleEvent %s (transition %s)", step.name, step.transition)
		tick := func() {}
		if step.name == "demo-reboot" {
			// The stand-in kubelet reports NotReady until the node is back,
			// as a real one does across a reboot.
			if err := testenv.SetNodeReady(ctx, admin, node, false); err != nil {
				return err
			}
			tick = a.rebootOnce(ctx, admin)
		}
		final, took, err := follow(ctx, lc, step.name, tick)
		if err != nil {
			return err
		}
		results = append(results, fmt.Sprintf("%-14s %-10s %6.1fs  %s", step.name, final.Status.ClaimStatus, took.Seconds(), final.Status.Message))
		if final.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			return fmt.Errorf("event %s ended %s: %s", step.name, final.Status.ClaimStatus, final.Status.Message)
		}
		if step.name == "demo-drain" {
			n, _ := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			pods, _ := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
			var names []string
			for _, p := range pods.Items {
				names = append(names, p.Namespace+"/"+p.Name)
			}
			say("after drain: node unschedulable=%v, cordoned-by=%q, pods left: %v; %d replacement pods on demo-spare",
				n.Spec.Unschedulable, n.Annotations[v1alpha1.AnnotationCordonedBy], names, w.Replaced())
			for _, c := range n.Status.Conditions {
				if c.Type == v1alpha1.NodeConditionLifecycleTransition || c.Type == v1alpha1.NodeConditionDrained {
					say("  Node condition %s=%s reason=%s: %s", c.Type, c.Status, c.Reason, c.Message)
				}
			}
		}
	}
	n, _ := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	status, _ := exec.Command(bin, "status", "--socket", a.socket(), "--config", filepath.Join(dir, "config.yaml")).CombinedOutput()
	a.stop(syscall.SIGTERM)
	record, err := journalRecord(bin, a, "demo-reboot")
	if err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("==== summary ====")
	for _, r := range results {
		fmt.Println(r)
	}
	fmt.Printf("node %s schedulable again: %v\n", node, !n.Spec.Unschedulable)
	fmt.Printf("`lifecycle-agent status` says:\n%s", indent(string(status)))
	fmt.Printf("the journal's record of demo-reboot (`lifecycle-agent journal export`, agent stopped): the reboot step's intent in the boot before, what follows in the new boot; a step the kill cut off ran again after the restart (attempt 2):\n%s", indent(record))
	fmt.Printf("demo finished in %.1fs; stopping the agent and the control plane\n", time.Since(t0).Seconds())
	if n.Spec.Unschedulable {
		return fmt.Errorf("node %s is still cordoned", node)
	}
	return nil
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return "  " + strings.Join(lines, "\n  ") + "\n"
}

// agent is one lifecycle-agent process for a node, restartable on the same
// journal.
type agent struct {
	env             *testenv.Env
	bin, dir, node  string
	kubeconfig, log string
	cmd             *exec.Cmd
	done            chan struct{} // closed when cmd exited
}

func newAgent(env *testenv.Env, bin, dir, node string) (*agent, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	kc, err := env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		return nil, err
	}
	return &agent{env: env, bin: bin, dir: dir, node: node, kubeconfig: kc, log: filepath.Join(dir, "agent.log")}, nil
}

func (a *agent) socket() string { return filepath.Join(a.dir, "agent.sock") }

func (a *agent) start() error {
	port, err := testenv.FreePort()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(a.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(a.bin, "run", "--node-name", a.node, "--kubeconfig", a.kubeconfig, "--journal", filepath.Join(a.dir, "journal.db"),
		"--socket", a.socket(), "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--host-mode", "simulate", "--config", writeConfig(a.dir))
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	a.cmd, a.done = cmd, done
	return nil
}

// stop signals the agent and waits for it to exit (at most 20 s, then kill).
func (a *agent) stop(sig syscall.Signal) {
	if a.cmd == nil {
		return
	}
	cmd, done := a.cmd, a.done
	a.cmd = nil
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// rebootOnce returns the reboot act's tick: once the agent's log shows the
// (simulated) reboot, kill the agent as a real reboot stops it, "boot"
// for two seconds, start it again on the same journal, and let the
// stand-in kubelet report Ready again.
func (a *agent) rebootOnce(ctx context.Context, admin *rest.Config) func() {
	done := false
	return func() {
		if done {
			return
		}
		b, _ := os.ReadFile(a.log)
		if !strings.Contains(string(b), "simulated reboot (nothing rebooted)") {
			return
		}
		done = true
		a.stop(syscall.SIGKILL)
		say("  the node reboots: the agent is killed in the middle of the event, as a real reboot stops it")
		time.Sleep(2 * time.Second)
		if err := a.start(); err != nil {
			say("  restarting the agent failed: %v", err)
			return
		}
		say("  the node is back (a new boot ID): the agent starts again on the same journal and resumes the event")
		time.Sleep(time.Second)
		if err := testenv.SetNodeReady(ctx, admin, node, true); err != nil {
			say("  setting the node Ready failed: %v", err)
			return
		}
		say("  the kubelet reports the node Ready again")
	}
}

// journalRecord is the event's step records from `lifecycle-agent journal
// export` (the agent stopped), one line each.
func journalRecord(bin string, a *agent, event string) (string, error) {
	out, err := exec.Command(bin, "journal", "export", "--journal", filepath.Join(a.dir, "journal.db")).Output()
	if err != nil {
		return "", fmt.Errorf("journal export: %w", err)
	}
	var doc journal.ExportDoc
	if err := json.Unmarshal(out, &doc); err != nil {
		return "", fmt.Errorf("journal export: %w", err)
	}
	var b strings.Builder
	for _, h := range doc.History {
		if h.Event.Name != event {
			continue
		}
		fmt.Fprintf(&b, "event %s: %s (%s)\n", h.Event.Name, h.Outcome, h.Message)
		for _, st := range h.Steps {
			boot := st.BootID
			if len(boot) > 8 {
				boot = boot[:8]
			}
			fmt.Fprintf(&b, "  %s  %-10s %-6v %-8v attempt %d  boot %s  %s\n", st.At.Format("15:04:05.000"), st.Step, st.Phase, st.State, st.Attempt, boot, st.Message)
		}
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("journal export: no finished event %s", event)
	}
	return b.String(), nil
}

func writeConfig(dir string) string {
	p := filepath.Join(dir, "config.yaml")
	_ = os.WriteFile(p, []byte("# demo: host actions simulated; retry PDB-refused evictions every second\nlogLevel: info\ndrain:\n  evictRetryDelay: 1s\n"), 0o600)
	return p
}

func daemonSetPod(ctx context.Context, cfg *rest.Config) error {
	cs := kubernetes.NewForConfigOrDie(cfg)
	labels := map[string]string{"app": "node-exporter"}
	ds, err := cs.AppsV1().DaemonSets("kube-system").Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "node-exporter"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "registry.invalid/x:1"}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	yes := true
	_, err = cs.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "node-exporter-" + node, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}}},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "x", Image: "registry.invalid/x:1"}}},
	}, metav1.CreateOptions{})
	return err
}

func waitTransitions(ctx context.Context, lc *apiclient.LifecycleClients) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		l, err := lc.Transitions.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err == nil && len(l.Items) >= 2 {
			var names []string
			for _, t := range l.Items {
				names = append(names, fmt.Sprintf("%s (%s → %s)", t.Name, t.Spec.Start, t.Spec.End))
			}
			say("the agent published its transitions: %s", strings.Join(names, ", "))
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the agent published no transitions within 60s")
}

// follow prints the event's steps as they change, until it ends.
// tick runs at every look (the reboot act's kill and restart).
func follow(ctx context.Context, lc *apiclient.LifecycleClients, name string, tick func()) (*v1alpha1.LifecycleEvent, time.Duration, error) {
	start := time.Now()
	seen := map[string]bool{}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		tick()
		ev, err := lc.Events.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			st := ev.Status
			key := "claim:" + string(st.ClaimStatus)
			if st.ClaimStatus != "" && !seen[key] {
				seen[key] = true
				say("  %s: %s", name, st.ClaimStatus)
			}
			for _, s := range st.Steps {
				k := s.Name + ":" + string(s.State)
				if !seen[k] && s.State != v1alpha1.StepPending {
					seen[k] = true
					took := ""
					if s.StartTime != nil && s.FinishTime != nil {
						// status times have one-second resolution
						if d := s.FinishTime.Sub(s.StartTime.Time); d < time.Second {
							took = " in <1s"
						} else {
							took = fmt.Sprintf(" in %s", d)
						}
					}
					say("  %s: step %-10s %s%s", name, s.Name, s.State, took)
				}
			}
			if st.Message != "" && !seen["msg:"+st.Message] {
				seen["msg:"+st.Message] = true
				say("  %s: %s", name, st.Message)
			}
			if st.ClaimStatus.Finished() {
				return ev, time.Since(start), nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil, 0, fmt.Errorf("event %s did not finish within 3 minutes", name)
}

// sandboxNodes are the sandbox's nodes, each with its own agent.
var sandboxNodes = []string{"sandbox-1", "sandbox-2", "sandbox-3"}

// runSandbox is `make sandbox`: the control plane, three nodes with pods
// behind a PodDisruptionBudget and an agent each (simulate mode), the
// admin kubeconfig written out and a few commands to try; it runs until
// Ctrl-C (or SIGTERM), then stops everything it started.
func runSandbox(ctx context.Context) error {
	root := testenv.RepoRoot()
	bin := filepath.Join(root, "bin", "lifecycle-agent")
	plugin := filepath.Join(root, "bin", "kubectl-lifecycle")
	for _, b := range []string{bin, plugin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s not found: run make build", b)
		}
	}
	say("starting etcd and kube-apiserver (built by make sandbox before, cached)")
	env, err := testenv.Start(ctx, testenv.Options{Log: io.Discard})
	if err != nil {
		return err
	}
	defer env.Stop()
	if err := runControllerStandIn(ctx, env.AdminConfig()); err != nil {
		return err
	}
	if err := env.InstallManifests(ctx); err != nil {
		return err
	}
	admin := env.AdminConfig()
	dir, err := os.MkdirTemp("", "lifecycle-agent-sandbox-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, n := range append([]string{"sandbox-spare"}, sandboxNodes...) {
		if err := testenv.CreateNode(ctx, admin, n, map[string]string{"sandbox": "true"}); err != nil {
			return err
		}
		if _, err := testenv.RunKubeletStandIn(ctx, admin, n); err != nil {
			return err
		}
	}
	var agents []*agent
	defer func() {
		for _, a := range agents {
			a.stop(syscall.SIGTERM)
		}
	}()
	for _, n := range sandboxNodes {
		w := &testenv.Workload{Namespace: n, Name: "web", Node: n, Spare: "sandbox-spare", Replicas: 3, MinAvailable: 2}
		if err := w.Start(ctx, admin); err != nil {
			return err
		}
		a, err := newAgent(env, bin, filepath.Join(dir, n), n)
		if err != nil {
			return err
		}
		if err := a.start(); err != nil {
			return err
		}
		agents = append(agents, a)
	}
	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		return err
	}
	for _, n := range sandboxNodes {
		if err := waitTransitionsOf(ctx, lc, n); err != nil {
			return err
		}
	}
	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := testenv.WriteKubeconfig(kc, admin); err != nil {
		return err
	}
	a := agents[0]
	fmt.Printf(`
==== sandbox ready ====
A real kube-apiserver at %s with nodes %s (pods behind a
PodDisruptionBudget on each; replacements land on sandbox-spare), each with
its own lifecycle-agent in simulate mode (host actions logged, never done).

  export KUBECONFIG=%s
  export PATH=%s:$PATH

Try (kubectl lifecycle X is kubectl-lifecycle X: without kubectl, run that):
  kubectl lifecycle transitions
  kubectl lifecycle rollout reboot sandbox-1 sandbox-2 sandbox-3 --max-concurrent 1 --wait
  kubectl lifecycle run drain sandbox-2        # then: kubectl lifecycle cancel <event> --wait
  kubectl lifecycle status sandbox-1
  kubectl lifecycle uncordon sandbox-2
  %s status --socket %s --config %s
  tail -f %s

Ctrl-C stops the agents and the control plane and removes %s.
`, env.URL, strings.Join(sandboxNodes, ", "), kc, filepath.Dir(plugin), bin, a.socket(), filepath.Join(a.dir, "config.yaml"), a.log, dir)
	<-ctx.Done()
	say("stopping the agents and the control plane")
	return nil
}

// waitTransitionsOf waits until node's agent has published its transitions.
func waitTransitionsOf(ctx context.Context, lc *apiclient.LifecycleClients, n string) error {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		l, err := lc.Transitions.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n})
		if err == nil && len(l.Items) >= 2 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("the agent of %s published no transitions within 60s", n)
}
