package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Defaults applied by NewRunner to zero RunnerConfig fields.
const (
	DefaultExecTimeout = 10 * time.Minute
	DefaultWaitDelay   = 5 * time.Second
	DefaultMaxOutput   = 64 << 10
	DefaultSystemdRun  = "systemd-run"
	DefaultSystemctl   = "systemctl"

	// errorOutputLimit bounds the output quoted in ExitError.Error.
	errorOutputLimit = 512
)

// RunnerConfig configures a Runner.
type RunnerConfig struct {
	// Logger receives one line per command. Nil discards.
	Logger *slog.Logger
	// DefaultTimeout applies to a Cmd whose Timeout is zero. Every command
	// has a timeout; zero here means DefaultExecTimeout.
	DefaultTimeout time.Duration
	// WaitDelay bounds how long Run waits, after the command was signalled
	// or exited, for its output pipes to close: a descendant that escaped
	// the process group and keeps stdout open cannot hang Run. Zero means
	// DefaultWaitDelay.
	WaitDelay time.Duration
	// MaxOutput caps the bytes kept of each of stdout and stderr; the head
	// and the tail are kept. Zero means DefaultMaxOutput.
	MaxOutput int
	// SystemdRun is the systemd-run binary used by RunTransient. Empty
	// means DefaultSystemdRun, looked up in PATH.
	SystemdRun string
	// Systemctl is the systemctl binary used by UnitActive. Empty means
	// DefaultSystemctl, looked up in PATH.
	Systemctl string
}

// Runner runs host commands with a timeout, a process group and bounded
// output capture. It is safe for concurrent use.
type Runner struct {
	cfg RunnerConfig
	log *slog.Logger
}

// NewRunner returns a Runner for cfg.
func NewRunner(cfg RunnerConfig) *Runner {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultExecTimeout
	}
	if cfg.WaitDelay <= 0 {
		cfg.WaitDelay = DefaultWaitDelay
	}
	if cfg.MaxOutput <= 0 {
		cfg.MaxOutput = DefaultMaxOutput
	}
	if cfg.SystemdRun == "" {
		cfg.SystemdRun = DefaultSystemdRun
	}
	if cfg.Systemctl == "" {
		cfg.Systemctl = DefaultSystemctl
	}
	return &Runner{cfg: cfg, log: cfg.Logger}
}

// Cmd is one command. Nothing from the API server may become a Cmd: commands
// come from root-owned local configuration only.
type Cmd struct {
	// Path is the program; without a slash it is looked up in PATH.
	Path string
	// Args are the arguments after the program name.
	Args []string
	// Env is the environment ("K=V"); nil inherits the agent's.
	Env []string
	// Dir is the working directory; empty means the agent's.
	Dir string
	// Timeout bounds the run; zero means RunnerConfig.DefaultTimeout.
	Timeout time.Duration
}

func (c Cmd) String() string {
	return strings.Join(append([]string{c.Path}, c.Args...), " ")
}

// Result is what a finished command left behind.
type Result struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// ExitError is returned by Run when the command did not exit with status 0:
// it failed, was killed, or timed out. It carries the captured output.
type ExitError struct {
	// Cmd is the command line, for messages.
	Cmd string
	// ExitCode is the exit status, or -1 when the command was killed by a
	// signal.
	ExitCode int
	// Signal names the signal that killed the command, if any.
	Signal string
	// Stdout and Stderr are the captured output, truncated in the middle
	// to RunnerConfig.MaxOutput bytes each.
	Stdout string
	Stderr string
	// TimedOut is set when the command ran past its timeout; the error then
	// matches ErrCommandTimeout and context.DeadlineExceeded.
	TimedOut bool
	// Timeout is the limit the command ran under.
	Timeout time.Duration
	// Err is the underlying cause (*exec.ExitError, a context error).
	Err error
}

func (e *ExitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "host: exec %q: ", e.Cmd)
	switch {
	case e.TimedOut:
		fmt.Fprintf(&b, "timed out after %s", e.Timeout)
	case errors.Is(e.Err, context.Canceled):
		b.WriteString("cancelled")
	case e.Signal != "":
		fmt.Fprintf(&b, "killed by signal %s", e.Signal)
	case e.ExitCode >= 0:
		fmt.Fprintf(&b, "exit code %d", e.ExitCode)
	default:
		fmt.Fprintf(&b, "%v", e.Err)
	}
	out, stream := e.Stderr, "stderr"
	if strings.TrimSpace(out) == "" {
		out, stream = e.Stdout, "stdout"
	}
	if out = strings.TrimSpace(out); out != "" {
		if len(out) > errorOutputLimit {
			out = "…" + out[len(out)-errorOutputLimit:]
		}
		fmt.Fprintf(&b, "; %s: %s", stream, out)
	}
	return b.String()
}

// Unwrap exposes ErrCommandTimeout (when TimedOut) and the cause.
func (e *ExitError) Unwrap() []error {
	if e.TimedOut {
		return []error{ErrCommandTimeout, e.Err}
	}
	return []error{e.Err}
}

// Run runs c and waits for it. The command gets its own process group; when
// the timeout passes or ctx ends, the whole group is sent SIGTERM, and
// SIGKILL once RunnerConfig.WaitDelay more has passed. A non-zero exit, a
// kill or a timeout is returned as *ExitError with the output; a command
// that cannot start is returned as a wrapped error. The Result is filled in
// either way.
func (r *Runner) Run(ctx context.Context, c Cmd) (Result, error) {
	if c.Path == "" {
		return Result{ExitCode: -1}, fmt.Errorf("host: exec: %w: empty path", ErrInvalidArgument)
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = r.cfg.DefaultTimeout
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	stdout := newCapBuffer(r.cfg.MaxOutput)
	stderr := newCapBuffer(r.cfg.MaxOutput)
	cmd := exec.CommandContext(tctx, c.Path, c.Args...)
	cmd.Env = c.Env
	cmd.Dir = c.Dir
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// The group id is the leader's pid (Setpgid); it stays reserved
		// while any member lives.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	cmd.WaitDelay = r.cfg.WaitDelay

	log := r.log.With("cmd", c.String())
	if err := cmd.Start(); err != nil {
		return Result{ExitCode: -1}, fmt.Errorf("host: exec %q: start: %w", c.String(), err)
	}
	waitErr := cmd.Wait()
	if tctx.Err() != nil {
		// Whatever of the group ignored SIGTERM goes now.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}

	res := Result{ExitCode: -1, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	ee := &ExitError{Cmd: c.String(), ExitCode: -1, Stdout: string(res.Stdout), Stderr: string(res.Stderr), Timeout: timeout, Err: waitErr}
	if ps := cmd.ProcessState; ps != nil {
		res.ExitCode = ps.ExitCode()
		ee.ExitCode = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			ee.Signal = ws.Signal().String()
		}
	}
	switch {
	case waitErr == nil:
		log.Debug("command succeeded")
		return res, nil
	case ctx.Err() != nil:
		ee.Err = fmt.Errorf("%w (%v)", ctx.Err(), waitErr)
	case tctx.Err() != nil:
		ee.TimedOut = true
		ee.Err = fmt.Errorf("%w (%v)", tctx.Err(), waitErr)
	case errors.Is(waitErr, exec.ErrWaitDelay) && res.ExitCode == 0:
		// The command succeeded but left a descendant holding its output;
		// WaitDelay closed the pipes. The exit status is what counts.
		log.Warn("command exited 0 but a descendant kept its output open; pipes closed", "wait_delay", r.cfg.WaitDelay)
		return res, nil
	}
	// The caller gets everything in the error and decides how loud to be.
	log.Debug("command failed", "exit_code", ee.ExitCode, "signal", ee.Signal, "timed_out", ee.TimedOut)
	return res, ee
}

// capBuffer keeps the first and the last max/2 bytes written to it.
type capBuffer struct {
	max     int
	head    []byte
	tail    []byte // ring of the last bytes, in order after compaction
	dropped int
}

func newCapBuffer(limit int) *capBuffer { return &capBuffer{max: limit} }

func (b *capBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.max/2 - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = append(b.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	keep := b.max - b.max/2
	b.tail = append(b.tail, p...)
	if over := len(b.tail) - keep; over > 0 {
		b.dropped += over
		b.tail = append(b.tail[:0], b.tail[over:]...)
	}
	return n, nil
}

// Bytes returns head, a truncation marker if bytes were dropped, and tail.
func (b *capBuffer) Bytes() []byte {
	var out bytes.Buffer
	out.Write(b.head)
	if b.dropped > 0 {
		fmt.Fprintf(&out, "\n…[%d bytes truncated]…\n", b.dropped)
	}
	out.Write(b.tail)
	return out.Bytes()
}
