package drivers

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
)

// watchedAPI is a scriptedAPI whose client also watches the Node and its
// pods (NodeWatcher): the test sends on changes.
type watchedAPI struct {
	*scriptedAPI
	changes chan struct{}
	watches atomic.Int32 // NodeChanges calls
	ended   atomic.Int32 // watches whose context ended
}

func (a *watchedAPI) NodeChanges(ctx context.Context) <-chan struct{} {
	a.watches.Add(1)
	go func() { <-ctx.Done(); a.ended.Add(1) }()
	return a.changes
}

func (a *watchedAPI) pollCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.polls
}

var readinessStart = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func watchedRun(t *testing.T, api *watchedAPI, clk pollClock) (*fakeRuntime, Readiness) {
	t.Helper()
	rt := newFake()
	snap := readiness.Snapshot{Allocatable: map[string]int64{"nvidia.com/gpu": 8}, DaemonSets: []string{"kube-system/cni"}}
	rt.params = map[string]string{ResolvedReadiness: snap.Encode()}
	return rt, Readiness{Config: readiness.Config{Timeout: time.Hour}, API: api, PollInterval: time.Second, Clock: clk}
}

// With a client that watches the Node and its pods, the wait does not
// poll every interval: with no change it looks once per ReadinessRecheck
// (30 s here, not 1 s), and it stops its watch when it ends.
func TestReadinessWatchRechecks(t *testing.T) {
	notReady := pollState{gpus: 0, dsReady: true}
	api := &watchedAPI{scriptedAPI: &scriptedAPI{script: []pollState{notReady, notReady, notReady, {gpus: 8, dsReady: true}}}, changes: make(chan struct{})}
	clk := pollClock{clocktesting.NewFakeClock(readinessStart)}
	rt, r := watchedRun(t, api, clk)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.step().Run(ctx, rt); err != nil {
		t.Fatalf("the wait ended %v; want ready at the fourth look", err)
	}
	if got, want := clk.Now().Sub(readinessStart), 3*ReadinessRecheck; got != want {
		t.Errorf("four looks took %s of the wait's clock, want %s (one per ReadinessRecheck, not per PollInterval)", got, want)
	}
	if api.watches.Load() != 1 {
		t.Errorf("NodeChanges called %d times, want once", api.watches.Load())
	}
	deadline := time.Now().Add(5 * time.Second)
	for api.ended.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if api.ended.Load() != 1 {
		t.Error("the wait's watch was not stopped when the wait ended")
	}
}

// A change the watch reports is looked at after at most PollInterval
// since the last look, not at the next recheck.
func TestReadinessWatchWakes(t *testing.T) {
	api := &watchedAPI{scriptedAPI: &scriptedAPI{script: []pollState{{gpus: 0, dsReady: true}, {gpus: 8, dsReady: true}}}, changes: make(chan struct{}, 1)}
	clk := clocktesting.NewFakeClock(readinessStart)
	rt := newFake()
	snap := readiness.Snapshot{Allocatable: map[string]int64{"nvidia.com/gpu": 8}, DaemonSets: []string{"kube-system/cni"}}
	rt.params = map[string]string{ResolvedReadiness: snap.Encode()}
	r := Readiness{Config: readiness.Config{Timeout: time.Hour}, API: api, PollInterval: time.Second, Clock: clk}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.step().Run(ctx, rt) }()
	for api.pollCount() < 1 || !clk.HasWaiters() {
		if ctx.Err() != nil {
			t.Fatal("the wait never made its first look")
		}
		time.Sleep(5 * time.Millisecond)
	}
	api.changes <- struct{}{} // the device plugin re-registered the GPUs
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the wait ended %v; want ready after the change", err)
			}
			if got := clk.Now().Sub(readinessStart); got > 2*time.Second {
				t.Errorf("the change was looked at %s after the first look, want within PollInterval (1 s), not at the recheck (%s)", got, ReadinessRecheck)
			}
			return
		case <-ctx.Done():
			t.Fatalf("the wait did not end after the change (clock at +%s)", clk.Now().Sub(readinessStart))
		case <-time.After(20 * time.Millisecond):
			if clk.Now().Sub(readinessStart) < 5*time.Second {
				clk.Step(100 * time.Millisecond)
			}
		}
	}
}
