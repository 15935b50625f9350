package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// agentBehindProxy starts an agent for a new node whose API connections
// go through a CutProxy, and waits for its transitions.
func agentBehindProxy(t *testing.T, node string) (*testAgent, *testenv.CutProxy, *apiclient.LifecycleClients) {
	t.Helper()
	newNode(t, node)
	proxy, err := env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	a := startAgent(t, node, agentOpts{retention: time.Hour, rest: proxy.Config(env.NodeConfig(node))})
	lc := clients(t, env.AdminConfig())
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := lc.Transitions.Get(context.Background(), transitionName(node, "uncordon"), metav1.GetOptions{})
		return err == nil
	})
	return a, proxy, lc
}

// How soon after the API server is reachable again an idle agent must have
// claimed every pending event bound to it (docs/reliability.md): after
// connections were reset or refused, and after they were left half-open
// (found dead only by the HTTP/2 health check and request timeouts).
const (
	healBound         = 5 * time.Second
	halfOpenHealBound = 15 * time.Second
)

// An idle agent behind a proxy that the test cuts at random moments around
// an event's creation (before it, just after, while the claim is in
// flight) for a random time, sometimes by resetting every connection and
// refusing new ones, sometimes by holding them open and forwarding nothing:
// after each heal the event is claimed within healBound and runs to its end.
// DEAF_SEED=n replays one sequence; DEAF_ROUNDS=n runs more rounds.
func TestClaimsAfterEveryOutage(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DEAF_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("DEAF_SEED=%q: %v", s, err)
		}
	}
	rounds := 10
	if s := os.Getenv("DEAF_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil {
			t.Fatalf("DEAF_ROUNDS=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (DEAF_SEED=%d replays it), %d rounds", seed, seed, rounds)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))

	node := "deaf-node"
	a, proxy, lc := agentBehindProxy(t, node)
	for i := range rounds {
		name := fmt.Sprintf("deaf-%d", i)
		// Cut up to 0.4 s before the creation or up to 0.2 s after it: the
		// claim takes some 20-50 ms, so many cuts land on a claim in flight.
		lead := time.Duration(rng.Int64N(int64(600*time.Millisecond))) - 400*time.Millisecond
		outage := 500*time.Millisecond + time.Duration(rng.Int64N(int64(6*time.Second)))
		blackhole := rng.IntN(3) == 0
		kind := "reset"
		if blackhole {
			kind = "blackhole"
		}
		cut := func() {
			if blackhole {
				proxy.Blackhole()
			} else {
				proxy.Cut()
			}
		}
		if lead < 0 {
			cut()
			time.Sleep(-lead)
			createEvent(t, name, node, transitionName(node, "uncordon"), nil, nil)
		} else {
			createEvent(t, name, node, transitionName(node, "uncordon"), nil, nil)
			time.Sleep(lead)
			cut()
		}
		time.Sleep(outage)
		proxy.Heal()
		healed := time.Now()
		t.Logf("round %d: %s outage of %s, cut %s relative to creation", i, kind, outage.Round(time.Millisecond), lead.Round(time.Millisecond))
		bound := healBound
		if blackhole {
			bound = halfOpenHealBound
		}
		var claimed bool
		for time.Since(healed) < bound {
			ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
			if err == nil && ev.Status.ClaimStatus != "" && ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
				claimed = true
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("round %d: claimed %s after the heal", i, time.Since(healed).Round(time.Millisecond))
		if !claimed {
			t.Fatalf("seed %d round %d (%s outage %s, cut %s relative to creation): event %s not claimed %s after the heal\nagent log:\n%s",
				seed, i, kind, outage, lead, name, bound, a.logBuf.String())
		}
		ev := waitEvent(t, name, time.Minute)
		if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("seed %d round %d: %s ended %s: %s", seed, i, name, ev.Status.ClaimStatus, ev.Status.Message)
		}
		if err := lc.Events.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// client-go's reflector backs off before it lists and watches again after
// a watch ended with an error (0.8 s, doubling with each within 2 minutes,
// up to 30 s and more with jitter), and tells no error handler: until its
// next try its cache misses everything, however healthy the server. Four
// half-open outages (each watch found dead by the HTTP/2 health check) grow
// that back-off; after 36 s without failures (the engine's window after a
// failed list has passed) a fifth ends the watch again, the reflector now
// waits 12 s or more, and an event created after the agent has listed
// again must still be claimed within healBound: the engine lists while no watch is open
// (apiclient EventWatch.Watching). Before, it trusted the cache and the
// event waited for the reflector's next try (CI: 15 s and more).
func TestClaimsWhileTheWatchBacksOff(t *testing.T) {
	node := "backoff-node"
	a, proxy, lc := agentBehindProxy(t, node)
	halfOpen := func() {
		proxy.Blackhole()
		time.Sleep(10 * time.Second) // the health check ends the watch after 6 + 3 s
		proxy.Heal()
	}
	for range 4 {
		halfOpen()
		time.Sleep(4 * time.Second)
	}
	time.Sleep(36 * time.Second)
	listed := func() int { return strings.Count(a.logBuf.String(), "listed this node's events after an outage") }
	before := listed()
	halfOpen()
	// Once the agent has listed after the heal it has heard from the server
	// and caught up; the reflector is still backing off.
	waitFor(t, "the agent's list after the heal", 15*time.Second, func() bool { return listed() > before })
	time.Sleep(1500 * time.Millisecond)
	createEvent(t, "backoff", node, transitionName(node, "uncordon"), nil, nil)
	created := time.Now()
	var claimed bool
	for time.Since(created) < healBound {
		ev, err := lc.Events.Get(context.Background(), "backoff", metav1.GetOptions{})
		if err == nil && ev.Status.ClaimStatus != "" && ev.Status.ClaimStatus != v1alpha1.LifecycleEventPending {
			claimed = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("claimed %s after the creation", time.Since(created).Round(time.Millisecond))
	if !claimed {
		t.Fatalf("event not claimed %s after its creation, the agent had listed after the heal\nagent log:\n%s", healBound, a.logBuf.String())
	}
	if ev := waitEvent(t, "backoff", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("ended %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
}
