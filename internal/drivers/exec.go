package drivers

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

// DefaultExecStepTimeout applies to an exec step whose timeout is zero (the
// config's own default is 10m).
const DefaultExecStepTimeout = 10 * time.Minute

// ExecParamEnvPrefix starts the environment variable that carries an event
// parameter to an exec driver's commands: parameter fooBar becomes
// LIFECYCLE_PARAM_FOO_BAR.
const ExecParamEnvPrefix = "LIFECYCLE_PARAM_"

// ExitStatusError is implemented by a HostOps.Run error for a command that
// ran and exited: ExitStatus is its exit status, or -1 when it was killed
// or timed out. An exec step's check reads "not done yet" only from such an
// error with a positive status; any other error fails the step (fail
// closed: a check that cannot run proves nothing).
type ExitStatusError interface {
	error
	ExitStatus() int
}

// Exec is a vendor driver defined in local config (exec.drivers, DESIGN
// §3): its name (FullName), start and end states, sla and ordered steps
// come from the root-owned config file, never from the API.
//
// Steps: one per configured step, in order, each a command (argv, no
// shell) run as the agent's child (HostOps.Run) with the step's timeout.
// A step with a check command runs the check first, on every run and on
// replay (Step.Done): exit 0 means the step already took effect and is
// skipped; a positive exit status means it runs; a check that cannot run,
// is killed or times out fails the step. A step without a check must be
// idempotent: a replay runs it again. Every step counts as disruptive: an
// event with spec.disruption holds a budget slot before the first one.
// Under host.mode=simulate checks are not run (the simulated host would
// answer "done" to every one) and the commands are recorded, not run.
//
// Parameters: only those the config declares (exec.drivers[].params); any
// other is refused at Plan with ErrBadParameter naming it. They reach the
// commands only as environment variables, ExecParamEnvPrefix + the name in
// upper snake case (biosVersion → LIFECYCLE_PARAM_BIOS_VERSION), next to
// LIFECYCLE_DRIVER, LIFECYCLE_EVENT, LIFECYCLE_NODE and LIFECYCLE_STEP. A
// declared parameter the event leaves out is not set.
//
// Undone on abort (the engine's default): the cordon, if this event made
// one (exec drivers make none).
//
// Failure modes: a non-zero exit or a timeout fails the step and the event
// with the command's exit status and the tail of its output.
type Exec struct {
	def config.ExecDriver
	env map[string]string // declared parameter → environment variable
}

// NewExec checks an exec.drivers entry and returns its driver.
func NewExec(def config.ExecDriver) (*Exec, error) {
	full := def.FullName()
	if def.Start == "" || def.End == "" || def.Start == def.End {
		return nil, fmt.Errorf("drivers: exec driver %s: start %q and end %q must be set and differ", full, def.Start, def.End)
	}
	if len(def.Steps) == 0 {
		return nil, fmt.Errorf("drivers: exec driver %s: no steps", full)
	}
	seen := map[string]bool{}
	for _, s := range def.Steps {
		if s.Name == "" || seen[s.Name] {
			return nil, fmt.Errorf("drivers: exec driver %s: step name %q empty or repeated", full, s.Name)
		}
		seen[s.Name] = true
		if len(s.Command) == 0 || !filepath.IsAbs(s.Command[0]) {
			return nil, fmt.Errorf("drivers: exec driver %s: step %s: command %q: want a non-empty argv starting with an absolute path", full, s.Name, s.Command)
		}
		if len(s.Check) > 0 && !filepath.IsAbs(s.Check[0]) {
			return nil, fmt.Errorf("drivers: exec driver %s: step %s: check %q: want an argv starting with an absolute path", full, s.Name, s.Check)
		}
	}
	d := &Exec{def: def, env: map[string]string{}}
	byEnv := map[string]string{}
	for _, p := range def.Params {
		name := ExecParamEnvPrefix + upperSnake(p)
		if other, dup := byEnv[name]; dup {
			return nil, fmt.Errorf("drivers: exec driver %s: parameters %q and %q would both be passed as %s", full, other, p, name)
		}
		byEnv[name] = p
		d.env[p] = name
	}
	return d, nil
}

func (d *Exec) Name() string { return d.def.FullName() }

// Short is the name's last part: example.com/bios-update → bios-update.
func (d *Exec) Short() string {
	full := d.def.FullName()
	return full[strings.LastIndex(full, "/")+1:]
}

func (d *Exec) Start() string      { return d.def.Start }
func (d *Exec) End() string        { return d.def.End }
func (d *Exec) SLA() time.Duration { return d.def.SLA }

func (d *Exec) Plan(m map[string]string) ([]Step, error) {
	var errs []error
	declared := strings.Join(d.def.Params, ", ")
	if declared == "" {
		declared = "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	env := make([]string, 0, len(m))
	for _, k := range keys {
		name, ok := d.env[k]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%w: parameters.%s is not declared by exec driver %s (declared: %s)", ErrBadParameter, k, d.Name(), declared))
		case strings.IndexByte(m[k], 0) >= 0:
			errs = append(errs, fmt.Errorf("%w: parameters.%s contains a NUL byte", ErrBadParameter, k))
		default:
			env = append(env, name+"="+m[k])
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	steps := make([]Step, 0, len(d.def.Steps))
	for _, s := range d.def.Steps {
		st := Step{Name: s.Name, Disruptive: true, Run: func(ctx context.Context, rt Runtime) error {
			return d.run(ctx, rt, s, env)
		}}
		if len(s.Check) > 0 {
			st.Done = func(ctx context.Context, rt Runtime, _ string) (bool, error) {
				if rt.Host().Simulated() {
					return false, nil
				}
				return d.check(ctx, rt, s, d.stepEnv(rt, s, env))
			}
		}
		steps = append(steps, st)
	}
	return steps, nil
}

// stepEnv is the environment of a step's commands.
func (d *Exec) stepEnv(rt Runtime, s config.ExecStep, params []string) []string {
	return append([]string{
		"LIFECYCLE_DRIVER=" + d.Name(),
		"LIFECYCLE_EVENT=" + rt.EventName(),
		"LIFECYCLE_NODE=" + rt.Node(),
		"LIFECYCLE_STEP=" + s.Name,
	}, params...)
}

func (d *Exec) run(ctx context.Context, rt Runtime, s config.ExecStep, params []string) error {
	env := d.stepEnv(rt, s, params)
	if len(s.Check) > 0 && !rt.Host().Simulated() {
		done, err := d.check(ctx, rt, s, env)
		if err != nil {
			return err
		}
		if done {
			rt.Progress(fmt.Sprintf("step %s: check %s exited 0: already done, skipped", s.Name, s.Check[0]))
			return nil
		}
	}
	rt.Progress(fmt.Sprintf("step %s: running %s", s.Name, s.Command[0]))
	out, err := rt.Host().Run(ctx, s.Command, env, orDefault(s.Timeout, DefaultExecStepTimeout))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("command %s failed: %w", s.Command[0], err)
	}
	msg := fmt.Sprintf("step %s: %s succeeded", s.Name, s.Command[0])
	if last := lastLine(out); last != "" {
		msg += ": " + last
	}
	rt.Progress(msg)
	return nil
}

// check runs the step's check: exit 0 → done; a positive exit status → not
// done; anything else is an error.
func (d *Exec) check(ctx context.Context, rt Runtime, s config.ExecStep, env []string) (bool, error) {
	_, err := rt.Host().Run(ctx, s.Check, env, orDefault(s.Timeout, DefaultExecStepTimeout))
	if err == nil {
		return true, nil
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	var es ExitStatusError
	if errors.As(err, &es) && es.ExitStatus() > 0 {
		return false, nil
	}
	return false, fmt.Errorf("check %s could not tell whether step %s is done: %w", s.Check[0], s.Name, err)
}

// lastLine returns the last non-empty line of out, at most 200 bytes.
func lastLine(out string) string {
	out = strings.TrimSpace(out)
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = strings.TrimSpace(out[i+1:])
	}
	if len(out) > 200 {
		out = "…" + out[len(out)-200:]
	}
	return out
}

// upperSnake turns a parameter name (letters, digits, '_') into upper
// snake case: biosVersion → BIOS_VERSION, firmwareURL → FIRMWARE_URL,
// URLPath → URL_PATH, slot_2 → SLOT_2.
func upperSnake(s string) string {
	rs := []rune(s)
	var b strings.Builder
	for i, r := range rs {
		if i > 0 && unicode.IsUpper(r) {
			prev := rs[i-1]
			nextLower := i+1 < len(rs) && unicode.IsLower(rs[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}
