package needs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// sink records the conditions written; it refuses while fail is set, as
// the API server does when it is unreachable.
type sink struct {
	written []apiclient.NodeCondition
	fail    bool
}

func (s *sink) SetNodeConditions(_ context.Context, _ time.Time, conds ...apiclient.NodeCondition) error {
	if s.fail {
		return errors.New("connection refused")
	}
	for _, c := range conds {
		if c.Type == "" || c.Reason == "" {
			return errors.New("condition needs a type and a reason") // as the API server's validation
		}
	}
	s.written = append(s.written, conds...)
	return nil
}

func newDetector(t *testing.T, cfg Config) (*Reboot, *sink, *prometheus.Registry) {
	t.Helper()
	s := &sink{}
	reg := prometheus.NewRegistry()
	cfg.Sink, cfg.Registerer, cfg.Log = s, reg, slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := NewReboot(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, s, reg
}

func want(t *testing.T, got apiclient.NodeCondition, status corev1.ConditionStatus, reason, msg string) {
	t.Helper()
	if got.Type != v1alpha1.NodeConditionRebootRequired || got.Status != status || got.Reason != reason || !strings.Contains(got.Message, msg) {
		t.Fatalf("condition %+v; want RebootRequired=%s/%s with a message containing %q", got, status, reason, msg)
	}
}

// The file sentinel: the need comes and goes with the file; Debian's
// .pkgs names the packages (each once); a write only when it changed, a
// failed write retried at the next evaluation; the gauge follows.
func TestSentinelFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "reboot-required")
	r, s, reg := newDetector(t, Config{SentinelFile: file})
	ctx := context.Background()

	want(t, r.Evaluate(ctx), corev1.ConditionFalse, CauseSentinelFile, file+" absent")
	r.Evaluate(ctx)
	if len(s.written) != 1 {
		t.Fatalf("%d writes for an unchanged need; want 1", len(s.written))
	}
	if g := testutil.ToFloat64(r.gauge); g != 0 {
		t.Errorf("lifecycle_agent_reboot_required %v; want 0", g)
	}

	if err := os.WriteFile(file, []byte("*** System restart required ***\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+".pkgs", []byte("linux-image-6.1.0-28-amd64\nlibc6\nlinux-image-6.1.0-28-amd64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.fail = true
	want(t, r.Evaluate(ctx), corev1.ConditionTrue, CauseSentinelFile, file+" exists; packages: linux-image-6.1.0-28-amd64, libc6")
	if len(s.written) != 1 {
		t.Fatalf("a refused write counted as written: %+v", s.written)
	}
	s.fail = false
	r.Evaluate(ctx)
	if len(s.written) != 2 || s.written[1].Status != corev1.ConditionTrue {
		t.Fatalf("the refused write was not retried at the next evaluation: %+v", s.written)
	}
	if g := testutil.ToFloat64(r.gauge); g != 1 {
		t.Errorf("lifecycle_agent_reboot_required %v; want 1", g)
	}

	// The reboot: /var/run is a tmpfs, the files are gone.
	os.Remove(file)
	os.Remove(file + ".pkgs")
	want(t, r.Evaluate(ctx), corev1.ConditionFalse, CauseSentinelFile, "absent")
	if len(s.written) != 3 || testutil.ToFloat64(r.gauge) != 0 {
		t.Fatalf("need gone: writes %+v, gauge %v", s.written, testutil.ToFloat64(r.gauge))
	}
	if n, err := testutil.GatherAndCount(reg, "lifecycle_agent_reboot_required", "lifecycle_agent_reboot_required_check_errors_total"); err != nil || n != 2 {
		t.Errorf("registered metrics: %d, %v; want both", n, err)
	}
}

// The command sentinel, as kured's: exit 0 is a need, any other status is
// none, a command that outlives its timeout is killed (its children too)
// and the need is Unknown, counted as a check error. The command replaces
// the file.
func TestSentinelCommand(t *testing.T) {
	dir := t.TempDir()
	flag := filepath.Join(dir, "needs-it")
	file := filepath.Join(dir, "ignored-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r, _, _ := newDetector(t, Config{SentinelFile: file, SentinelCommand: "test -e " + flag})
	ctx := context.Background()
	want(t, r.Evaluate(ctx), corev1.ConditionFalse, CauseSentinelCommand, "`test -e "+flag+"` exited 1")
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want(t, r.Evaluate(ctx), corev1.ConditionTrue, CauseSentinelCommand, "exited 0")

	out := filepath.Join(dir, "child-survived")
	slow, _, _ := newDetector(t, Config{SentinelCommand: "(sleep 2; touch " + out + ") & sleep 30", CommandTimeout: 300 * time.Millisecond})
	start := time.Now()
	want(t, slow.Evaluate(ctx), corev1.ConditionUnknown, CauseSentinelCommand, "did not finish within 300ms (killed)")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the timed-out command held the check %s", d)
	}
	if got := testutil.ToFloat64(slow.errors); got != 1 {
		t.Errorf("check errors %v; want 1", got)
	}
	time.Sleep(2500 * time.Millisecond)
	if _, err := os.Stat(out); err == nil {
		t.Errorf("the command's child outlived the kill: it created %s", out)
	}
	if got := testutil.ToFloat64(slow.gauge); got != 0 {
		t.Errorf("lifecycle_agent_reboot_required %v while Unknown; want 0", got)
	}
}

// A configuration that asks for nothing, or misses a part, is refused.
func TestNewRebootRefuses(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, c := range []Config{
		{Sink: &sink{}, Log: log},
		{SentinelFile: "/x", Log: log},
		{SentinelFile: "/x", Sink: &sink{}, Log: log, Interval: -time.Second},
	} {
		if _, err := NewReboot(c); err == nil {
			t.Errorf("NewReboot(%+v) accepted", c)
		}
	}
}

// The GPUs' cause merges with the sentinel's: True while either asks, the
// reason naming each cause that holds; with no sentinel the condition says
// only what the GPUs ask.
func TestGPUCause(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "reboot-required")
	r, s, _ := newDetector(t, Config{SentinelFile: file, GPU: true})
	ctx := context.Background()
	const gpu = "1 of 8 GPUs needs a reboot: GPU-1 (index 3): RecoveryAction_NODE_REBOOT"

	want(t, r.Evaluate(ctx), corev1.ConditionFalse, CauseSentinelFile, "absent")
	r.SetGPUCause(ctx, gpu)
	want(t, s.written[len(s.written)-1], corev1.ConditionTrue, CauseGPUHealth, gpu+"; "+file+" absent")
	if g := testutil.ToFloat64(r.gauge); g != 1 {
		t.Errorf("lifecycle_agent_reboot_required %v with a GPU cause; want 1", g)
	}
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want(t, r.Evaluate(ctx), corev1.ConditionTrue, CauseSentinelFile+","+CauseGPUHealth, file+" exists; "+gpu)
	r.SetGPUCause(ctx, "")
	want(t, s.written[len(s.written)-1], corev1.ConditionTrue, CauseSentinelFile, file+" exists")
	os.Remove(file)
	want(t, r.Evaluate(ctx), corev1.ConditionFalse, CauseSentinelFile, "absent")
	if g := testutil.ToFloat64(r.gauge); g != 0 {
		t.Errorf("lifecycle_agent_reboot_required %v with no cause; want 0", g)
	}
	if len(s.written) != 5 {
		t.Errorf("%d writes for 5 changes: %+v", len(s.written), s.written)
	}

	gpuOnly, s2, _ := newDetector(t, Config{GPU: true})
	want(t, gpuOnly.Evaluate(ctx), corev1.ConditionFalse, CauseGPUHealth, "no GPU asks for a reboot")
	gpuOnly.SetGPUCause(ctx, gpu)
	want(t, s2.written[len(s2.written)-1], corev1.ConditionTrue, CauseGPUHealth, gpu)
}
