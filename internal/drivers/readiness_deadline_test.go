package drivers

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
)

// killingAPI is a scriptedAPI that, at its killAt-th poll, cancels the
// step's context as a SIGKILL of the agent would end the wait.
type killingAPI struct {
	*scriptedAPI
	killAt int
	kill   context.CancelFunc
}

func (a *killingAPI) NodePods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := a.scriptedAPI.NodePods(ctx)
	a.mu.Lock()
	n := a.polls
	a.mu.Unlock()
	if a.kill != nil && n == a.killAt {
		a.kill()
	}
	return pods, err
}

// deadlineRig is one event's readiness wait run more than once, as the
// agent runs it again after a restart: one Runtime (its StepStarted, like
// the engine's journal, keeps the first start) and one clock.
type deadlineRig struct {
	rt    *fakeRuntime
	clk   pollClock
	api   *killingAPI
	r     Readiness
	start time.Time
}

func newDeadlineRig(timeout time.Duration, script ...pollState) *deadlineRig {
	rt := newFake()
	snap := readiness.Snapshot{Allocatable: map[string]int64{"nvidia.com/gpu": 8}, DaemonSets: []string{"kube-system/cni"}}
	rt.params = map[string]string{ResolvedReadiness: snap.Encode()}
	// From the real time on, so that each poll's context deadline (the
	// wait's deadline on this clock) is in the future.
	clk := pollClock{clocktesting.NewFakeClock(time.Now().Truncate(time.Second))}
	api := &killingAPI{scriptedAPI: &scriptedAPI{script: script}}
	// The engine journals the step's first intent before its first Run.
	rt.started = clk.Now()
	return &deadlineRig{rt: rt, clk: clk, api: api, start: clk.Now(),
		r: Readiness{Config: readiness.Config{Timeout: timeout}, API: api, PollInterval: time.Second, Clock: clk}}
}

// run runs the step once; killAt > 0 ends it (a kill) at that poll,
// counted over the rig's whole life.
func (g *deadlineRig) run(t *testing.T, killAt int) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g.api.killAt, g.api.kill = killAt, cancel
	return g.r.step().Run(ctx, g.rt)
}

// TestReadinessDeadlineAcrossRestart: an agent killed during the wait and
// restarted keeps the deadline of the wait's first start (journaled), so
// repeated kills cannot stretch it: with readiness.timeout 20s, killed at
// 12s and again at 17s, the wait fails at 20s from its first start — not
// 20s after the last restart (37s) — and says on resume what is left.
func TestReadinessDeadlineAcrossRestart(t *testing.T) {
	g := newDeadlineRig(20*time.Second, pollState{gpus: 0, dsReady: true})
	if err := g.run(t, 13); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("first run: %v; want it killed mid-wait", err)
	}
	if el := g.clk.Now().Sub(g.start); el != 12*time.Second {
		t.Fatalf("first run killed at %s, want 12s", el)
	}
	g.clk.Step(5 * time.Second) // the agent down, restarting
	if err := g.run(t, 14); err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Fatalf("second run: %v; want it killed mid-wait", err)
	}
	if !g.rt.progressed("up to 20s; resumed after a restart: 3s left, the wait began 17s ago)") {
		t.Errorf("the resumed wait does not say what is left:\n%s", g.rt.allProgress())
	}
	err := g.run(t, 0)
	const want = "the node's workloads were not ready within 20s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8"
	if err == nil || err.Error() != want {
		t.Fatalf("third run: %v\nwant %s", err, want)
	}
	if el := g.clk.Now().Sub(g.start); el > 20*time.Second {
		t.Errorf("the wait failed %s after its first start; want within readiness.timeout (20s) across the restarts", el)
	}
}

// A wait resumed after its deadline passed (the agent, or the host, down
// for longer than readiness.timeout) looks once more: a node ready by now
// is given back, one that is not fails at once, naming what is missing.
func TestReadinessDeadlinePassedWhileDown(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after pollState
		want  string
	}{
		{name: "ready by now", after: pollState{gpus: 8, dsReady: true}},
		{name: "still missing", after: pollState{gpus: 0, dsReady: true},
			want: "the node's workloads were not ready within 20s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newDeadlineRig(20*time.Second, pollState{gpus: 0, dsReady: true}, pollState{gpus: 0, dsReady: true}, tc.after)
			if err := g.run(t, 2); err == nil {
				t.Fatal("first run not killed")
			}
			g.clk.Step(time.Hour)
			before := g.clk.Now()
			err := g.run(t, 0)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("after the restart: %q\nwant %q", got, tc.want)
			}
			if g.clk.Now() != before {
				t.Errorf("the last look waited %s; want one poll at once", g.clk.Now().Sub(before))
			}
			if !g.rt.progressed("past readiness.timeout, one last look") {
				t.Errorf("the resumed wait does not say it is past its timeout:\n%s", g.rt.allProgress())
			}
		})
	}
}

// waitDeadline on a clock stepped back (the journaled start in the
// future) gives at most a full timeout from now.
func TestReadinessDeadlineClockStepped(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if d, msg := waitDeadline(now, now.Add(time.Hour), 20*time.Second); !d.Equal(now.Add(20*time.Second)) || msg != "" {
		t.Errorf("start in the future: %s %q; want a full timeout from now", d, msg)
	}
	if d, msg := waitDeadline(now, time.Time{}, 20*time.Second); !d.Equal(now.Add(20*time.Second)) || msg != "" {
		t.Errorf("start unknown: %s %q; want a full timeout from now", d, msg)
	}
}
