package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// ShutdownStats are ShutdownReaction's measurements, each from the
// PrepareForShutdown(true) signal.
type ShutdownStats struct {
	// Released: the agent released its delay lock, which it does only
	// after PrepareShutdown returned: the journal committed (fdatasync),
	// the conditions posted and the cordon made (or, offline, tried).
	Released Dist `json:"released"`
	// Visible: an admin watch sees the Node cordoned with
	// GracefulNodeShutdownInProgress=True.
	Visible Dist `json:"visible"`
	// Both is the later of the two, per shutdown.
	Both Dist `json:"both"`
}

// ShutdownReaction runs one agent with its shutdown guard on a private
// D-Bus with the test logind (internal/host/logindtest), and repeats:
// PrepareForShutdown(true) → wait for the lock's release and for the Node
// to show the shutdown → PrepareForShutdown(false) → wait until the agent
// holds a new delay lock and the Node is back.
//
// gap is the pause after each cycle: a cycle costs the agent about ten
// requests, and back-to-back cycles drain its client-side rate limit (20
// QPS, burst 40), which a real shutdown never meets.
func ShutdownReaction(ctx context.Context, dir string, n int, gap time.Duration, say func(string, ...any)) (ShutdownStats, error) {
	var st ShutdownStats
	env, err := StartEnv(ctx, nil, false)
	if err != nil {
		return st, err
	}
	defer env.Stop()
	const node = "bench-shutdown"
	if err := testenv.CreateNode(ctx, env.AdminConfig(), node, nil); err != nil {
		return st, err
	}
	ldir, err := os.MkdirTemp("", "lcb-logind-") // short: the bus socket path is limited
	if err != nil {
		return st, err
	}
	srv, err := logindtest.New(ldir, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	if err != nil {
		return st, err
	}
	defer srv.Close()
	log, closer, err := FileLogger(filepath.Join(dir, "agent.log"), slog.LevelInfo)
	if err != nil {
		return st, err
	}
	defer closer.Close()
	a, err := StartAgent(ctx, AgentOptions{Node: node, Dir: filepath.Join(dir, node), Rest: env.AgentRestConfig(node), Log: log, LogindAddress: srv.Address()})
	if err != nil {
		return st, err
	}
	defer a.Stop()
	select {
	case <-a.Idle():
	case <-time.After(60 * time.Second):
		return st, fmt.Errorf("bench: agent not idle after 60s")
	}

	var mu sync.Mutex
	var shown, back time.Time // first time the node showed the shutdown / its end, since the mark
	mark := time.Time{}
	obs, err := env.Observe(ctx, func(nd *corev1.Node, at time.Time) {
		if nd.Name != node {
			return
		}
		down := nd.Spec.Unschedulable && conditionTrue(nd, v1alpha1.NodeConditionGracefulNodeShutdownInProgress)
		up := !nd.Spec.Unschedulable && !conditionTrue(nd, v1alpha1.NodeConditionGracefulNodeShutdownInProgress)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case mark.IsZero():
		case down && shown.IsZero():
			shown = at
		case up && !shown.IsZero() && back.IsZero():
			back = at
		}
	})
	if err != nil {
		return st, err
	}
	heldLock := func() (logindtest.Inhibitor, bool) {
		for _, in := range srv.Inhibitors() {
			if in.Mode == "delay" && in.What == "shutdown" && !in.Released {
				return in, true
			}
		}
		return logindtest.Inhibitor{}, false
	}
	var rel, vis, both []time.Duration
	for i := 0; i < n; i++ {
		var lock logindtest.Inhibitor
		if err := obs.WaitFunc(ctx, 30*time.Second, func() bool { var ok bool; lock, ok = heldLock(); return ok }); err != nil {
			return st, fmt.Errorf("bench: the agent holds no delay lock: %w", err)
		}
		mu.Lock()
		shown, back = time.Time{}, time.Time{}
		t0 := time.Now()
		mark = t0
		mu.Unlock()
		if err := srv.EmitPrepareForShutdown(true); err != nil {
			return st, err
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := srv.WaitReleased(wctx, lock.ID)
		cancel()
		if err != nil {
			return st, err
		}
		tr := time.Now()
		if err := obs.WaitFunc(ctx, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return !shown.IsZero() }); err != nil {
			return st, fmt.Errorf("bench: the node did not show the shutdown: %w", err)
		}
		mu.Lock()
		tv := shown
		mu.Unlock()
		rel = append(rel, tr.Sub(t0))
		vis = append(vis, tv.Sub(t0))
		both = append(both, max(tr.Sub(t0), tv.Sub(t0)))
		// Cancel the shutdown: the agent takes the lock again and reverts.
		if err := srv.EmitPrepareForShutdown(false); err != nil {
			return st, err
		}
		if err := obs.WaitFunc(ctx, 30*time.Second, func() bool {
			_, held := heldLock()
			mu.Lock()
			defer mu.Unlock()
			return held && !back.IsZero()
		}); err != nil {
			return st, fmt.Errorf("bench: the cancelled shutdown was not reverted: %w", err)
		}
		if (i+1)%50 == 0 {
			say("shutdown: %d/%d", i+1, n)
		}
		if err := waitCtx(ctx, gap); err != nil {
			return st, err
		}
	}
	st.Released, st.Visible, st.Both = Summarize(rel), Summarize(vis), Summarize(both)
	return st, nil
}

func conditionTrue(n *corev1.Node, typ string) bool {
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
