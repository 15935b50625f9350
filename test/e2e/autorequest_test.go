package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/needs"
)

// autoRequests lists the reboot events the agents requested on their own
// for node.
func autoRequests(t *testing.T, node string) []v1alpha1.LifecycleEvent {
	t.Helper()
	l, err := clients(t, env.AdminConfig()).Events.List(context.Background(),
		metav1.ListOptions{LabelSelector: needs.LabelRequestedBy + "=" + needs.RequestedByNeeds})
	if err != nil {
		t.Fatal(err)
	}
	var out []v1alpha1.LifecycleEvent
	for _, ev := range l.Items {
		if ev.Spec.BindingNode == node {
			out = append(out, ev)
		}
	}
	return out
}

func requestConfig(group string, failures int) func(*config.Config) {
	return func(c *config.Config) {
		c.Needs.Reboot.Policy = config.PolicyRequest
		c.Needs.Reboot.Request = config.AutoRequest{Group: group, MaxConcurrent: 1, BreakerFailures: failures}
		c.Needs.Reboot.Interval = 100 * time.Millisecond
		c.Reboot.ReadyTimeout = 4 * time.Second
	}
}

func needReboot(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "reboot-required"), []byte("*** System restart required ***\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func breaker(t *testing.T, group string) []string {
	t.Helper()
	c, err := apiclient.New(env.AdminConfig(), "admin", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.BreakerFailures(context.Background(), group)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// needs.reboot.policy request (issue 15.2) on the real API server with the
// node's own identity: the need makes one reboot event bound to the node,
// in the configured disruption group; it runs and ends; a restart of the
// agent with the need still there makes no second one. A failed request is
// recorded on the group's breaker Lease; at breakerFailures failures a
// node of the group requests nothing, and says so.
func TestAutomaticRebootRequest(t *testing.T) {
	t.Run("once per need", func(t *testing.T) {
		node, dir := "autoreq-node", t.TempDir()
		newNode(t, node)
		needReboot(t, dir)
		conf := requestConfig("autoreq-once", 3)
		a := startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, configure: conf})
		var name string
		waitFor(t, "an automatic reboot request", 30*time.Second, func() bool {
			evs := autoRequests(t, node)
			if len(evs) == 1 {
				name = evs[0].Name
			}
			return len(evs) == 1
		})
		ev := waitEvent(t, name, 2*time.Minute)
		if d := ev.Spec.Disruption; ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || d == nil || d.Group != "autoreq-once" || d.MaxConcurrent != 1 ||
			ev.Spec.TransitionName != transitionName(node, "reboot") || !strings.Contains(ev.Annotations[needs.AnnotationReason], "reboot-required exists") {
			t.Fatalf("automatic request %s: %s %q, spec %+v, annotations %v", name, ev.Status.ClaimStatus, ev.Status.Message, ev.Spec, ev.Annotations)
		}
		a.stop(t)
		// The sentinel outlived the (simulated) reboot: the restarted
		// agent sees the need again and requests nothing new.
		b := startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, configure: conf})
		waitFor(t, "the restarted agent declines to request again", 30*time.Second, func() bool {
			return strings.Contains(b.logBuf.String(), "not requesting again")
		})
		if evs := autoRequests(t, node); len(evs) != 1 {
			t.Fatalf("%d automatic requests after a restart with the need still there, want 1", len(evs))
		}
	})

	t.Run("failure opens the breaker", func(t *testing.T) {
		node, dir := "autoreq-fail", t.TempDir()
		newNode(t, node)
		setReady(t, node, corev1.ConditionFalse) // the reboot's wait-ready fails
		needReboot(t, dir)
		startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, configure: requestConfig("autoreq-fail", 1)})
		var name string
		waitFor(t, "an automatic reboot request", 30*time.Second, func() bool {
			if evs := autoRequests(t, node); len(evs) == 1 {
				name = evs[0].Name
			}
			return name != ""
		})
		if ev := waitEvent(t, name, 2*time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed {
			t.Fatalf("%s ended %s %q, want Failed (the node never got Ready)", name, ev.Status.ClaimStatus, ev.Status.Message)
		}
		waitFor(t, "the failure on the breaker", 60*time.Second, func() bool {
			return slices.Equal(breaker(t, "autoreq-fail"), []string{name})
		})

		// Another node of the group, with the breaker at its limit.
		other, odir := "autoreq-other", t.TempDir()
		newNode(t, other)
		needReboot(t, odir)
		o := startAgent(t, other, agentOpts{retention: time.Hour, dir: odir, configure: requestConfig("autoreq-fail", 1)})
		waitFor(t, "the breaker refusing", 30*time.Second, func() bool {
			return strings.Contains(o.logBuf.String(), "circuit breaker open")
		})
		if evs := autoRequests(t, other); len(evs) != 0 {
			t.Fatalf("%d automatic requests with the breaker open, want 0", len(evs))
		}
	})

	// eventRetention 0: the agent deletes the failed event as soon as it
	// ends; the failure still reaches the breaker (from the journal's
	// history).
	t.Run("failure deleted at once still counts", func(t *testing.T) {
		node, dir := "autoreq-fail0", t.TempDir()
		newNode(t, node)
		setReady(t, node, corev1.ConditionFalse)
		needReboot(t, dir)
		startAgent(t, node, agentOpts{retention: 0, dir: dir, configure: requestConfig("autoreq-fail0", 1)})
		var name string
		waitFor(t, "an automatic reboot request", 30*time.Second, func() bool {
			if evs := autoRequests(t, node); len(evs) == 1 {
				name = evs[0].Name
			}
			return name != ""
		})
		waitFor(t, "the failure of the deleted event on the breaker", 2*time.Minute, func() bool {
			return slices.Equal(breaker(t, "autoreq-fail0"), []string{name})
		})
		if evs := autoRequests(t, node); len(evs) != 0 {
			t.Fatalf("%d automatic requests left with eventRetention 0, want 0 (deleted at the end)", len(evs))
		}
	})
}
