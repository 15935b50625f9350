package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// TestClaimTransitionFromWatch: the claim reads this node's transition
// from the agent's informer, not from the server (one request less on
// the claim's path): three claims, no GET of the transition. The cache
// never outlives the object: once an admin deletes the transition, the
// next event waits "not found" instead of running on the cached copy.
func TestClaimTransitionFromWatch(t *testing.T) {
	const node = "claim-cached-transition"
	newNode(t, node)
	tn := transitionName(node, "uncordon")
	var gets atomic.Int64
	cfg := rest.CopyConfig(env.NodeConfig(node))
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return nodeGets{next: rt, path: "/apis/lifecycle.x-k8s.io/v1alpha1/lifecycletransitions/" + tn, n: &gets}
	}
	startAgent(t, node, agentOpts{retention: time.Hour, rest: cfg})
	waitTransition(t, tn)
	run := func(name string) {
		t.Helper()
		createEvent(t, name, node, tn, nil, nil)
		if ev := waitEvent(t, name, time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("%s ended %s: %s", name, ev.Status.ClaimStatus, ev.Status.Message)
		}
	}
	run("cached-transition-0") // the informer has synced by its end
	before := gets.Load()
	for i := 1; i <= 3; i++ {
		run(fmt.Sprintf("cached-transition-%d", i))
	}
	if got := gets.Load() - before; got != 0 {
		t.Errorf("the agent read transition %s from the server %d times for 3 claims; want 0 (its informer holds it)", tn, got)
	}

	lc := clients(t, env.AdminConfig())
	if err := lc.Transitions.Delete(context.Background(), tn, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the transition gone", 30*time.Second, func() bool {
		_, err := lc.Transitions.Get(context.Background(), tn, metav1.GetOptions{})
		return err != nil
	})
	createEvent(t, "cached-transition-gone", node, tn, nil, nil)
	waitPending(t, "cached-transition-gone", "not found")
}
