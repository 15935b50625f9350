package drivers

// The gpu-reset step itself: the route's runner and Resetter, the pause of the
// agent's own hold, the holder check, the inhibitor, the reset, and its
// replay check (no double reset).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// runner runs nvidia-smi: Runner, or the host's exec; on the driver-root
// route as `chroot <root> nvidia-smi …`.
func (p *gpuResetPlan) runner(rt Runtime) devices.CommandRunner {
	runner := p.d.Runner
	if runner == nil {
		timeout := p.d.SMITimeout
		if timeout == 0 {
			timeout = devices.DefaultSMITimeout
		}
		h := rt.Host()
		runner = func(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
			out, err := h.Run(ctx, append([]string{name}, args...), nil, timeout)
			return []byte(out), nil, err
		}
	}
	if root, ok := strings.CutPrefix(p.route, routeSMIRootPrefix); ok {
		inner := runner
		runner = func(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
			return inner(ctx, "chroot", append([]string{root, name}, args...)...)
		}
	}
	return runner
}

// resetter builds the configured Resetter; DryRun in simulate mode.
func (p *gpuResetPlan) resetter(rt Runtime) (devices.Resetter, error) {
	runner := p.runner(rt)
	cfg := devices.ResetterConfig{Method: devices.ResetMethodNVML, DryRun: rt.Host().Simulated(), Runner: runner, SMITimeout: p.d.SMITimeout,
		BeforeRemove: func(uuid string) error {
			// The unplug is journaled before it happens: a crash between
			// removal and rediscovery rediscovers on replay.
			return rt.Own(gpuChange(changeGPUUnplugged, uuid))
		}}
	if path, ok := strings.CutPrefix(p.route, routeSMIPrefix); ok {
		cfg.Method, cfg.SMIPath = devices.ResetMethodSMI, path
	} else if strings.HasPrefix(p.route, routeSMIRootPrefix) {
		cfg.Method, cfg.SMIPath = devices.ResetMethodSMI, "nvidia-smi" // run by runner in the root
	} else if p.route != routeNVML {
		return nil, fmt.Errorf("gpu-reset: unknown reset route %q in the plan", p.route)
	}
	return p.d.Devices.NewResetter(cfg)
}

func (p *gpuResetPlan) reset(ctx context.Context, rt Runtime) error {
	issued := gpuChange(changeGPUResetIssued, rt.EventName())
	if rt.Owns(issued) {
		// Only an in-process retry gets here (a replay asks resetDone first).
		rt.Progress("a reset was already issued for this event; not resetting again (the health check decides)")
		return nil
	}
	group, err := p.recheck(rt)
	if err != nil {
		return err
	}
	r, err := p.resetter(rt)
	if err != nil {
		return fmt.Errorf("gpu-reset: %w", err)
	}
	paths, err := p.d.holderPaths(group)
	if err != nil {
		return err
	}
	log := p.d.log().With("event", rt.EventName(), "step", gpuStepReset)

	// Our own hold on the GPUs goes first: the monitor's event set and
	// handles and, on the nvidia-smi route, the whole NVML session. The
	// record is committed before the pause; resumed below, or by the next
	// step or Abort after a crash.
	if p.d.Session != nil {
		if err := rt.Own(gpuChange(changeGPUSessionPaused, rt.EventName())); err != nil {
			return err
		}
		if err := p.d.Session.Pause(ctx, p.route != routeNVML); err != nil {
			return errors.Join(fmt.Errorf("gpu-reset: pausing the agent's NVML session and GPU monitor: %w", err), p.d.resumeSession(ctx, rt))
		}
		defer func() {
			if rerr := p.d.resumeSession(ctx, rt); rerr != nil {
				log.Error("resuming the agent's NVML session failed; the next step retries", "err", rerr)
			}
		}()
	}
	// Anyone still holding a node: the reset would be refused. Name them.
	holders, unreadable, err := p.blockingHolders(paths, os.Getpid())
	if err != nil {
		return err
	}
	var refused string
	switch {
	case len(unreadable) > 0:
		refused = unreadableHolders(unreadable, group)
	case len(holders) > 0:
		refused = "processes hold the GPUs being reset: " + holderList(holders)
	}
	if refused != "" {
		rt.Progress("gpu-reset refused: " + refused)
		return fmt.Errorf("%w: %s", devices.ErrPreconditions, refused)
	}

	// gofail: var gpuResetBeforeInhibit struct{}
	if err := p.d.failpoint(FailpointGPUResetBeforeInhibit); err != nil {
		return err
	}
	release, err := rt.Host().Inhibit(ctx, GPUInhibit, fmt.Sprintf("GPU reset of %s (event %s)", strings.Join(group, ", "), rt.EventName()))
	if err != nil {
		return fmt.Errorf("gpu-reset: taking the %s block inhibitor for the reset of %s: %w", GPUInhibit, strings.Join(group, ", "), err)
	}
	defer release()

	// gofail: var gpuResetBeforeRecord struct{}
	if err := p.d.failpoint(FailpointGPUResetBeforeRecord); err != nil {
		return err
	}
	// The evidence for resetDone: committed before the call, nothing in
	// between. From here on a replay reads "maybe reset" and never resets.
	if err := rt.Own(issued); err != nil {
		return err
	}
	plan := devices.Describe(r, group)
	if rt.Host().Simulated() {
		rt.Progress("simulate: would reset " + strings.Join(group, ", ") + ": " + plan)
	} else {
		rt.Progress("resetting " + strings.Join(group, ", ") + ": " + plan)
	}
	log.Info("resetting GPUs", "gpus", strings.Join(group, ","), "plan", plan, "simulate", rt.Host().Simulated())
	// Once begun, the reset is not interrupted: a cancel (the event
	// deleted), the event's deadline and the agent's stop take effect at
	// the next safe point, after it (DESIGN §2). Killed midway, nvidia-smi
	// can leave GPUs half reset, and a set on an NVSwitch fabric with its
	// Fabric Manager restarted over them. Its own timeout bounds it
	// (devices.DefaultSMITimeout on the nvidia-smi route). A stop waits
	// for it only as long as systemd does (TimeoutStopSec, 30 s; KillMode
	// mixed then kills nvidia-smi too): a reset takes seconds per GPU, and
	// the replay then reads "maybe reset" and lets verify-gpus decide.
	if err := r.Reset(context.WithoutCancel(ctx), group); err != nil {
		return fmt.Errorf("gpu-reset: reset of %s failed: %w", strings.Join(group, ", "), err)
	}
	// Rediscovered (the NVML route returns only then): the unplug records go.
	for _, u := range group {
		if ch := gpuChange(changeGPUUnplugged, u); rt.Owns(ch) {
			if err := rt.Disown(ch); err != nil {
				return err
			}
		}
	}
	if !rt.Host().Simulated() {
		p.d.Devices.ClearXIDs(group...)
	}
	// gofail: var gpuResetBeforeRelease struct{}
	if err := p.d.failpoint(FailpointGPUResetBeforeRelease); err != nil {
		return err
	}
	if !rt.Host().Simulated() {
		rt.Progress("reset " + strings.Join(group, ", "))
		if p.d.AfterReset != nil {
			p.d.AfterReset(group)
		}
	}
	return nil
}

// resetDone is the reset step's replay check; see GPUReset ("No double
// reset"). true means: do not reset again.
func (p *gpuResetPlan) resetDone(ctx context.Context, rt Runtime, intentBootID string) (bool, error) {
	if err := p.d.resumeSession(ctx, rt); err != nil {
		return false, err
	}
	if err := p.d.rediscoverUnplugged(rt, p.group); err != nil {
		return false, err
	}
	if intentBootID != "" && intentBootID != rt.BootID() {
		rt.Progress("the node rebooted since the reset step started (boot ID changed), which reset every GPU; not resetting again")
		return true, nil
	}
	if rt.Owns(gpuChange(changeGPUResetIssued, rt.EventName())) {
		rt.Progress("the agent stopped after the GPU reset was issued; not resetting again: the health check decides")
		return true, nil
	}
	return false, nil
}
