package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// ClaimOptions configure ClaimLatency.
type ClaimOptions struct {
	Events int // measured events (default 200)
	Warmup int // events run first and not counted (default 5)
	// Gap is the pause after each event. With none, events come back to
	// back and the agent's own client-side rate limit (20 QPS, burst 40,
	// the daemon's default) runs dry after a few dozen events: each event
	// costs about 25 requests. A second refills the bucket.
	Gap time.Duration
	// Dir holds the agent's journal and log.
	Dir string
	// Env is a running control plane; nil starts one.
	Env *Env
	// Each, if set, is called after every measured event (the CI benchmark
	// uses it to drive b.N).
	Each func(claim, cond time.Duration)
}

// ClaimStats are ClaimLatency's measurements.
type ClaimStats struct {
	Claimed   Dist `json:"claimed"`   // event created → seen Claimed
	Condition Dist `json:"condition"` // event created → Node condition names it
	Total     Dist `json:"total"`     // event created → Succeeded and deleted
}

// ClaimRig is one agent (in-process, agent.Run) for one node, and an
// admin watch on events and nodes, ready to time claims.
type ClaimRig struct {
	Env    *Env
	agent  *Agent
	obs    *Observer
	node   string
	ownEnv bool
	n      int
	closer interface{ Close() error }
}

// NewClaimRig starts the agent (and the control plane when env is nil).
func NewClaimRig(ctx context.Context, env *Env, dir string) (*ClaimRig, error) {
	r := &ClaimRig{Env: env, node: "bench-claim"}
	if env == nil {
		var err error
		if r.Env, err = StartEnv(ctx, nil, false); err != nil {
			return nil, err
		}
		r.ownEnv = true
	}
	ok := false
	defer func() {
		if !ok {
			r.Close()
		}
	}()
	if err := testenv.CreateNode(ctx, r.Env.AdminConfig(), r.node, nil); err != nil {
		return nil, err
	}
	log, closer, err := FileLogger(filepath.Join(dir, "agent.log"), slog.LevelInfo)
	if err != nil {
		return nil, err
	}
	r.closer = closer
	r.agent, err = StartAgent(ctx, AgentOptions{Node: r.node, Dir: filepath.Join(dir, r.node), Rest: r.Env.AgentRestConfig(r.node), Log: log})
	if err != nil {
		return nil, err
	}
	select {
	case <-r.agent.Idle():
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("bench: agent %s not idle after 60s", r.node)
	}
	if err := r.Env.WaitTransitions(ctx, r.node, "uncordon", 30*time.Second); err != nil {
		return nil, err
	}
	if r.obs, err = r.Env.Observe(ctx, nil); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// Once creates one uncordon event and returns the time from just before
// the Create call to the admin watch delivering Claimed, to the Node
// condition naming the event, and to its deletion after Succeeded.
func (r *ClaimRig) Once(ctx context.Context) (claim, cond, total time.Duration, err error) {
	name := fmt.Sprintf("claim-%05d", r.n)
	r.n++
	t0 := time.Now()
	if err := r.Env.CreateEvent(ctx, name, r.node, "uncordon", nil); err != nil {
		return 0, 0, 0, err
	}
	tc, err := r.obs.Claimed(ctx, name, 30*time.Second)
	if err != nil {
		return 0, 0, 0, err
	}
	tn, err := r.obs.Condition(ctx, name, 30*time.Second)
	if err != nil {
		return 0, 0, 0, err
	}
	final, err := r.obs.Gone(ctx, name, 60*time.Second)
	if err != nil {
		return 0, 0, 0, err
	}
	if !strings.HasPrefix(final, "Succeeded") {
		return 0, 0, 0, fmt.Errorf("bench: event %s ended %q", name, final)
	}
	return tc.Sub(t0), tn.Sub(t0), time.Since(t0), nil
}

// Close stops the agent (and the control plane it started).
func (r *ClaimRig) Close() {
	if r.agent != nil {
		_ = r.agent.Stop()
	}
	if r.closer != nil {
		_ = r.closer.Close()
	}
	if r.ownEnv && r.Env != nil {
		r.Env.Stop()
	}
}

// ClaimLatency runs one agent (in-process, agent.Run) for one node and
// creates uncordon events for it one after the other — uncordon on a node
// that is not cordoned: one step that changes nothing, so what is timed is
// the agent's own path. Each latency starts just before the admin's Create
// call and ends when the admin's watch delivers the Claimed status, or the
// Node condition LifecycleTransition naming the event. The next event is
// created once the previous one is finished and deleted (eventRetention 0).
func ClaimLatency(ctx context.Context, o ClaimOptions) (ClaimStats, error) {
	var st ClaimStats
	if o.Events <= 0 {
		o.Events = 200
	}
	r, err := NewClaimRig(ctx, o.Env, o.Dir)
	if err != nil {
		return st, err
	}
	defer r.Close()
	var claimed, cond, total []time.Duration
	for i := 0; i < max(o.Warmup, 0)+o.Events; i++ {
		c, n, t, err := r.Once(ctx)
		if err != nil {
			return st, err
		}
		if i < o.Warmup {
			continue
		}
		claimed, cond, total = append(claimed, c), append(cond, n), append(total, t)
		if o.Each != nil {
			o.Each(c, n)
		}
		if err := waitCtx(ctx, o.Gap); err != nil {
			return st, err
		}
	}
	st.Claimed, st.Condition, st.Total = Summarize(claimed), Summarize(cond), Summarize(total)
	return st, nil
}
