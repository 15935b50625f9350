package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

// TestReadinessAPIOutage: the API server stops answering the agent (its
// connections cut, new ones refused) while the event waits for the node's
// workloads. That is not a failure by itself: the wait reads again at
// every poll until readiness.timeout.
func TestReadinessAPIOutage(t *testing.T) {
	// The outage ends before readiness.timeout (default 10m) and the GPUs
	// came back during it: the event ends Succeeded, uncordoned.
	t.Run("healed", func(t *testing.T) {
		node := "ready-outage"
		r := newReadinessNode(t, node)
		proxy, err := env.NewCutProxy()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Close)
		a := startAgent(t, node, agentOpts{retention: time.Hour, rest: proxy.Config(env.NodeConfig(node))})
		r.startReboot("ready-outage-1")
		r.setGPUs(0)
		r.setReady(true)
		lc := clients(t, env.AdminConfig())
		waitFor(t, "the wait naming the GPUs", time.Minute, func() bool {
			ev, err := lc.Events.Get(context.Background(), "ready-outage-1", metav1.GetOptions{})
			return err == nil && strings.Contains(ev.Status.Message, "allocatable nvidia.com/gpu is 0 of 8")
		})
		proxy.Cut()
		waitFor(t, "the wait's poll failing on the outage", time.Minute, func() bool {
			return strings.Contains(a.logBuf.String(), "the API server does not answer, retrying until readiness.timeout")
		})
		r.setGPUs(8) // the admin's own connection, not through the proxy
		proxy.Heal()
		ev := waitEvent(t, "ready-outage-1", time.Minute)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("reboot ended %s: %q; want Succeeded after the outage", ev.Status.ClaimStatus, ev.Status.Message)
		}
		if got := stepStates(ev); !strings.Contains(got, "wait-workloads-ready=Done,uncordon=Done") {
			t.Errorf("steps %s", got)
		}
		if getNode(t, node).Spec.Unschedulable {
			t.Error("the node is still cordoned after the event succeeded")
		}
	})
	// The outage outlasts readiness.timeout: the event ends Failed, its
	// message naming what was not ready when last read and the API error
	// of the last poll, the node kept cordoned (readiness.onTimeout
	// keepCordoned) — not retried as an outage with a new timeout.
	t.Run("timeout", func(t *testing.T) {
		node := "ready-outage-timeout"
		r := newReadinessNode(t, node)
		proxy, err := env.NewCutProxy()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(proxy.Close)
		a := startAgent(t, node, agentOpts{retention: time.Hour, rest: proxy.Config(env.NodeConfig(node)), configure: func(c *config.Config) {
			// Long enough for the test to cut the proxy after the first
			// poll, which it sees at once.
			c.Readiness.Timeout = 15 * time.Second
			c.Readiness.OnTimeout = config.ReadinessKeepCordoned
		}})
		r.startReboot(node + "-1")
		r.setGPUs(0)
		r.setReady(true)
		lc := clients(t, env.AdminConfig())
		waitFor(t, "the wait naming the GPUs", time.Minute, func() bool {
			ev, err := lc.Events.Get(context.Background(), node+"-1", metav1.GetOptions{})
			return err == nil && strings.Contains(ev.Status.Message, "allocatable nvidia.com/gpu is 0 of 8")
		})
		proxy.Cut()
		waitFor(t, "the event finishing Failed while the API server is cut off", time.Minute, func() bool {
			return strings.Contains(a.logBuf.String(), "event "+node+"-1: finishing (Failed)")
		})
		proxy.Heal()
		ev := waitEvent(t, node+"-1", time.Minute)
		want := []string{
			"step wait-workloads-ready failed: the node's workloads were not ready within 15s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8, as last read before the API server stopped answering: readiness: reading the Node: apiclient: get node " + node + ": ",
			"the node stays cordoned (readiness.onTimeout: keepCordoned)",
		}
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed || !strings.Contains(ev.Status.Message, want[0]) || !strings.Contains(ev.Status.Message, want[1]) {
			t.Fatalf("event ended %s: %q\nwant Failed containing\n  %s", ev.Status.ClaimStatus, ev.Status.Message, strings.Join(want, "\n  "))
		}
		if strings.Contains(a.logBuf.String(), "step failed for a transient reason; retrying") {
			t.Error("the engine retried the timed-out wait as an outage")
		}
		if !getNode(t, node).Spec.Unschedulable {
			t.Error("the node was uncordoned (readiness.onTimeout keepCordoned)")
		}
	})
}
