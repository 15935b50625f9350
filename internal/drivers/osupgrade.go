package drivers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

// Values of the os-upgrade driver's parameters.mode.
const (
	OSUpgradeModeProfile  = "profile"
	OSUpgradeModeExternal = "external"
)

// DefaultProfileTimeout applies to a profile whose timeout is zero (the
// config's own default is 1h).
const DefaultProfileTimeout = time.Hour

// OSUpgrade is lifecycle-agent.x-k8s.io/os-upgrade: OSUpgradeStarted →
// OSUpgradeComplete, for provisioning pipelines. The API names a profile,
// never a command: commands come only from the root-owned local config
// (osUpgrade.profiles).
//
// Steps, mode=profile (the default):
//   - cordon, evict, wait-empty: the drain (always).
//   - upgrade: runs the profile's command through HostOps.RunTransient, as
//     the transient unit lifecycle-os-upgrade-<event>.service, so that a
//     package upgrade that restarts the agent cannot kill it, while holding
//     a logind block inhibitor on "shutdown:sleep". The command gets the
//     environment LIFECYCLE_EVENT, LIFECYCLE_NODE, LIFECYCLE_PROFILE and,
//     when given, LIFECYCLE_TARGET_VERSION_ID and LIFECYCLE_TARGET_KERNEL.
//     It must be idempotent: a replay (an agent restart, a crash) runs it
//     again, after waiting for a still-running unit of the same name to
//     end. The block lock is released when the command has ended, just
//     before the engine journals the step done; a shutdown in that instant
//     makes a replay run the command once more.
//   - reboot (rebootPolicy always or if-required): as the reboot driver's
//     reboot step; with if-required it reboots only when the command left
//     /run/reboot-required (HostOps.RebootRequired). Not planned for never.
//   - verify: compares /etc/os-release VERSION_ID with targetVersionID and
//     the kernel release with targetKernel; a mismatch fails and names the
//     expected and the found value.
//   - wait-ready: as the reboot driver's (unless waitForReady=false).
//   - wait-workloads-ready: the readiness checks, as the reboot driver's.
//   - uncordon: lifts the cordon this event made, and only that one.
//
// Steps, mode=external: the drain; wait-reboot, which reports that the
// node is drained and waits for the provisioning pipeline to upgrade and
// reboot the node itself (done when the boot ID differs from the one
// journaled with the step's intent, that is on the replay after the boot;
// bounded only by the event's sla); then verify, wait-ready and uncordon.
//
// Parameters:
//
//	mode                profile (default) or external
//	profile             profile mode, required: a name from osUpgrade.profiles
//	targetVersionID     expected VERSION_ID of /etc/os-release after the upgrade
//	targetKernel        expected kernel release (uname -r) after the upgrade
//	waitForReady        bool, default true
//	rebootAttempts      profile mode: 1..10, default 3
//	gracePeriodSeconds, deleteEmptyDirData, podSelector: the drain's
//
// Undone on abort (the engine's default): the cordon, if this event made
// it. Nothing of the upgrade itself is undone.
//
// Failure modes: an unknown profile is refused at Plan with the list of
// configured profiles; a failing or timed-out command fails the step with
// its exit status and output (the full output is in journalctl -u <unit>);
// the reboot fails as the reboot driver's does; a target mismatch fails
// verify; in external mode a pipeline that never reboots the node runs into
// the event's sla.
type OSUpgrade struct {
	RebootConfig
	// Profiles are osUpgrade.profiles from the local config.
	Profiles map[string]config.OSUpgradeProfile
}

func (OSUpgrade) Name() string       { return Prefix + "os-upgrade" }
func (OSUpgrade) Short() string      { return "os-upgrade" }
func (OSUpgrade) Start() string      { return "OSUpgradeStarted" }
func (OSUpgrade) End() string        { return "OSUpgradeComplete" }
func (OSUpgrade) SLA() time.Duration { return 4 * time.Hour }

var osUpgradeParams = []string{"mode", "profile", "targetVersionID", "targetKernel", "waitForReady", "rebootAttempts"}

// unitPoll is how often Abort looks whether the upgrade unit still runs.
var unitPoll = 2 * time.Second

// Abort runs when an os-upgrade is cancelled, fails or runs out of sla.
// An upgrade is never killed half-way (a package manager stopped in the
// middle can leave the system unbootable): while its transient unit is
// still active, the node stays cordoned and the status says so; once the
// unit has ended (its RuntimeMaxSec, the profile's timeout, bounds it), the
// cordon this event made is undone, unless the readiness checks timed out
// with readiness.onTimeout keepCordoned. A unit whose state cannot be read keeps
// the node cordoned (fail closed) and the error is the abort's.
func (d OSUpgrade) Abort(ctx context.Context, rt Runtime) error {
	unit := OSUpgradeUnit(rt.EventName())
	said := false
	for {
		active, err := rt.Host().UnitActive(ctx, unit)
		if err != nil {
			return fmt.Errorf("cannot tell whether the upgrade unit %s still runs, so the node stays cordoned: %w", unit, err)
		}
		if !active {
			break
		}
		if !said {
			rt.Progress(fmt.Sprintf("stopping: the upgrade unit %s is still running and is never killed half-way; the node stays cordoned until it ends", unit))
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(unitPoll):
		}
	}
	cordon := Change{Kind: "cordon", Key: rt.Node()}
	owned := rt.Owns(cordon)
	if rt.Owns(CordonKept(rt.Node())) {
		// The readiness checks timed out with readiness.onTimeout
		// keepCordoned: the cordon stays for an admin (see Readiness), as
		// in the engine's own abort and gpu-reset's. The kept record
		// stays (the engine drops it with the event): an abort run again
		// after a crash here leaves the cordon again.
		if owned {
			if err := rt.Disown(cordon); err != nil {
				return err
			}
		}
		rt.Progress("stopping: the node stays cordoned (readiness.onTimeout: keepCordoned)")
		return nil
	}
	if _, err := rt.API().Uncordon(ctx, rt.EventName(), false); err != nil && !errors.Is(err, apiclient.ErrCordonNotOurs) {
		return err
	}
	if owned {
		return rt.Disown(cordon)
	}
	return nil
}

// OSUpgradeUnit is the transient unit an os-upgrade event runs its
// profile's command in; the idle agent looks at it before it undoes the
// leftover cordon of an upgrade whose abort could not.
func OSUpgradeUnit(event string) string { return transientUnitName("lifecycle-os-upgrade-", event) }

// profileNames lists the configured profiles, sorted, for messages.
func (d OSUpgrade) profileNames() string {
	if len(d.Profiles) == 0 {
		return "none (osUpgrade.profiles is empty)"
	}
	names := make([]string, 0, len(d.Profiles))
	for n := range d.Profiles {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// Resolve implements Resolver: the readiness snapshot at claim.
func (d OSUpgrade) Resolve(ctx context.Context, params map[string]string) (map[string]string, error) {
	return d.Readiness.resolve(ctx, params, nil)
}

func (d OSUpgrade) Plan(m map[string]string) ([]Step, error) {
	o, err := DrainOptionsFrom(m, DrainTiming{d.DrainRetryDelay, d.DrainTimeout}, append(osUpgradeParams, d.Readiness.params()...)...)
	if err != nil {
		return nil, err
	}
	if err := d.Readiness.validate(m); err != nil {
		return nil, err
	}
	p := newParams(pick(m, osUpgradeParams...), osUpgradeParams...)
	mode := p.str("mode", OSUpgradeModeProfile)
	waitReady := p.bool("waitForReady", true)
	attempts := p.int("rebootAttempts", DefaultRebootAttempts, 1, MaxRebootAttempts)
	t := target{versionID: p.str("targetVersionID", ""), kernel: p.str("targetKernel", "")}
	for _, k := range []string{"targetVersionID", "targetKernel"} {
		if v, ok := m[k]; ok && strings.TrimSpace(v) == "" {
			p.errs = append(p.errs, fmt.Errorf("%w: parameters.%s is empty; leave it out to skip that check", ErrBadParameter, k))
		}
	}
	var prof config.OSUpgradeProfile
	name, hasProfile := m["profile"]
	switch mode {
	case OSUpgradeModeProfile:
		var ok bool
		prof, ok = d.Profiles[name]
		switch {
		case !hasProfile:
			p.errs = append(p.errs, fmt.Errorf("%w: parameters.profile is required with mode=profile; configured profiles: %s", ErrBadParameter, d.profileNames()))
		case !ok:
			p.errs = append(p.errs, fmt.Errorf("%w: parameters.profile: unknown profile %q; configured profiles: %s", ErrBadParameter, name, d.profileNames()))
		case len(prof.Command) == 0:
			p.errs = append(p.errs, fmt.Errorf("%w: parameters.profile: profile %q has no command in the local config", ErrBadParameter, name))
		}
	case OSUpgradeModeExternal:
		for _, k := range []string{"profile", "rebootAttempts"} {
			if _, ok := m[k]; ok {
				p.errs = append(p.errs, fmt.Errorf("%w: parameters.%s applies only to mode=profile (in mode=external the pipeline reboots the node)", ErrBadParameter, k))
			}
		}
	default:
		p.errs = append(p.errs, fmt.Errorf("%w: parameters.mode: %q is not %s or %s", ErrBadParameter, mode, OSUpgradeModeProfile, OSUpgradeModeExternal))
	}
	if err := p.err(); err != nil {
		return nil, err
	}

	steps := DrainSteps(o)
	if mode == OSUpgradeModeExternal {
		steps = append(steps, d.waitRebootStep())
	} else {
		steps = append(steps, d.upgradeStep(name, prof, t))
		switch prof.RebootPolicy {
		case config.RebootNever:
		case config.RebootAlways:
			steps = append(steps, d.rebootStep("reboot", attempts, nil))
		default: // config.RebootIfRequired, the config's default
			steps = append(steps, d.rebootStep("reboot", attempts, func(rt Runtime) (bool, string) {
				if rt.Host().RebootRequired() {
					return true, ""
				}
				return false, fmt.Sprintf("profile %s: no reboot required (rebootPolicy %s, no /run/reboot-required)", name, config.RebootIfRequired)
			}))
		}
	}
	steps = append(steps, verifyStep(t))
	if waitReady {
		steps = append(steps, d.readyStep(), d.Readiness.step())
	}
	return append(steps, uncordonOursStep()), nil
}

// target is what verify expects after the upgrade; empty fields are not
// checked.
type target struct {
	versionID, kernel string
}

// upgradeStep runs the profile's command in a transient unit under a block
// inhibitor. Its replay (upgradeDone) tells an agent restart, in the same
// boot, from the node going down while the command ran.
func (d OSUpgrade) upgradeStep(name string, prof config.OSUpgradeProfile, t target) Step {
	return Step{Name: "upgrade", Disruptive: true, Done: func(ctx context.Context, rt Runtime, intentBootID string) (bool, error) {
		return upgradeDone(ctx, rt, intentBootID, name, prof, upgradeEnv(rt, name, t))
	}, Run: func(ctx context.Context, rt Runtime) error {
		h := rt.Host()
		unit := OSUpgradeUnit(rt.EventName())
		release, err := h.Inhibit(ctx, "shutdown:sleep", fmt.Sprintf("os-upgrade profile %s running (event %s)", name, rt.EventName()))
		if err != nil {
			return fmt.Errorf("take the block inhibitor before the upgrade: %w", err)
		}
		defer release()
		env := upgradeEnv(rt, name, t)
		timeout := orDefault(prof.Timeout, DefaultProfileTimeout)
		rt.Progress(fmt.Sprintf("running os-upgrade profile %s as %s (timeout %s)", name, unit, timeout))
		if err := h.RunTransient(ctx, unit, prof.Command, env, timeout); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("os-upgrade profile %s failed (journalctl -u %s has its output): %w", name, unit, err)
		}
		rt.Progress(fmt.Sprintf("os-upgrade profile %s finished", name))
		return nil
	}}
}

// upgradeEnv is the environment of the profile's command and check.
func upgradeEnv(rt Runtime, name string, t target) []string {
	env := []string{"LIFECYCLE_EVENT=" + rt.EventName(), "LIFECYCLE_NODE=" + rt.Node(), "LIFECYCLE_PROFILE=" + name}
	if t.versionID != "" {
		env = append(env, "LIFECYCLE_TARGET_VERSION_ID="+t.versionID)
	}
	if t.kernel != "" {
		env = append(env, "LIFECYCLE_TARGET_KERNEL="+t.kernel)
	}
	return env
}

// upgradeDone judges, on a replay, an upgrade whose intent was journaled
// and whose end was not. In the boot it started in the agent restarted:
// the command runs again (RunTransient first waits for the unit still
// running; a command is idempotent by contract). In a later boot the node
// went down while the command ran, which may have left it half done: the
// profile's check decides (exit 0: done; other exit: run again); without
// a check, or when it cannot run, the step fails (ErrUndecidable) rather
// than run the upgrade again blindly.
func upgradeDone(ctx context.Context, rt Runtime, intentBootID, name string, prof config.OSUpgradeProfile, env []string) (bool, error) {
	h := rt.Host()
	boot := h.BootID()
	if intentBootID == "" || intentBootID == boot {
		return false, nil
	}
	lost := fmt.Sprintf("the node went down while os-upgrade profile %s ran (boot %s, now %s)", name, short(intentBootID), short(boot))
	if len(prof.Check) == 0 {
		return false, fmt.Errorf("%w: %s; profile %s has no check (osUpgrade.profiles.%s.check), so the agent cannot tell whether the upgrade completed and does not run it again blindly: look at the node, then run the event again",
			ErrUndecidable, lost, name, name)
	}
	_, err := h.Run(ctx, prof.Check, env, orDefault(prof.Timeout, DefaultProfileTimeout))
	var es ExitStatusError
	switch {
	case err == nil:
		rt.Progress(lost + "; its check says the upgrade completed")
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case errors.As(err, &es) && es.ExitStatus() > 0:
		rt.Progress(fmt.Sprintf("%s; its check says the upgrade did not complete (exit %d): running it again", lost, es.ExitStatus()))
		return false, nil
	}
	return false, fmt.Errorf("%w: %s, and its check %s could not be run: %v", ErrUndecidable, lost, prof.Check[0], err)
}

// short is a boot ID's first 8 characters, as status lines show it.
func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// waitRebootStep is mode=external's wait for the pipeline's reboot.
func (d OSUpgrade) waitRebootStep() Step {
	return Step{
		Name:       "wait-reboot",
		Disruptive: true,
		Run: func(ctx context.Context, rt Runtime) error {
			h := rt.Host()
			before := h.BootID()
			rt.Progress(fmt.Sprintf("node drained; waiting for the provisioning pipeline to upgrade and reboot it (boot ID now %s)", before))
			for {
				changed, err := d.waitFor(ctx, time.Hour, func() bool { return h.BootID() != before })
				if err != nil {
					return err
				}
				if changed {
					rt.Progress(fmt.Sprintf("rebooted: boot ID %s → %s", before, h.BootID()))
					return nil
				}
			}
		},
		Done: BootChanged,
	}
}

// verifyStep checks the upgrade's target after the boot.
func verifyStep(t target) Step {
	return Step{Name: "verify", Run: func(ctx context.Context, rt Runtime) error {
		if t.versionID == "" && t.kernel == "" {
			rt.Progress("no targetVersionID or targetKernel given; nothing to verify")
			return nil
		}
		version, kernel, err := rt.Host().OSRelease()
		if err != nil {
			return fmt.Errorf("read the OS version to verify the upgrade: %w", err)
		}
		var bad []string
		if t.versionID != "" && version != t.versionID {
			bad = append(bad, fmt.Sprintf("/etc/os-release VERSION_ID is %q, expected %q (parameters.targetVersionID)", version, t.versionID))
		}
		if t.kernel != "" && kernel != t.kernel {
			bad = append(bad, fmt.Sprintf("the running kernel is %q, expected %q (parameters.targetKernel)", kernel, t.kernel))
		}
		if len(bad) > 0 {
			return errors.New("the upgrade did not reach its target: " + strings.Join(bad, "; "))
		}
		rt.Progress(fmt.Sprintf("upgrade verified: VERSION_ID %q, kernel %q", version, kernel))
		return nil
	}}
}

// transientUnitName makes a valid, bounded systemd service name from
// prefix and an event name (a DNS subdomain).
func transientUnitName(prefix, event string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range event {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	name := b.String()
	const max = 255 - len(".service")
	if len(name) > max {
		name = name[:max]
	}
	return name + ".service"
}
