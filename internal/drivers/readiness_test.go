package drivers

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
)

// pollClock is a fake clock whose After fires at once, having moved the
// time on by the wait: each poll of the readiness wait is one interval
// later than the one before, without the test pacing it.
type pollClock struct{ *clocktesting.FakeClock }

func (c pollClock) After(d time.Duration) <-chan time.Time {
	c.Step(d)
	ch := make(chan time.Time, 1)
	ch <- c.Now()
	return ch
}

// pollState is what one poll of the readiness wait reads: the node's
// allocatable GPUs, whether the DaemonSet pod is Ready, or an API error.
type pollState struct {
	gpus    int64
	dsReady bool
	err     error
	// readySince is the pod's Ready condition's lastTransitionTime (zero:
	// none).
	readySince time.Time
}

// scriptedAPI answers the n-th poll (GetNode, then NodePods) with
// script[n], and the last entry from then on.
type scriptedAPI struct {
	mu     sync.Mutex
	script []pollState
	polls  int
}

func (a *scriptedAPI) now() pollState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.script[min(a.polls, len(a.script)-1)]
}

func (a *scriptedAPI) GetNode(ctx context.Context) (*corev1.Node, error) {
	s := a.now()
	if s.err != nil {
		a.mu.Lock()
		a.polls++ // a failed poll reads no pods
		a.mu.Unlock()
		return nil, s.err
	}
	return &corev1.Node{Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
		"nvidia.com/gpu": *resource.NewQuantity(s.gpus, resource.DecimalSI)}}}, nil
}

func (a *scriptedAPI) NodePods(ctx context.Context) ([]corev1.Pod, error) {
	s := a.now()
	a.mu.Lock()
	a.polls++
	a.mu.Unlock()
	ready := corev1.ConditionFalse
	if s.dsReady {
		ready = corev1.ConditionTrue
	}
	yes := true
	return []corev1.Pod{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "cni-x",
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "cni", Controller: &yes}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready,
			LastTransitionTime: metav1.NewTime(s.readySince)}}},
	}}, nil
}

// readinessRun runs the readiness step against script, with the claim-time
// snapshot "8 GPUs and kube-system/cni Ready", polling every second.
func readinessRun(t *testing.T, timeout time.Duration, cordoned bool, script ...pollState) (*fakeRuntime, error) {
	t.Helper()
	return readinessRunOn(t, newFake(), &scriptedAPI{script: script}, timeout, cordoned)
}

// readinessRunOn is readinessRun on rt and api.
func readinessRunOn(t *testing.T, rt *fakeRuntime, api *scriptedAPI, timeout time.Duration, cordoned bool) (*fakeRuntime, error) {
	t.Helper()
	snap := readiness.Snapshot{Allocatable: map[string]int64{"nvidia.com/gpu": 8}, DaemonSets: []string{"kube-system/cni"}}
	rt.params = map[string]string{ResolvedReadiness: snap.Encode()}
	if cordoned {
		if err := rt.Own(Change{Kind: "cordon", Key: rt.node}); err != nil {
			t.Fatal(err)
		}
	}
	r := Readiness{Config: readiness.Config{Timeout: timeout}, API: api,
		PollInterval: time.Second, Clock: pollClock{clocktesting.NewFakeClock(readinessStart)}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return rt, r.step().Run(ctx, rt)
}

var errRefused = errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")

// The wait writes the event's status (and so the Node's condition) when
// what is missing changes, or when the API server stops answering — not at
// every poll — and an outage in the middle does not end it.
func TestReadinessProgressOnChange(t *testing.T) {
	both := pollState{gpus: 0}
	gpus := pollState{gpus: 0, dsReady: true}
	down := func(i int) pollState {
		return pollState{err: errors.New(errRefused.Error() + strings.Repeat(" again", i))}
	}
	rt, err := readinessRun(t, time.Hour, true,
		both, both, both, gpus, gpus, down(0), down(1), down(2), gpus, gpus, pollState{gpus: 8, dsReady: true})
	if err != nil {
		t.Fatalf("the wait ended %v; want ready after the outage", err)
	}
	ds := "DaemonSet kube-system/cni has no Ready pod on the node"
	gpu := "allocatable nvidia.com/gpu is 0 of 8"
	want := []string{
		"checking the node's workloads before the uncordon (daemonsets, resources, conditions, up to 1h0m0s)",
		ReadinessWaiting + ds + "; " + gpu,
		ReadinessWaiting + gpu,
		ReadinessWaiting + gpu + " (as last read; the API server does not answer, retrying until readiness.timeout: readiness: reading the Node: " + errRefused.Error() + ")",
		ReadinessWaiting + gpu,
		"the node's workloads are ready: daemonsets, resources, conditions",
	}
	if got := rt.allProgress(); got != strings.Join(want, "\n") {
		t.Errorf("progress:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// When readiness.timeout passes during an outage, the step fails naming
// what was not ready as last read and the last poll's API error, wrapped.
func TestReadinessTimeoutDuringOutage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		script   []pollState
		cordoned bool
		want     string
	}{
		{
			name:     "after a read",
			script:   []pollState{{gpus: 0, dsReady: true}, {err: errRefused}},
			cordoned: true,
			want: "the node's workloads were not ready within 10s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8, " +
				"as last read before the API server stopped answering: readiness: reading the Node: " + errRefused.Error() + KeptSuffix,
		},
		{
			name:   "never read",
			script: []pollState{{err: errRefused}},
			want:   "the node's workloads could not be checked within 10s (readiness.timeout): readiness: reading the Node: " + errRefused.Error(),
		},
		{
			name:   "read again before the timeout",
			script: []pollState{{err: errRefused}, {gpus: 0, dsReady: true}},
			want:   "the node's workloads were not ready within 10s (readiness.timeout): allocatable nvidia.com/gpu is 0 of 8",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := readinessRun(t, 10*time.Second, tc.cordoned, tc.script...)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("err = %v\nwant %s", err, tc.want)
			}
			if apiDown := tc.script[len(tc.script)-1].err != nil; errors.Is(err, errRefused) != apiDown {
				t.Errorf("errors.Is(err, the API error) = %v, want %v", !apiDown, apiDown)
			}
			if kept := rt.Owns(CordonKept(rt.node)); kept != tc.cordoned {
				t.Errorf("cordon kept = %v, want %v", kept, tc.cordoned)
			}
		})
	}
}

// After a reboot a DaemonSet pod whose Ready predates the boot (the status
// the old boot left, until the new kubelet posts the pod's) does not count
// for StaleReadyGrace from the wait's start, and the status says why; past
// it the status is taken as it reads (a clock stepped after the kubelet
// wrote it must not hold the node for the whole readiness.timeout). One
// Ready in this boot counts at once.
func TestReadinessStaleReadyGrace(t *testing.T) {
	boot := readinessStart.Add(-2 * time.Minute)
	stale := pollState{gpus: 8, dsReady: true, readySince: boot.Add(-time.Hour)}
	rt := newFake()
	rt.host.bootTime = boot
	api := &scriptedAPI{script: []pollState{stale}}
	rt, err := readinessRunOn(t, rt, api, time.Hour, true)
	if err != nil {
		t.Fatalf("the wait ended %v; want ready once StaleReadyGrace passed", err)
	}
	want := []string{
		"checking the node's workloads before the uncordon (daemonsets, resources, conditions, up to 1h0m0s)",
		ReadinessWaiting + "DaemonSet kube-system/cni has no Ready pod on the node (its pod's Ready is from before this boot: since 2026-12-01T10:58:00Z, the boot began 2026-12-01T11:58:00Z)",
		"the node's workloads are ready: daemonsets, resources, conditions",
	}
	if got := rt.allProgress(); got != strings.Join(want, "\n") {
		t.Errorf("progress:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	// One poll a second from 0 s: the one at 30 s counts the pod.
	if want := int(StaleReadyGrace/time.Second) + 1; api.polls != want {
		t.Errorf("ready at poll %d, want %d (StaleReadyGrace %s, a poll a second)", api.polls, want, StaleReadyGrace)
	}

	fresh := newFake()
	fresh.host.bootTime = boot
	fresh, err = readinessRunOn(t, fresh, &scriptedAPI{script: []pollState{{gpus: 8, dsReady: true, readySince: boot.Add(30 * time.Second)}}}, time.Hour, true)
	if err != nil || strings.Contains(fresh.allProgress(), ReadinessWaiting) {
		t.Fatalf("a pod Ready in this boot: %v, progress:\n%s", err, fresh.allProgress())
	}
}

// A wait begun before this boot (the node power-cycled during it, the
// agent resumed before the kubelet): the API server still holds the old
// boot's Node and pods, all ready. The wait requires the Node Ready in
// this boot too, and gives the node back only once it is. Before, it
// passed at its first poll on the old boot's state.
func TestReadinessRebootedDuringTheWait(t *testing.T) {
	rt := newFake()
	rt.host.bootTime = readinessStart.Add(-time.Minute)
	rt.started = readinessStart.Add(-10 * time.Minute)
	rt.api.readyAfter = 3 // the kubelet of this boot reports Ready at the third look
	ready := pollState{gpus: 8, dsReady: true, readySince: readinessStart.Add(-30 * time.Second)}
	api := &scriptedAPI{script: []pollState{ready}}
	rt, err := readinessRunOn(t, rt, api, time.Hour, true)
	if err != nil {
		t.Fatalf("the wait ended %v; want ready once the Node is Ready in this boot", err)
	}
	if !rt.progressed(ReadinessWaiting + "the Node is not Ready in this boot") {
		t.Errorf("the wait did not name the Node not Ready in this boot:\n%s", rt.allProgress())
	}
	if api.polls < 3 {
		t.Errorf("given back at poll %d, before the Node was Ready in this boot (poll 3)", api.polls)
	}
	// A wait begun in this boot does not ask (wait-ready did).
	rt = newFake()
	rt.host.bootTime = readinessStart.Add(-time.Minute)
	rt.started = readinessStart
	rt, err = readinessRunOn(t, rt, &scriptedAPI{script: []pollState{ready}}, time.Hour, true)
	if err != nil || rt.rec.count("api.NodeReady") != 0 {
		t.Errorf("a wait begun in this boot: %v, NodeReady asked %d times, want none", err, rt.rec.count("api.NodeReady"))
	}
}
