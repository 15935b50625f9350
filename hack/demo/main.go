// Command demo is `make demo`: the agent's main job on an embedded local
// control plane, with host actions simulated.
//
// It starts a real etcd, kube-apiserver and kube-controller-manager (the
// same ones the tests use), installs the manifests, registers Node
// demo-node with a few pods behind a PodDisruptionBudget and a DaemonSet
// pod, runs bin/lifecycle-agent as that node (host.mode=simulate, the
// kubelet's identity system:node:demo-node), creates a drain event and then
// an uncordon event, prints their progress live and ends with a summary.
// Everything it started is stopped on exit.
package main

import (
	"context"
	"fmt"
	"net"
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
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

const node = "demo-node"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
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
	say("starting etcd, kube-apiserver and kube-controller-manager (first run builds them: minutes)")
	env, err := testenv.Start(ctx, testenv.Options{ControllerManager: true, Log: os.Stderr})
	if err != nil {
		return err
	}
	defer env.Stop()
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
	kc, err := env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	agentLog, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "run", "--node-name", node, "--kubeconfig", kc, "--journal", filepath.Join(dir, "journal.db"),
		"--socket", filepath.Join(dir, "agent.sock"), "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--host-mode", "simulate", "--config", writeConfig(dir))
	cmd.Stdout, cmd.Stderr = agentLog, agentLog
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	say("agent started as system:node:%s, host actions simulated (log: %s)", node, agentLog.Name())

	lc, err := apiclient.NewLifecycleClients(admin)
	if err != nil {
		return err
	}
	cs := kubernetes.NewForConfigOrDie(admin)
	if err := waitTransitions(ctx, lc); err != nil {
		return err
	}

	results := []string{}
	for _, step := range []struct{ name, transition string }{{"demo-drain", node + "-drain"}, {"demo-uncordon", node + "-uncordon"}} {
		ev := &v1alpha1.LifecycleEvent{ObjectMeta: metav1.ObjectMeta{Name: step.name},
			Spec: v1alpha1.LifecycleEventSpec{TransitionName: step.transition, BindingNode: node}}
		if _, err := lc.Events.Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			return err
		}
		say("created LifecycleEvent %s (transition %s)", step.name, step.transition)
		final, took, err := follow(ctx, lc, step.name)
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
	status, _ := exec.Command(bin, "status", "--socket", filepath.Join(dir, "agent.sock"), "--config", filepath.Join(dir, "config.yaml")).CombinedOutput()
	fmt.Println()
	fmt.Println("==== summary ====")
	for _, r := range results {
		fmt.Println(r)
	}
	fmt.Printf("node %s schedulable again: %v\n", node, !n.Spec.Unschedulable)
	fmt.Printf("`lifecycle-agent status` says:\n%s", indent(string(status)))
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

func writeConfig(dir string) string {
	p := filepath.Join(dir, "config.yaml")
	_ = os.WriteFile(p, []byte("# demo: host actions simulated; retry PDB-refused evictions every second\nlogLevel: info\ndrain:\n  evictRetryDelay: 1s\n"), 0o600)
	return p
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
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
func follow(ctx context.Context, lc *apiclient.LifecycleClients, name string) (*v1alpha1.LifecycleEvent, time.Duration, error) {
	start := time.Now()
	seen := map[string]bool{}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
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
