package needs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// Causes: the reason of the RebootRequired condition.
const (
	CauseSentinelFile    = "SentinelFile"
	CauseSentinelCommand = "SentinelCommand"
	// CauseGPUHealth: a GPU asks for a reboot (internal/gpuhealth's
	// RebootCause: a recovery action, a lost GPU, a reboot-class XID).
	CauseGPUHealth = "GPUHealth"
)

// Defaults for Config fields left zero.
const (
	DefaultInterval       = time.Minute
	DefaultCommandTimeout = 30 * time.Second
	// maxMessage caps the condition's message (the package list can be long).
	maxMessage = 1024
)

// Sink writes Node conditions: *apiclient.Client.
type Sink interface {
	SetNodeConditions(ctx context.Context, now time.Time, conds ...apiclient.NodeCondition) error
}

// Config of the reboot-required detector.
type Config struct {
	// SentinelFile: a reboot is needed while it exists.
	SentinelFile string
	// SentinelCommand, when set, replaces SentinelFile: run by /bin/sh -c;
	// exit status 0 means a reboot is needed.
	SentinelCommand string
	// CommandTimeout bounds one run of SentinelCommand; 0: the default.
	CommandTimeout time.Duration
	// Interval between evaluations; 0: the default.
	Interval time.Duration
	// GPU: the GPU health monitor reports its causes (SetGPUCause). With
	// both sentinels off the condition then says only what the GPUs ask.
	GPU bool
	// OnNeed, when set, is handed every evaluation's condition, after it
	// was written (or its write was tried): the agent's Requester under
	// needs.reboot.policy request.
	OnNeed func(ctx context.Context, c apiclient.NodeCondition)

	Sink       Sink                  // required
	Registerer prometheus.Registerer // nil: no metrics
	Clock      clock.Clock           // nil: the real clock
	Log        *slog.Logger          // required
}

// Enabled says whether the configuration asks for the detector at all.
func (c Config) Enabled() bool { return c.sentinel() || c.GPU }

func (c Config) sentinel() bool { return c.SentinelFile != "" || c.SentinelCommand != "" }

// Reboot is the reboot-required detector.
type Reboot struct {
	cfg    Config
	clk    clock.Clock
	gauge  prometheus.Gauge
	errors prometheus.Counter

	eval     sync.Mutex // serializes evaluations: a later read never loses to an earlier one
	mu       sync.Mutex
	written  *apiclient.NodeCondition // the last condition the API accepted
	gpu      string                   // SetGPUCause's last cause; "": none
	sentinel *apiclient.NodeCondition // the sentinel's last reading; nil: none yet, or no sentinel
}

// NewReboot checks cfg and returns the detector.
func NewReboot(cfg Config) (*Reboot, error) {
	switch {
	case !cfg.Enabled():
		return nil, errors.New("needs: neither a sentinel file, a sentinel command nor the GPU monitor")
	case cfg.Sink == nil || cfg.Log == nil:
		return nil, errors.New("needs: Config needs Sink and Log")
	case cfg.Interval < 0 || cfg.CommandTimeout < 0:
		return nil, errors.New("needs: Interval and CommandTimeout must not be negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.CommandTimeout == 0 {
		cfg.CommandTimeout = DefaultCommandTimeout
	}
	r := &Reboot{cfg: cfg, clk: cfg.Clock}
	if r.clk == nil {
		r.clk = clock.RealClock{}
	}
	r.gauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifecycle_agent_reboot_required",
		Help: "1 while the node reports RebootRequired=True (its sentinel file exists, or its sentinel command exits 0), 0 otherwise."})
	r.errors = prometheus.NewCounter(prometheus.CounterOpts{Name: "lifecycle_agent_reboot_required_check_errors_total",
		Help: "Evaluations of the reboot-required sentinel that could not tell (RebootRequired=Unknown)."})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.gauge); err != nil {
			return nil, err
		}
		if err := cfg.Registerer.Register(r.errors); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Run evaluates at start and every Interval until ctx ends.
func (r *Reboot) Run(ctx context.Context) {
	for {
		r.Evaluate(ctx)
		t := r.clk.NewTimer(r.cfg.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// SetGPUCause records the GPUs' part of the need (gpuhealth.RebootCause;
// "": no GPU asks for a reboot) and writes the condition merged with the
// sentinel's last reading; it reads no sentinel itself (a sentinel command
// may take its whole timeout, and this runs in the GPU monitor's
// evaluation). Before the first reading it only records the cause: that
// reading, at Run's start, writes it.
func (r *Reboot) SetGPUCause(ctx context.Context, cause string) {
	r.eval.Lock()
	defer r.eval.Unlock()
	r.mu.Lock()
	r.gpu = cause
	sentinel := r.sentinel
	r.mu.Unlock()
	if sentinel == nil && r.cfg.sentinel() {
		return
	}
	r.publish(ctx, merge(sentinel, cause))
}

// Evaluate reads the sentinel once, merges the GPUs' cause, updates the
// metrics and writes the condition when it changed; it returns the
// condition read.
func (r *Reboot) Evaluate(ctx context.Context) apiclient.NodeCondition {
	r.eval.Lock()
	defer r.eval.Unlock()
	var sentinel *apiclient.NodeCondition
	if r.cfg.sentinel() {
		s := r.read(ctx)
		if s.Status == corev1.ConditionUnknown {
			r.errors.Inc()
		}
		sentinel = &s
	}
	r.mu.Lock()
	r.sentinel = sentinel
	gpu := r.gpu
	r.mu.Unlock()
	c := merge(sentinel, gpu)
	r.publish(ctx, c)
	return c
}

// publish sets the gauge and writes c when it differs from the last
// condition the API accepted. Call with r.eval held.
func (r *Reboot) publish(ctx context.Context, c apiclient.NodeCondition) {
	if c.Status == corev1.ConditionTrue {
		r.gauge.Set(1)
	} else {
		r.gauge.Set(0)
	}
	r.mu.Lock()
	same := r.written != nil && *r.written == c
	r.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	if r.cfg.OnNeed != nil {
		defer r.cfg.OnNeed(ctx, c)
	}
	if same {
		return
	}
	if err := r.cfg.Sink.SetNodeConditions(ctx, r.clk.Now(), c); err != nil {
		r.cfg.Log.Warn("writing the RebootRequired condition failed; retrying at the next check", "err", err)
		return
	}
	r.mu.Lock()
	from := "none"
	if r.written != nil {
		from = string(r.written.Status) + "/" + r.written.Reason
	}
	r.written = &c
	r.mu.Unlock()
	r.cfg.Log.Info("RebootRequired condition", "from", from, "to", string(c.Status)+"/"+c.Reason, "message", c.Message)
}

// merge is RebootRequired from the sentinel's reading (nil: no sentinel)
// and the GPUs' cause: True when either asks, the reason naming each cause
// that holds ("SentinelFile,GPUHealth").
func merge(sentinel *apiclient.NodeCondition, gpu string) apiclient.NodeCondition {
	switch {
	case gpu == "" && sentinel != nil:
		return *sentinel
	case gpu == "":
		return apiclient.NodeCondition{Type: v1alpha1.NodeConditionRebootRequired, Status: corev1.ConditionFalse,
			Reason: CauseGPUHealth, Message: "no GPU asks for a reboot"}
	case sentinel != nil && sentinel.Status == corev1.ConditionTrue:
		return apiclient.NodeCondition{Type: v1alpha1.NodeConditionRebootRequired, Status: corev1.ConditionTrue,
			Reason: sentinel.Reason + "," + CauseGPUHealth, Message: capMessage(sentinel.Message + "; " + gpu)}
	case sentinel != nil:
		return apiclient.NodeCondition{Type: v1alpha1.NodeConditionRebootRequired, Status: corev1.ConditionTrue,
			Reason: CauseGPUHealth, Message: capMessage(gpu + "; " + sentinel.Message)}
	}
	return apiclient.NodeCondition{Type: v1alpha1.NodeConditionRebootRequired, Status: corev1.ConditionTrue,
		Reason: CauseGPUHealth, Message: capMessage(gpu)}
}

func (r *Reboot) read(ctx context.Context) apiclient.NodeCondition {
	c := apiclient.NodeCondition{Type: v1alpha1.NodeConditionRebootRequired}
	if r.cfg.SentinelCommand != "" {
		c.Reason = CauseSentinelCommand
		c.Status, c.Message = r.runCommand(ctx)
		return c
	}
	c.Reason = CauseSentinelFile
	_, err := os.Stat(r.cfg.SentinelFile)
	switch {
	case err == nil:
		c.Status, c.Message = corev1.ConditionTrue, r.cfg.SentinelFile+" exists"
		if pkgs := readPackages(r.cfg.SentinelFile + ".pkgs"); len(pkgs) > 0 {
			c.Message += "; packages: " + strings.Join(pkgs, ", ")
		}
	case errors.Is(err, os.ErrNotExist):
		c.Status, c.Message = corev1.ConditionFalse, r.cfg.SentinelFile+" absent"
	default:
		c.Status, c.Message = corev1.ConditionUnknown, "cannot tell whether "+r.cfg.SentinelFile+" exists: "+err.Error()
	}
	c.Message = capMessage(c.Message)
	return c
}

// runCommand runs the sentinel command in its own process group, killed
// with its children at the timeout.
func (r *Reboot) runCommand(ctx context.Context) (corev1.ConditionStatus, string) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, "/bin/sh", "-c", r.cfg.SentinelCommand)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	quoted := "`" + r.cfg.SentinelCommand + "`"
	var ee *exec.ExitError
	switch {
	case cctx.Err() != nil && ctx.Err() == nil:
		return corev1.ConditionUnknown, capMessage(fmt.Sprintf("%s did not finish within %s (killed)", quoted, r.cfg.CommandTimeout))
	case err == nil:
		return corev1.ConditionTrue, capMessage(quoted + " exited 0" + outputTail(out))
	case errors.As(err, &ee) && ee.ExitCode() > 0:
		return corev1.ConditionFalse, capMessage(fmt.Sprintf("%s exited %d", quoted, ee.ExitCode()))
	default:
		return corev1.ConditionUnknown, capMessage(quoted + " did not run: " + err.Error())
	}
}

// readPackages reads Debian's reboot-required.pkgs: one package a line,
// possibly repeated.
func readPackages(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	seen := map[string]bool{}
	var pkgs []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		p := strings.TrimSpace(s.Text())
		if p != "" && !seen[p] {
			seen[p] = true
			pkgs = append(pkgs, p)
		}
	}
	return pkgs
}

// outputTail is the command's last output line, if any, as a suffix.
func outputTail(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return ": " + last
	}
	return ""
}

func capMessage(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage-3] + "..."
}
