package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// DrainOptions configure DrainComparison.
type DrainOptions struct {
	Dir     string
	Kubectl string // a kubectl binary at the agent's client-go version
	// Apps × Replicas pods, one PDB per app with MinAvailable.
	Apps, Replicas, MinAvailable int
	Repeats                      int
}

// DrainRun is one drain of each kind.
type DrainRun struct {
	AgentSec   float64 `json:"agentSeconds"`   // event created → Succeeded (admin watch)
	KubectlSec float64 `json:"kubectlSeconds"` // kubectl drain, exec to exit
	Ratio      float64 `json:"ratio"`          // agent / kubectl
	AgentFirst bool    `json:"agentFirst"`
}

// DrainComparison puts Apps×Replicas pods (StatefulSet-owned, one PDB per
// app) on each of two nodes, with the kubelet stand-in finishing evicted
// pods and a controller stand-in (testenv.Workload) re-creating them on a
// spare node, so each PDB lets the next eviction through once the
// replacement runs. It then drains one node with the agent (a drain event,
// the agent in-process with the daemon's defaults) and the other with
// `kubectl drain --ignore-daemonsets --delete-emptydir-data` as admin, one
// after the other on the same control plane, and reports both times.
// Repeats alternate which goes first.
func DrainComparison(ctx context.Context, o DrainOptions, say func(string, ...any)) ([]DrainRun, error) {
	if o.Apps <= 0 {
		o.Apps = 20
	}
	if o.Replicas <= 0 {
		o.Replicas = 10
	}
	if o.MinAvailable <= 0 {
		o.MinAvailable = o.Replicas - 1
	}
	if o.Repeats <= 0 {
		o.Repeats = 1
	}
	if _, err := exec.LookPath(o.Kubectl); err != nil {
		return nil, fmt.Errorf("bench: kubectl binary %q: %w (hack/bench.sh builds k8s.io/kubernetes/cmd/kubectl at the agent's client version)", o.Kubectl, err)
	}
	env, err := StartEnv(ctx, nil, true)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	kc, err := env.WriteKubeconfigFor("admin")
	if err != nil {
		return nil, err
	}
	log, closer, err := FileLogger(filepath.Join(o.Dir, "agent.log"), slog.LevelInfo)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	obs, err := env.Observe(ctx, nil)
	if err != nil {
		return nil, err
	}
	var runs []DrainRun
	for r := 0; r < o.Repeats; r++ {
		agentNode, kubectlNode := fmt.Sprintf("drain-agent-%d", r), fmt.Sprintf("drain-kubectl-%d", r)
		for _, n := range []string{agentNode, kubectlNode} {
			for _, name := range []string{n, n + "-spare"} {
				if err := testenv.CreateNode(ctx, env.AdminConfig(), name, nil); err != nil {
					return runs, err
				}
				if _, err := testenv.RunKubeletStandIn(ctx, env.AdminConfig(), name); err != nil {
					return runs, err
				}
			}
			say("drain: %d pods behind %d PDBs (minAvailable %d of %d) on %s", o.Apps*o.Replicas, o.Apps, o.MinAvailable, o.Replicas, n)
			err := parallel(ctx, o.Apps, 4, func(i int) error {
				w := &testenv.Workload{Namespace: fmt.Sprintf("%s-app%02d", n, i), Name: "app", Node: n, Spare: n + "-spare", Replicas: o.Replicas, MinAvailable: o.MinAvailable}
				return w.Start(ctx, env.AdminConfig())
			})
			if err != nil {
				return runs, err
			}
			if err := testenv.WaitPodsRunning(ctx, env.AdminConfig(), n, o.Apps*o.Replicas); err != nil {
				return runs, fmt.Errorf("bench: pods on %s not running: %w", n, err)
			}
			if err := env.waitPDBs(ctx, n, o.Apps); err != nil {
				return runs, err
			}
		}
		a, err := StartAgent(ctx, AgentOptions{Node: agentNode, Dir: filepath.Join(o.Dir, agentNode), Rest: env.AgentRestConfig(agentNode), Log: log.With("agent", agentNode)})
		if err != nil {
			return runs, err
		}
		select {
		case <-a.Idle():
		case <-time.After(60 * time.Second):
			return runs, fmt.Errorf("bench: agent not idle after 60s")
		}
		if err := env.WaitTransitions(ctx, agentNode, "drain", 30*time.Second); err != nil {
			return runs, err
		}
		run := DrainRun{AgentFirst: r%2 == 0}
		agentDrain := func() error {
			name := "drain-" + agentNode
			t0 := time.Now()
			if err := env.CreateEvent(ctx, name, agentNode, "drain", map[string]string{"deleteEmptyDirData": "true"}); err != nil {
				return err
			}
			var final string
			if err := obs.WaitFunc(ctx, 30*time.Minute, func() bool {
				obs.mu.Lock()
				defer obs.mu.Unlock()
				final = obs.final[name]
				return strings.HasPrefix(final, "Succeeded") || strings.HasPrefix(final, "Failed") || strings.HasPrefix(final, "SlaExpired")
			}); err != nil {
				return err
			}
			run.AgentSec = time.Since(t0).Seconds()
			if !strings.HasPrefix(final, "Succeeded") {
				return fmt.Errorf("bench: agent drain ended %q", final)
			}
			say("drain: agent drained %s in %.1fs", agentNode, run.AgentSec)
			return nil
		}
		kubectlDrain := func() error {
			t0 := time.Now()
			cmd := exec.CommandContext(ctx, o.Kubectl, "--kubeconfig", kc, "drain", kubectlNode, "--ignore-daemonsets", "--delete-emptydir-data")
			out, err := cmd.CombinedOutput()
			run.KubectlSec = time.Since(t0).Seconds()
			if err != nil {
				return fmt.Errorf("bench: kubectl drain: %v: %s", err, tail(string(out), 20))
			}
			say("drain: kubectl drained %s in %.1fs", kubectlNode, run.KubectlSec)
			return nil
		}
		first, second := agentDrain, kubectlDrain
		if !run.AgentFirst {
			first, second = kubectlDrain, agentDrain
		}
		if err := first(); err != nil {
			return runs, err
		}
		if err := second(); err != nil {
			return runs, err
		}
		_ = a.Stop()
		for _, n := range []string{agentNode, kubectlNode} {
			if left, err := env.Core.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n}); err == nil && len(left.Items) > 0 {
				return runs, fmt.Errorf("bench: %d pods left on %s after its drain", len(left.Items), n)
			}
		}
		run.Ratio = run.AgentSec / run.KubectlSec
		runs = append(runs, run)
	}
	return runs, nil
}

// waitPDBs waits until the disruption controller allows one disruption on
// each of the node's PDBs.
func (e *Env) waitPDBs(ctx context.Context, node string, apps int) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		ready := 0
		l, err := e.Core.PolicyV1().PodDisruptionBudgets("").List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, p := range l.Items {
				if strings.HasPrefix(p.Namespace, node+"-app") && p.Status.ObservedGeneration == p.Generation && p.Status.DisruptionsAllowed >= 1 {
					ready++
				}
			}
		}
		if ready >= apps {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: only %d of %d PDBs on %s allow a disruption: %w", ready, apps, node, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
