package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// nodeGets counts the GETs of one Node sent through a client.
type nodeGets struct {
	next http.RoundTripper
	path string
	n    *atomic.Int64
}

func (c nodeGets) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodGet && req.URL.Path == c.path && req.URL.Query().Get("watch") == "" {
		c.n.Add(1)
	}
	return c.next.RoundTrip(req)
}

// TestReadinessWaitWatches: the readiness wait watches the Node and its
// pods and reads them when they change, instead of every 2 s: while
// nothing changes for 12 s it reads the Node at most twice (a 2 s poll
// read it six times), and the GPUs' return, which changes the Node, ends
// the wait: Succeeded and uncordoned.
func TestReadinessWaitWatches(t *testing.T) {
	const node, name = "ready-watch", "ready-watch-1"
	r := newReadinessNode(t, node)
	var gets atomic.Int64
	cfg := rest.CopyConfig(env.NodeConfig(node))
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return nodeGets{next: rt, path: "/api/v1/nodes/" + node, n: &gets}
	}
	startAgent(t, node, agentOpts{retention: time.Hour, rest: cfg})
	r.startReboot(name)
	r.setGPUs(0)
	r.setReady(true)
	lc := clients(t, env.AdminConfig())
	waitFor(t, "the wait naming the GPUs", time.Minute, func() bool {
		ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
		return err == nil && strings.Contains(ev.Status.Message, "allocatable nvidia.com/gpu is 0 of 8")
	})
	time.Sleep(time.Second) // the look the watch's first list asks for
	before := gets.Load()
	time.Sleep(12 * time.Second)
	if got := gets.Load() - before; got > 2 {
		t.Errorf("the agent read its Node %d times in 12 s of a wait in which nothing changed; want at most 2 (woken by the watch, not polling every 2 s)", got)
	} else {
		t.Logf("the agent read its Node %d times in 12 s of the wait", got)
	}
	r.setGPUs(8)
	ev := waitEvent(t, name, time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("reboot ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if getNode(t, node).Spec.Unschedulable {
		t.Error("the node is still cordoned after the event succeeded")
	}
}

// TestNodeChanges: apiclient.Client.NodeChanges, with the node's own
// identity (what the Node authorizer lets it watch), signals a change to
// its Node (the device plugin's allocatable) and to a pod bound to it (a
// DaemonSet pod's readiness) — the changes the readiness wait looks for.
func TestNodeChanges(t *testing.T) {
	const node = "node-changes"
	r := newReadinessNode(t, node)
	c, err := apiclient.New(env.NodeConfig(node), node, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := c.NodeChanges(ctx)
	// The informers' first lists signal; then quiet.
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("no signal from the first lists within 30 s")
	}
	quiet := time.After(2 * time.Second)
	for done := false; !done; {
		select {
		case <-ch:
		case <-quiet:
			done = true
		}
	}
	for _, change := range []struct {
		what string
		do   func()
	}{
		{"the Node's allocatable nvidia.com/gpu changed", func() { r.setGPUs(4) }},
		{"the DaemonSet pod's Ready changed", func() { r.setPodReady(false) }},
	} {
		change.do()
		select {
		case <-ch:
			t.Logf("signalled: %s", change.what)
		case <-time.After(30 * time.Second):
			t.Fatalf("no signal within 30 s after %s", change.what)
		}
	}
}
