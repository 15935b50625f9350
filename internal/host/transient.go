package host

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// TransientUnit is a command run as a transient systemd service.
//
// Why: a long host command (an OS upgrade) run as the agent's child lives
// in the agent's cgroup, so an agent restart (for example the upgrade
// restarting lifecycle-agent.service itself) kills it half way. Started
// with systemd-run it belongs to its own unit and survives: when the agent
// comes back, the unit is either still active (UnitActive) or gone, and the
// step's own check decides whether it worked. Its output goes to the
// journal (journalctl -u <unit>), not to the agent: --pipe is not used,
// because it would tie the command's stdio to the systemd-run process.
type TransientUnit struct {
	// Name of the unit; ".service" is appended when it has no suffix.
	// It should be unique per step and attempt, e.g.
	// "lifecycle-upgrade-<event uid>".
	Name string
	// Description is shown by systemctl status.
	Description string
	// Cmd is the command. Path should be absolute. Env becomes --setenv
	// (nil: systemd's default environment, not the agent's), Dir becomes
	// --working-directory, and Timeout bounds how long RunTransient waits
	// for systemd-run (zero: RunnerConfig.DefaultTimeout). A timeout ends
	// the wait; bound the unit itself with RuntimeMax.
	Cmd Cmd
	// RuntimeMax bounds the unit itself (RuntimeMaxSec=), so that it ends
	// even when nobody waits for it any more. Zero: no bound.
	RuntimeMax time.Duration
	// Properties are extra unit properties, one "Key=Value" each
	// (--property=).
	Properties []string
}

// RunTransient runs u through `systemd-run --unit=<name> --wait --collect`
// and waits for it with Runner.Run, so the result carries the unit's exit
// status and systemd-run's summary on stderr. It returns the full unit name
// even on error, so that the caller can journal it before acting and look
// for it after a restart.
func (r *Runner) RunTransient(ctx context.Context, u TransientUnit) (string, Result, error) {
	argv, unit, err := transientArgv(u)
	if err != nil {
		return unit, Result{ExitCode: -1}, fmt.Errorf("host: transient unit %q: %w", u.Name, err)
	}
	res, err := r.Run(ctx, Cmd{Path: r.cfg.SystemdRun, Args: argv, Timeout: u.Cmd.Timeout})
	if err != nil {
		return unit, res, fmt.Errorf("host: transient unit %s: %w", unit, err)
	}
	return unit, res, nil
}

// transientArgv builds systemd-run's arguments (without the program name)
// and returns the full unit name.
func transientArgv(u TransientUnit) ([]string, string, error) {
	unit, err := serviceUnitName(u.Name)
	if err != nil {
		return nil, unit, err
	}
	if u.Cmd.Path == "" {
		return nil, unit, fmt.Errorf("%w: empty command path", ErrInvalidArgument)
	}
	argv := []string{"--unit=" + unit, "--wait", "--collect", "--service-type=exec"}
	if u.Description != "" {
		argv = append(argv, "--description="+u.Description)
	}
	if u.Cmd.Dir != "" {
		argv = append(argv, "--working-directory="+u.Cmd.Dir)
	}
	for _, e := range u.Cmd.Env {
		if !strings.Contains(e, "=") {
			return nil, unit, fmt.Errorf("%w: environment entry %q is not KEY=VALUE", ErrInvalidArgument, e)
		}
		argv = append(argv, "--setenv="+e)
	}
	if u.RuntimeMax > 0 {
		argv = append(argv, fmt.Sprintf("--property=RuntimeMaxSec=%d", int64(math.Ceil(u.RuntimeMax.Seconds()))))
	}
	for _, p := range u.Properties {
		if !strings.Contains(p, "=") {
			return nil, unit, fmt.Errorf("%w: property %q is not Key=Value", ErrInvalidArgument, p)
		}
		argv = append(argv, "--property="+p)
	}
	argv = append(argv, "--", u.Cmd.Path)
	argv = append(argv, u.Cmd.Args...)
	return argv, unit, nil
}

// serviceUnitName validates name and appends ".service" if it has no
// suffix.
func serviceUnitName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty", ErrInvalidUnitName)
	}
	unit := name
	if !strings.HasSuffix(unit, ".service") {
		if strings.Contains(unit, ".") {
			return "", fmt.Errorf("%w: %q: only .service units can be run", ErrInvalidUnitName, name)
		}
		unit += ".service"
	}
	if len(unit) > 255 {
		return "", fmt.Errorf("%w: %q is longer than 255 bytes", ErrInvalidUnitName, name)
	}
	for _, r := range strings.TrimSuffix(unit, ".service") {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(":_.-@\\", r)) {
			return "", fmt.Errorf("%w: %q contains %q", ErrInvalidUnitName, name, r)
		}
	}
	return unit, nil
}

// UnitActive reports whether a unit is active or activating, using
// `systemctl is-active`. After an agent restart it tells whether a transient
// unit started by RunTransient is still running; a collected (finished)
// unit reports false.
func (r *Runner) UnitActive(ctx context.Context, unit string) (bool, error) {
	if _, err := serviceUnitName(unit); err != nil {
		return false, fmt.Errorf("host: unit active: %w", err)
	}
	res, err := r.Run(ctx, Cmd{Path: r.cfg.Systemctl, Args: []string{"is-active", "--quiet", unit}, Timeout: 30 * time.Second})
	if err == nil {
		return true, nil
	}
	var ee *ExitError
	// is-active exits 0 for active and reloading, 3 for any other state
	// (inactive, failed, activating) and 4 for a unit systemd does not know
	// (a collected one). Anything else (1: no bus) is an error: fail closed.
	if errors.As(err, &ee) && !ee.TimedOut && (res.ExitCode == 3 || res.ExitCode == 4) {
		return false, nil
	}
	return false, fmt.Errorf("host: unit active %s: %w", unit, err)
}
