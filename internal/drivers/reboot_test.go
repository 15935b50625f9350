package drivers

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

func TestRebootPlan(t *testing.T) {
	tests := []struct {
		name    string
		params  map[string]string
		steps   []string
		wantErr string
	}{
		{name: "defaults: drain, reboot, wait for Ready, uncordon",
			steps: []string{"cordon", "evict", "wait-empty", "reboot", "wait-ready", "wait-workloads-ready", "uncordon"}},
		{name: "no drain, no Ready wait",
			params: map[string]string{"drain": "false", "waitForReady": "false"},
			steps:  []string{"reboot", "uncordon"}},
		{name: "drain parameters pass through",
			params: map[string]string{"gracePeriodSeconds": "30", "podSelector": "app=web", "rebootAttempts": "5"},
			steps:  []string{"cordon", "evict", "wait-empty", "reboot", "wait-ready", "wait-workloads-ready", "uncordon"}},
		{name: "drain is not a bool", params: map[string]string{"drain": "maybe"},
			wantErr: `parameters.drain: "maybe" is not true or false`},
		{name: "rebootAttempts out of range", params: map[string]string{"rebootAttempts": "0"},
			wantErr: `parameters.rebootAttempts: "0" is not an integer from 1 to 10`},
		{name: "unknown parameter", params: map[string]string{"force": "true"},
			wantErr: `unknown parameter "force"`},
		{name: "drain parameter without a drain", params: map[string]string{"drain": "false", "podSelector": "app=web"},
			wantErr: "parameters.podSelector applies only to a drain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			steps, err := Reboot{}.Plan(tt.params)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrBadParameter) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Plan error = %v, want ErrBadParameter containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if got := stepNames(steps); !slices.Equal(got, tt.steps) {
				t.Errorf("steps = %v, want %v", got, tt.steps)
			}
		})
	}
}

func TestRebootRun(t *testing.T) {
	errRefused := errors.New("D-Bus error org.freedesktop.login1.OperationInProgress: shutdown already scheduled")
	tests := []struct {
		name   string
		params map[string]string
		setup  func(rt *fakeRuntime)
		short  bool // bounded waits of milliseconds
		// want
		failedStep string
		wantErr    string
		calls      []string
		reboots    int
		cordoned   bool
		progress   string
	}{
		{
			name:  "happy path: drain, reboot, new boot ID, Ready, uncordon ours",
			setup: func(rt *fakeRuntime) { rt.host.rebootChangesBoot = true; rt.api.readyAfter = 3 },
			calls: []string{"rt.Own cordon/node-a", "api.Cordon ev-1", "api.Drain", "api.PodsLeft",
				"host.Reboot", "api.NodeReady", "api.Uncordon ev-1 force=false", "rt.Disown cordon/node-a"},
			reboots:  1,
			progress: "rebooted: boot ID boot-1 → boot-2",
		},
		{
			name:     "no drain: nothing to uncordon",
			params:   map[string]string{"drain": "false", "waitForReady": "false"},
			setup:    func(rt *fakeRuntime) { rt.host.rebootChangesBoot = true },
			calls:    []string{"host.Reboot"},
			reboots:  1,
			progress: "no cordon of this event to lift",
		},
		{
			name:   "refused once, then accepted",
			params: map[string]string{"drain": "false"},
			setup: func(rt *fakeRuntime) {
				rt.host.rebootChangesBoot = true
				rt.host.rebootErrs = []error{errRefused}
			},
			calls:    []string{"host.Reboot", "api.NodeReady"},
			reboots:  2,
			progress: "reboot request 1 of 3 refused",
		},
		{
			name:       "boot ID unchanged after every request: fails, node stays cordoned for the abort",
			short:      true,
			params:     map[string]string{"rebootAttempts": "2"},
			failedStep: "reboot",
			wantErr:    "the node did not reboot: boot ID is still boot-1 after 2 reboot requests (each followed by a 20ms wait)",
			calls:      []string{"rt.Own cordon/node-a", "api.Cordon ev-1", "api.Drain", "api.PodsLeft", "host.Reboot"},
			reboots:    2,
			cordoned:   true,
		},
		{
			name:       "logind refuses every request",
			params:     map[string]string{"drain": "false"},
			setup:      func(rt *fakeRuntime) { rt.host.rebootErrs = []error{errRefused, errRefused, errRefused} },
			failedStep: "reboot",
			wantErr:    "logind refused all 3 reboot requests; last error: D-Bus error org.freedesktop.login1.OperationInProgress",
			calls:      []string{"host.Reboot"},
			reboots:    3,
		},
		{
			name:       "Ready wait times out",
			short:      true,
			setup:      func(rt *fakeRuntime) { rt.host.rebootChangesBoot = true; rt.api.readyAfter = 0 },
			failedStep: "wait-ready",
			wantErr:    "the node did not become Ready within 50ms (reboot.readyTimeout): the kubelet's Ready condition is not True",
			// readiness.onTimeout keepCordoned (the default): the kept
			// cordon journaled before the step fails.
			calls:    []string{"rt.Own cordon/node-a", "api.Cordon ev-1", "api.Drain", "api.PodsLeft", "host.Reboot", "api.NodeReady", "rt.Own cordon-kept/cordon-kept/node-a"},
			reboots:  1,
			cordoned: true,
		},
		{
			name:   "Ready wait times out with the API error",
			short:  true,
			params: map[string]string{"drain": "false"},
			setup: func(rt *fakeRuntime) {
				rt.host.rebootChangesBoot = true
				rt.api.readyErr = errors.New("nodes \"node-a\" is forbidden")
			},
			failedStep: "wait-ready",
			wantErr:    `within 50ms (reboot.readyTimeout); last error reading the Node: nodes "node-a" is forbidden`,
			calls:      []string{"host.Reboot", "api.NodeReady"},
			reboots:    1,
		},
		{
			name: "cordon not ours: left in place, not uncordoned",
			setup: func(rt *fakeRuntime) {
				rt.host.rebootChangesBoot = true
				rt.api.cordoned, rt.api.cordonOwner = true, "" // an admin's kubectl cordon
			},
			calls: []string{"rt.Own cordon/node-a", "api.Cordon ev-1", "rt.Disown cordon/node-a",
				"api.Drain", "api.PodsLeft", "host.Reboot", "api.NodeReady"},
			reboots:  1,
			cordoned: true,
			progress: "no cordon of this event to lift",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFake()
			if tt.setup != nil {
				tt.setup(rt)
			}
			cfg := fastReboot()
			if tt.short {
				cfg = shortWaits()
			}
			steps, err := Reboot{RebootConfig: cfg}.Plan(tt.params)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			failed, err := runSteps(t, steps, rt)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("step %s failed: %v", failed, err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if failed != tt.failedStep {
				t.Errorf("failed step = %q, want %q", failed, tt.failedStep)
			}
			if got := rt.rec.list(); !slices.Equal(got, tt.calls) {
				t.Errorf("calls =\n  %q\nwant\n  %q", got, tt.calls)
			}
			if got := rt.rec.count("host.Reboot"); got != tt.reboots {
				t.Errorf("reboot requests = %d, want %d", got, tt.reboots)
			}
			if rt.api.cordoned != tt.cordoned {
				t.Errorf("node cordoned = %t, want %t", rt.api.cordoned, tt.cordoned)
			}
			if tt.progress != "" && !rt.progressed(tt.progress) {
				t.Errorf("no progress message contains %q; got:\n%s", tt.progress, rt.allProgress())
			}
		})
	}
}

// TestRebootDoneOnReplay models the engine's replay of a reboot step whose
// intent was journaled (by this or an older agent version) but not its
// completion: the intent's boot ID decides.
func TestRebootDoneOnReplay(t *testing.T) {
	tests := []struct {
		name         string
		intentBootID string
		want         bool
	}{
		{name: "intent from before the reboot (older agent's record): done", intentBootID: "boot-0", want: true},
		{name: "same boot: the reboot did not happen", intentBootID: "boot-1", want: false},
		{name: "intent without a boot ID proves nothing", intentBootID: "", want: false},
	}
	steps, err := Reboot{}.Plan(nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(steps, func(s Step) bool { return s.Name == "reboot" })
	if steps[i].Done == nil {
		t.Fatal("the reboot step has no Done check")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFake()
			done, err := steps[i].Done(context.Background(), rt, tt.intentBootID)
			if err != nil || done != tt.want {
				t.Errorf("Done(intent %q, now boot-1) = %t, %v; want %t", tt.intentBootID, done, err, tt.want)
			}
			if len(rt.rec.list()) != 0 {
				t.Errorf("Done acted: %v", rt.rec.list())
			}
		})
	}
}

// TestRebootWaitsOnInjectedClock shows that the waits between reboot
// requests are timed by the injected clock: five minutes per request pass
// in no wall time.
func TestRebootWaitsOnInjectedClock(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	fc := testingclock.NewFakeClock(start)
	rt := newFake()
	steps, err := Reboot{RebootConfig: RebootConfig{Clock: fc, RebootWait: 5 * time.Minute, PollInterval: time.Second}}.
		Plan(map[string]string{"drain": "false", "rebootAttempts": "2"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- steps[0].Run(context.Background(), rt) }()
	limit := time.After(10 * time.Second)
	for {
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "the node did not reboot") {
				t.Fatalf("error = %v, want the node did not reboot", err)
			}
			if got := fc.Since(start); got < 10*time.Minute {
				t.Errorf("fake time passed = %s, want at least 2 × 5m", got)
			}
			if n := rt.rec.count("host.Reboot"); n != 2 {
				t.Errorf("reboot requests = %d, want 2", n)
			}
			return
		case <-limit:
			t.Fatal("the reboot step did not end")
		case <-time.After(time.Millisecond):
			if fc.HasWaiters() {
				fc.Step(time.Minute)
			}
		}
	}
}

func TestRebootStepCancelled(t *testing.T) {
	rt := newFake()
	steps, err := Reboot{RebootConfig: RebootConfig{RebootWait: time.Hour}}.Plan(map[string]string{"drain": "false"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- steps[0].Run(ctx, rt) }()
	// The real agent is stopped by the shutdown while it waits.
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reboot step did not stop on cancel")
	}
}
