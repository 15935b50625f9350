package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// TestDrainRetriesWhenBudgetAllows: a drain as the node's own identity of
// four pods behind a PDB that allows one disruption at a time, with the
// back-off after a refusal set to an hour: the pods the budget holds back
// are evicted when the disruption controller reports the budget free again
// (the PDB watch), not after the back-off, so the drain ends with every
// pod evicted well inside the test's two minutes, and with about one
// eviction request per pod. Without the watch the first refusal would wait
// an hour.
func TestDrainRetriesWhenBudgetAllows(t *testing.T) {
	node, spare := "budget-node", "budget-spare"
	newNode(t, node)
	newNode(t, spare)
	w := startWorkload(t, "budget-ns", node, spare, 4, 3)
	c, err := apiclient.New(env.NodeConfig(node), node, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	var blocked []string
	res, err := c.Drain(ctx, apiclient.DrainOptions{GracePeriodSeconds: -1, RetryDelay: time.Hour, MinRetry: time.Hour,
		OnBlocked: func(m string) { mu.Lock(); blocked = append(blocked, m); mu.Unlock() }})
	if err != nil {
		t.Fatalf("drain: %v (blocked: %v)", err, blocked)
	}
	if len(res.Evicted) != 4 || len(podsOn(t, node)) != 0 {
		t.Fatalf("evicted %v, pods left %v; want all 4 evicted and gone", res.Evicted, podsOn(t, node))
	}
	waitFor(t, "the 4 replacements", 30*time.Second, func() bool { return w.Replaced() == 4 })
	mu.Lock()
	defer mu.Unlock()
	if len(blocked) == 0 || !strings.Contains(blocked[0], "disruption budget web") {
		t.Fatalf("no eviction was refused by the budget (%v): the test proves nothing", blocked)
	}
	// Pods a budget holds back are not sent: about one request per pod,
	// not one per pod per retry (one refusal of slack for a status update
	// that races the eviction).
	if n := c.EvictionRequests(); n > 5 {
		t.Errorf("%d eviction requests for 4 pods, want at most 5 (held back: %v)", n, blocked)
	}
}
