package hostops

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

// Defaults applied by NewReal to zero RealConfig fields.
const (
	DefaultRebootRequiredFile = "/run/reboot-required"
	DefaultWho                = "lifecycle-agent"
	DefaultSystemctl          = "systemctl"
	DefaultUnitTimeout        = 5 * time.Minute
	DefaultUnitPollInterval   = 2 * time.Second
	// DefaultPathEnv is the PATH of the commands Run starts.
	DefaultPathEnv = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Logind is what Real needs of *host.Logind.
type Logind interface {
	Inhibit(ctx context.Context, what, who, why, mode string) (*host.InhibitLock, error)
	Reboot(ctx context.Context) error
}

// Runner is what Real needs of *host.Runner.
type Runner interface {
	Run(ctx context.Context, c host.Cmd) (host.Result, error)
	RunTransient(ctx context.Context, u host.TransientUnit) (string, host.Result, error)
	UnitActive(ctx context.Context, unit string) (bool, error)
}

// RealConfig configures a Real.
type RealConfig struct {
	// Logind is the logind client (host.New). Required.
	Logind Logind
	// Runner runs commands. Nil: host.NewRunner with Logger.
	Runner Runner
	// Paths names the boot ID, os-release and kernel release files; the
	// zero value reads the real host.
	Paths host.Paths
	// RebootRequiredFile is the flag a package upgrade leaves when it
	// needs a reboot. Empty: DefaultRebootRequiredFile.
	RebootRequiredFile string
	// ReleaseLocks releases the agent's own shutdown delay lock (held for
	// the life of the process, STYLE rule 10). Reboot calls it before it
	// asks logind: logind would otherwise wait InhibitDelayMaxSec (5 s by
	// default, more where the kubelet raised it) for that very lock.
	// Nil: there is no such lock.
	ReleaseLocks func() error
	// RetakeLocks, when set, is called after logind refused a reboot, so
	// that the agent holds its delay lock again.
	RetakeLocks func(ctx context.Context) error
	// Who names the agent in the block locks it takes. Empty: DefaultWho.
	Who string
	// BaseEnv is the environment of every command Run starts, before the
	// caller's entries; the agent's own environment is never passed on.
	// Nil: DefaultPathEnv alone.
	BaseEnv []string
	// Systemctl is the systemctl binary used by StopUnits and StartUnits.
	// Empty: DefaultSystemctl, looked up in PATH.
	Systemctl string
	// UnitTimeout bounds one systemctl stop or start. Zero:
	// DefaultUnitTimeout.
	UnitTimeout time.Duration
	// UnitPollInterval paces RunTransient's wait for a still-active unit
	// of the same name. Zero: DefaultUnitPollInterval.
	UnitPollInterval time.Duration
	// Logger receives one line per host action. Nil discards.
	Logger *slog.Logger
	// Clock times the waits. Nil: the real clock.
	Clock clock.Clock
}

// Real performs host actions: logind over D-Bus, commands through the
// runner, facts from /proc and /etc. It is safe for concurrent use.
type Real struct {
	cfg    RealConfig
	log    *slog.Logger
	clock  clock.Clock
	runner Runner
	bootID string

	mu       sync.Mutex
	locks    map[*host.InhibitLock]struct{} // block locks handed out, not yet released
	bootTime time.Time                      // last read; BootTime's answer when a read fails
	btErr    string                         // last boot time read error logged, to log each only once
}

var _ drivers.HostOps = (*Real)(nil)

// NewReal checks cfg and reads the boot ID, which cannot change while the
// process lives: an unreadable boot ID is an error, since every reboot
// decision rests on it.
func NewReal(cfg RealConfig) (*Real, error) {
	if cfg.Logind == nil {
		return nil, errors.New("hostops: RealConfig.Logind is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Runner == nil {
		cfg.Runner = host.NewRunner(host.RunnerConfig{Logger: cfg.Logger})
	}
	if cfg.RebootRequiredFile == "" {
		cfg.RebootRequiredFile = DefaultRebootRequiredFile
	}
	if cfg.Who == "" {
		cfg.Who = DefaultWho
	}
	if cfg.BaseEnv == nil {
		cfg.BaseEnv = []string{DefaultPathEnv}
	}
	if cfg.Systemctl == "" {
		cfg.Systemctl = DefaultSystemctl
	}
	if cfg.UnitTimeout <= 0 {
		cfg.UnitTimeout = DefaultUnitTimeout
	}
	if cfg.UnitPollInterval <= 0 {
		cfg.UnitPollInterval = DefaultUnitPollInterval
	}
	id, err := cfg.Paths.BootID()
	if err != nil {
		return nil, fmt.Errorf("hostops: %w", err)
	}
	r := &Real{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, runner: cfg.Runner, bootID: id,
		locks: map[*host.InhibitLock]struct{}{}}
	r.BootTime() // read once now: logged here if it cannot be
	return r, nil
}

// BootID is this boot's ID, read once by NewReal.
func (r *Real) BootID() string { return r.bootID }

// BootTime is when this boot began (/proc/stat btime), read again at each
// call: a clock stepped after the boot moves it. A failed read returns the
// last one read (the zero time if none was: the readiness check then takes
// every pod's Ready as it reads) and logs the error once.
func (r *Real) BootTime() time.Time {
	bt, err := r.cfg.Paths.BootTime()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != r.btErr {
			r.btErr = msg
			r.log.Error("reading the boot time failed; using the last one", "boot_time", r.bootTime, "err", err)
		}
		return r.bootTime
	}
	r.btErr, r.bootTime = "", bt
	return bt
}

// Simulated is false.
func (r *Real) Simulated() bool { return false }

// Reboot releases the agent's own locks — its shutdown delay lock through
// ReleaseLocks, then every block lock Inhibit handed out and not yet
// released — and asks logind to reboot (Manager.Reboot(false)), returning
// logind's D-Bus error (*host.BusError) when it refuses; RetakeLocks then
// runs. A failed release is logged, not fatal: logind then waits at most
// InhibitDelayMaxSec. The caller calls Reboot only after the journal holds
// the reboot step's intent (the engine commits it before the step runs).
// Root's Reboot(false) ignores block inhibitors, so releasing our block
// locks is tidiness, not a precondition.
func (r *Real) Reboot(ctx context.Context) error {
	if r.cfg.ReleaseLocks != nil {
		if err := r.cfg.ReleaseLocks(); err != nil {
			r.log.Warn("releasing the agent's delay lock before the reboot failed; logind may wait InhibitDelayMaxSec", "err", err)
		}
	}
	r.releaseBlockLocks()
	r.log.Info("asking logind to reboot")
	if err := r.cfg.Logind.Reboot(ctx); err != nil {
		if r.cfg.RetakeLocks != nil {
			if rerr := r.cfg.RetakeLocks(ctx); rerr != nil {
				r.log.Error("re-taking the agent's delay lock after a refused reboot failed", "err", rerr)
			}
		}
		return fmt.Errorf("hostops: reboot: %w", err)
	}
	return nil
}

func (r *Real) releaseBlockLocks() {
	r.mu.Lock()
	locks := make([]*host.InhibitLock, 0, len(r.locks))
	for l := range r.locks {
		locks = append(locks, l)
	}
	clear(r.locks)
	r.mu.Unlock()
	for _, l := range locks {
		if err := l.Release(); err != nil {
			r.log.Warn("releasing a block lock before the reboot failed", "what", l.What, "err", err)
		} else {
			r.log.Info("block lock released before the reboot", "what", l.What)
		}
	}
}

// Inhibit takes a logind block lock on what. The returned release is safe
// to call more than once; Reboot releases a lock still held.
func (r *Real) Inhibit(ctx context.Context, what, why string) (func(), error) {
	lock, err := r.cfg.Logind.Inhibit(ctx, what, r.cfg.Who, why, host.ModeBlock)
	if err != nil {
		return nil, fmt.Errorf("hostops: %w", err)
	}
	r.mu.Lock()
	r.locks[lock] = struct{}{}
	r.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.locks, lock)
			r.mu.Unlock()
			if err := lock.Release(); err != nil {
				r.log.Error("releasing a block lock failed", "what", what, "err", err)
				return
			}
			r.log.Info("block lock released", "what", what)
		})
	}, nil
}

// OSRelease returns os-release's VERSION_ID and the kernel release.
func (r *Real) OSRelease() (string, string, error) {
	rel, err := r.cfg.Paths.OSRelease()
	if err != nil {
		return "", "", fmt.Errorf("hostops: %w", err)
	}
	kernel, err := r.cfg.Paths.KernelRelease()
	if err != nil {
		return "", "", fmt.Errorf("hostops: %w", err)
	}
	return rel.VersionID, kernel, nil
}

// RebootRequired reports whether RebootRequiredFile exists. A file that
// cannot be examined counts as present (a spare reboot is the safe error).
func (r *Real) RebootRequired() bool {
	_, err := os.Stat(r.cfg.RebootRequiredFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.log.Warn("cannot tell whether a reboot is required; assuming it is", "path", r.cfg.RebootRequiredFile, "err", err)
		return true
	}
	return err == nil
}

// Run runs argv as the agent's child (its own process group, a timeout,
// bounded output) with BaseEnv followed by env. A command that ran and
// failed returns a *CommandError with its exit status and output.
func (r *Real) Run(ctx context.Context, argv, env []string, timeout time.Duration) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("hostops: run: empty command")
	}
	full := append(append([]string{}, r.cfg.BaseEnv...), env...)
	res, err := r.runner.Run(ctx, host.Cmd{Path: argv[0], Args: argv[1:], Env: full, Timeout: timeout})
	r.log.Info("command run", "cmd", strings.Join(argv, " "), "exit_code", res.ExitCode)
	if err != nil {
		return string(res.Stdout), commandError(err)
	}
	return string(res.Stdout), nil
}

// RunTransient runs argv as the transient service unit (systemd-run --wait
// --collect), bounded by timeout both in the wait and in the unit itself
// (RuntimeMaxSec). env is the unit's environment on top of systemd's. A
// unit of that name still active — the agent restarted while it ran — is
// waited for first (until it ends, ctx ends or timeout passes), then argv
// runs again: profile commands are idempotent.
func (r *Real) RunTransient(ctx context.Context, unit string, argv, env []string, timeout time.Duration) error {
	if len(argv) == 0 {
		return fmt.Errorf("hostops: transient unit %s: empty command", unit)
	}
	if err := r.waitUnitGone(ctx, unit, timeout); err != nil {
		return err
	}
	r.log.Info("running transient unit", "unit", unit, "cmd", strings.Join(argv, " "), "timeout", timeout)
	name, res, err := r.runner.RunTransient(ctx, host.TransientUnit{
		Name:        unit,
		Description: "lifecycle-agent: " + argv[0],
		Cmd:         host.Cmd{Path: argv[0], Args: argv[1:], Env: env, Timeout: timeout},
		RuntimeMax:  timeout,
	})
	if err != nil {
		return commandError(err)
	}
	r.log.Info("transient unit finished", "unit", name, "exit_code", res.ExitCode)
	return nil
}

// UnitActive reports whether unit is active (systemctl is-active).
func (r *Real) UnitActive(ctx context.Context, unit string) (bool, error) {
	active, err := r.runner.UnitActive(ctx, unit)
	if err != nil {
		return false, fmt.Errorf("hostops: %w", err)
	}
	return active, nil
}

// waitUnitGone waits while unit is active.
func (r *Real) waitUnitGone(ctx context.Context, unit string, timeout time.Duration) error {
	active, err := r.runner.UnitActive(ctx, unit)
	if err != nil {
		return fmt.Errorf("hostops: %w", err)
	}
	if !active {
		return nil
	}
	r.log.Warn("a previous run of the transient unit is still active (the agent restarted during it); waiting for it to end", "unit", unit)
	deadline := r.clock.NewTimer(timeout)
	defer deadline.Stop()
	poll := r.clock.NewTimer(r.cfg.UnitPollInterval)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C():
			return fmt.Errorf("hostops: transient unit %s: a previous run is still active after %s", unit, timeout)
		case <-poll.C():
			poll.Reset(r.cfg.UnitPollInterval)
		}
		if active, err = r.runner.UnitActive(ctx, unit); err != nil {
			return fmt.Errorf("hostops: %w", err)
		}
		if !active {
			r.log.Info("the previous run of the transient unit ended", "unit", unit)
			return nil
		}
	}
}

// StopUnits runs systemctl stop on units.
func (r *Real) StopUnits(ctx context.Context, units ...string) error {
	return r.systemctl(ctx, "stop", units)
}

// StartUnits runs systemctl start on units.
func (r *Real) StartUnits(ctx context.Context, units ...string) error {
	return r.systemctl(ctx, "start", units)
}

func (r *Real) systemctl(ctx context.Context, verb string, units []string) error {
	if len(units) == 0 {
		return nil
	}
	args := append([]string{verb, "--"}, units...)
	r.log.Info("systemctl", "verb", verb, "units", strings.Join(units, " "))
	if _, err := r.runner.Run(ctx, host.Cmd{Path: r.cfg.Systemctl, Args: args, Timeout: r.cfg.UnitTimeout}); err != nil {
		return commandError(err)
	}
	return nil
}

// CommandError is a command that ran and failed. Its message is the
// runner's, which carries the output; ExitStatus is the exit status, or
// -1 when the command was killed or timed out (drivers.ExitStatusError).
type CommandError struct {
	Err    error
	Status int
}

func (e *CommandError) Error() string   { return "hostops: " + e.Err.Error() }
func (e *CommandError) Unwrap() error   { return e.Err }
func (e *CommandError) ExitStatus() int { return e.Status }

var _ drivers.ExitStatusError = (*CommandError)(nil)

// commandError wraps a runner error that carries an exit status; other
// errors (the command did not start) are only prefixed.
func commandError(err error) error {
	var ee *host.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("hostops: %w", err)
	}
	status := ee.ExitCode
	if ee.TimedOut || ee.Signal != "" {
		status = -1
	}
	return &CommandError{Err: err, Status: status}
}
