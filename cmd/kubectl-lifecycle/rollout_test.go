package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/gpuhealth"
)

func ev(status v1alpha1.LifecycleEventClaimStatus, finalizer bool) *v1alpha1.LifecycleEvent {
	e := &v1alpha1.LifecycleEvent{Status: v1alpha1.LifecycleEventStatus{ClaimStatus: status}}
	if finalizer {
		e.Finalizers = []string{v1alpha1.Finalizer}
	}
	return e
}

// rn builds rollout nodes from a compact description: "-" no event yet,
// "P" pending, "C" claimed, "S" succeeded, "F" failed, "X" SLA expired.
func rn(states string) []*rolloutNode {
	now := time.Unix(0, 0)
	var out []*rolloutNode
	for i, c := range states {
		n := &rolloutNode{node: string(rune('a' + i))}
		switch c {
		case 'P':
			n.observe(ev(v1alpha1.LifecycleEventPending, false), now)
		case 'C':
			n.observe(ev(v1alpha1.LifecycleEventClaimed, true), now)
		case 'S':
			n.observe(ev(v1alpha1.LifecycleEventSucceeded, false), now)
		case 'F':
			n.observe(ev(v1alpha1.LifecycleEventFailed, false), now)
		case 'X':
			n.observe(ev(v1alpha1.LifecycleEventSlaExpired, false), now)
		}
		out = append(out, n)
	}
	return out
}

func TestNext(t *testing.T) {
	tests := []struct {
		name          string
		nodes         string
		maxConcurrent int
		maxFailures   int
		wantStart     string
		wantStopped   bool
	}{
		{name: "fresh rollout fills the window in order", nodes: "-----", maxConcurrent: 2, maxFailures: 1, wantStart: "ab"},
		{name: "full window starts nothing", nodes: "CP---", maxConcurrent: 2, maxFailures: 1, wantStart: ""},
		{name: "a finished node frees its place", nodes: "SC---", maxConcurrent: 2, maxFailures: 1, wantStart: "c"},
		{name: "resume after a kill adopts and continues", nodes: "SSC--", maxConcurrent: 2, maxFailures: 0, wantStart: "d"},
		{name: "failure limit stops starting", nodes: "FC---", maxConcurrent: 2, maxFailures: 1, wantStopped: true},
		{name: "SLA expiry counts as a failure", nodes: "XS---", maxConcurrent: 2, maxFailures: 1, wantStopped: true},
		{name: "below the failure limit goes on", nodes: "FS---", maxConcurrent: 2, maxFailures: 2, wantStart: "cd"},
		{name: "no failure limit", nodes: "FFF--", maxConcurrent: 1, maxFailures: 0, wantStart: "d"},
		{name: "everything done", nodes: "SSSSS", maxConcurrent: 3, maxFailures: 1, wantStart: ""},
		{name: "more in flight than the window (created without --wait)", nodes: "CCC--", maxConcurrent: 2, maxFailures: 1, wantStart: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start, stopped := next(rn(tt.nodes), tt.maxConcurrent, tt.maxFailures)
			got := ""
			for _, n := range start {
				got += n.node
			}
			if got != tt.wantStart || stopped != tt.wantStopped {
				t.Errorf("next(%s, %d, %d) = %q, stopped %v; want %q, stopped %v", tt.nodes, tt.maxConcurrent, tt.maxFailures, got, stopped, tt.wantStart, tt.wantStopped)
			}
		})
	}
}

func TestTally(t *testing.T) {
	got := count(rn("SFCP--")).String()
	if want := "done 1/6, running 2, waiting 2, failed 1"; got != want {
		t.Errorf("tally = %q, want %q", got, want)
	}
}

// A finished event still carrying the agent's finalizer has not settled
// (its Node conditions and slot are not written yet) until settleWait.
func TestSettled(t *testing.T) {
	tests := []struct {
		name  string
		ev    *v1alpha1.LifecycleEvent
		since time.Duration
		want  bool
	}{
		{name: "running", ev: ev(v1alpha1.LifecycleEventClaimed, true), want: false},
		{name: "finished, finalizer off", ev: ev(v1alpha1.LifecycleEventSucceeded, false), want: true},
		{name: "finished, finalizer on", ev: ev(v1alpha1.LifecycleEventSucceeded, true), since: time.Second, want: false},
		{name: "finished, finalizer stuck", ev: ev(v1alpha1.LifecycleEventFailed, true), since: settleWait, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := settled(tt.ev, tt.since); got != tt.want {
				t.Errorf("settled = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 60)
	tests := []struct {
		name, group, node, driver string
		want                      string
	}{
		{name: "short", group: "rack-12", node: "node-a", driver: "drain", want: "rollout-rack-12-node-a-drain"},
		{name: "dotted node", group: "g", node: "n1.example.com", driver: "reboot", want: "rollout-g-n1.example.com-reboot"},
		{name: "too long is cut and hashed", group: strings.Repeat("g", 56), node: long, driver: "os-upgrade"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rolloutEventName(tt.group, tt.node, tt.driver)
			if tt.want != "" && got != tt.want {
				t.Errorf("name = %q, want %q", got, tt.want)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("name %q is not a valid object name: %v", got, errs)
			}
			if again := rolloutEventName(tt.group, tt.node, tt.driver); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
	}
	if a, b := rolloutEventName("g", long, "x"), rolloutEventName("g", long+"e", "x"); a == b {
		t.Errorf("two long names collide: %q", a)
	}
}

func TestDefaultGroup(t *testing.T) {
	a := defaultGroup("drain", []string{"n2", "n1", "n3"}, "")
	if b := defaultGroup("drain", []string{"n3", "n1", "n2"}, ""); a != b {
		t.Errorf("group depends on node order: %q vs %q", a, b)
	}
	if !strings.HasPrefix(a, "drain-") || len(a) != len("drain-")+8 || !groupRE.MatchString(a) {
		t.Errorf("group %q: want drain-<8 hex digits>", a)
	}
	for _, other := range []string{
		defaultGroup("reboot", []string{"n1", "n2", "n3"}, ""),
		defaultGroup("drain", []string{"n1", "n2"}, ""),
		defaultGroup("drain", nil, "rack=r1"),
	} {
		if other == a {
			t.Errorf("different rollouts share group %q", a)
		}
	}
	g := defaultGroup(strings.Repeat("x", 63), []string{"n"}, "")
	if len(g) > maxGroupLen || !groupRE.MatchString(g) {
		t.Errorf("group %q: too long or invalid", g)
	}
}

func TestOutcomeExitCodes(t *testing.T) {
	tests := []struct {
		status v1alpha1.LifecycleEventClaimStatus
		code   int
	}{
		{v1alpha1.LifecycleEventSucceeded, exitOK},
		{v1alpha1.LifecycleEventFailed, exitFailed},
		{v1alpha1.LifecycleEventSlaExpired, exitSlaExpired},
	}
	for _, tt := range tests {
		t.Run(string(tt.status), func(t *testing.T) {
			e := ev(tt.status, false)
			e.Name, e.Status.Message = "ev-1", "the reason"
			err := outcome(e)
			code := exitOK
			var ee *exitError
			if errors.As(err, &ee) {
				code = ee.code
				if !strings.Contains(ee.msg, "the reason") {
					t.Errorf("message %q does not carry the status message", ee.msg)
				}
			}
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
		})
	}
}

// An API server that does not answer exits 6, as lifecycle-agent does
// (not 1, which says an event failed): each command that reads or writes
// against a kubeconfig whose server refuses connections.
func TestUnreachableExits6(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: connection refused
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://" + addr + "\n    insecure-skip-tls-verify: true\n" +
		"users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"status"}, {"transitions"}, {"history"}, {"run", "drain", "n1", "--wait=false"}, {"cancel", "ev-1"}} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := execute(context.Background(), append(args, "--kubeconfig", kc, "--request-timeout", "5s"), &out, &errOut, clocktesting.NewFakeClock(time.Now()))
			if code != exitUnavailable || !strings.Contains(errOut.String(), "the API server did not answer; retry later") {
				t.Errorf("exit %d, want %d naming the unreachable server; stderr:\n%s", code, exitUnavailable, errOut.String())
			}
		})
	}
}

// Usage errors exit 2 before any API call (the kubeconfig points nowhere).
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "unknown command", args: []string{"frobnicate"}, want: "unknown command"},
		{name: "run needs two arguments", args: []string{"run", "drain"}, want: "run takes 2 argument(s)"},
		{name: "bad param", args: []string{"run", "drain", "n1", "--param", "novalue"}, want: "want NAME=VALUE"},
		{name: "bad flag", args: []string{"status", "--no-such-flag"}, want: "unknown flag"},
		{name: "bad output", args: []string{"status", "-o", "xml"}, want: "-o xml"},
		{name: "rollout needs nodes, a selector or a need", args: []string{"rollout", "drain"}, want: "rollout takes NODE arguments, -l SELECTOR, --needs-reboot or --needs-gpu-reset"},
		{name: "one need at a time", args: []string{"rollout", "reboot", "--needs-reboot", "--needs-gpu-reset"}, want: "if any flags in the group [needs-reboot needs-gpu-reset] are set none of the others can be"},
		{name: "rollout nodes and a selector", args: []string{"rollout", "drain", "n1", "-l", "rack=r1"}, want: "NODE arguments or -l SELECTOR (one of the two)"},
		{name: "rollout max-failures without wait", args: []string{"rollout", "drain", "n1", "--max-failures", "2"}, want: "--max-failures needs --wait"},
		{name: "rollout bad group", args: []string{"rollout", "drain", "n1", "--group", "Rack_12"}, want: "--group"},
		{name: "rollout bad max-concurrent", args: []string{"rollout", "drain", "n1", "--max-concurrent", "0"}, want: "--max-concurrent 0"},
		{name: "cancel needs names or selector", args: []string{"cancel"}, want: "EVENT names or -l SELECTOR"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append(tt.args, "--kubeconfig", "/nonexistent/kubeconfig")
			code := execute(context.Background(), args, &out, &errOut, clocktesting.NewFakeClock(time.Now()))
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitUsage, errOut.String())
			}
			if !strings.Contains(errOut.String(), tt.want) {
				t.Errorf("stderr %q does not contain %q", errOut.String(), tt.want)
			}
		})
	}
}

func TestProgressLines(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var out bytes.Buffer
	o := &options{out: &out, clock: clk}
	p := newProgress(o, "ev-1", clk.Now())
	e := &v1alpha1.LifecycleEvent{}
	e.Status.ClaimStatus = v1alpha1.LifecycleEventClaimed
	e.Status.Holder = &v1alpha1.Holder{Identity: "node-a/1"}
	e.Status.Steps = []v1alpha1.StepStatus{{Name: "cordon", State: v1alpha1.StepRunning}, {Name: "evict", State: v1alpha1.StepPending}}
	clk.Step(100 * time.Millisecond)
	if p.update(e) {
		t.Fatal("claimed event reported as ended")
	}
	e = e.DeepCopy()
	e.Status.Steps[0].State, e.Status.Steps[1].State = v1alpha1.StepDone, v1alpha1.StepRunning
	clk.Step(50 * time.Millisecond)
	p.update(e)
	e = e.DeepCopy()
	e.Status.Steps[1].State, e.Status.Steps[1].Attempt = v1alpha1.StepDone, 2
	e.Status.ClaimStatus, e.Status.Message = v1alpha1.LifecycleEventSucceeded, "done"
	e.Status.CompletionTime = &metav1.Time{Time: clk.Now()}
	clk.Step(2 * time.Second)
	if !p.update(e) {
		t.Fatal("succeeded event not reported as ended")
	}
	got := out.String()
	for _, want := range []string{
		"[ 100ms] claimed by node-a/1",
		"step cordon       Done        50ms",
		"step evict        Done        2.0s (attempt 2)",
		"Succeeded in 2.1s: done",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// gpusNeedingReset reads back the indices the GPU monitor writes into
// GPUResetRequired's reason (gpuhealth.NeedCondition), and falls back to
// all GPUs when the reason was cut or cannot be read; the parameter is the
// driver's.
func TestGPUsNeedingReset(t *testing.T) {
	if gpuResetParamGPUs != drivers.GPUResetParamGPUs || gpuResetParamDrain != drivers.GPUResetParamDrain {
		t.Fatalf("parameters %q and %q, the driver's are %q and %q", gpuResetParamGPUs, gpuResetParamDrain, drivers.GPUResetParamGPUs, drivers.GPUResetParamDrain)
	}
	monitor := gpuhealth.NeedCondition(gpuhealth.NeedReset, gpuhealth.Needs{gpuhealth.NeedReset: {
		{Index: 3, UUID: "GPU-a", Causes: []string{"RecoveryAction_GPU_RESET", "RemappedRowsPending"}},
		{Index: 12, UUID: "GPU-b", Causes: []string{"XID48"}},
	}}, 16)
	var many []gpuhealth.GPUNeed
	for i := range 64 {
		many = append(many, gpuhealth.GPUNeed{Index: i, UUID: "GPU-x", Causes: []string{"RemappedRowsPending"}})
	}
	cut := gpuhealth.NeedCondition(gpuhealth.NeedReset, gpuhealth.Needs{gpuhealth.NeedReset: many}, 64)
	for _, tc := range []struct {
		name, reason, want string
	}{
		{"from the monitor", monitor.Reason, "3,12"},
		{"cut short", cut.Reason, "all"},
		{"not ours", "SomethingElse", "all"},
		{"no condition", "", "all"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &corev1.Node{}
			if tc.reason != "" {
				n.Status.Conditions = []corev1.NodeCondition{{Type: v1alpha1.NodeConditionGPUResetRequired, Status: corev1.ConditionTrue, Reason: tc.reason}}
			}
			if got := gpusNeedingReset(n); got != tc.want {
				t.Errorf("gpusNeedingReset(reason %q) = %q, want %q", tc.reason, got, tc.want)
			}
		})
	}
}
