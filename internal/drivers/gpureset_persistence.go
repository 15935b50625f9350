package drivers

// Persistence mode around a gpu-reset: turned off where on (journaled first),
// restored after the reset or by the abort.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

func (p *gpuResetPlan) persistenceOff(ctx context.Context, rt Runtime) error {
	g := devices.Group{UUIDs: p.group}
	s, err := p.d.Devices.Snapshot()
	if err != nil {
		return fmt.Errorf("gpu-reset: reading persistence mode: %w", err)
	}
	sim := rt.Host().Simulated()
	var off []string
	for _, u := range g.UUIDs {
		gi, ok := s.GPU(u)
		if !ok {
			return fmt.Errorf("gpu-reset: %s: %w", u, devices.ErrUnknownGPU)
		}
		switch gi.Persistence {
		case devices.TriFalse:
			continue
		case devices.TriUnknown:
			return fmt.Errorf("gpu-reset: %s: persistence mode unreadable; refusing to reset (%s)", u, strings.Join(gi.ReadErrors, "; "))
		}
		// The record is the previous state: committed before the change,
		// so a replay (which would read "off") restores it anyway.
		if err := rt.Own(gpuChange(changeGPUPersistence, u)); err != nil {
			return err
		}
		// gofail: var gpuResetBeforePersistenceOff struct{}
		if err := p.d.failpoint(FailpointGPUResetBeforePersistenceOff); err != nil {
			return err
		}
		if sim {
			p.d.log().Info("simulate: would turn persistence mode off", "event", rt.EventName(), "gpu", u)
		} else if err := p.setPersistence(ctx, rt, u, false); err != nil {
			return fmt.Errorf("gpu-reset: turning persistence mode off: %w", err)
		}
		off = append(off, u)
	}
	switch {
	case len(off) == 0:
		rt.Progress("persistence mode already off on every GPU of the reset group")
	case sim:
		rt.Progress("simulate: would turn persistence mode off on " + strings.Join(off, ", ") + " (recorded for restore)")
	default:
		rt.Progress("persistence mode turned off on " + strings.Join(off, ", ") + " (recorded for restore)")
	}
	return nil
}

// setPersistence turns persistence mode of one GPU on or off: through
// nvidia-smi inside the driver root on that route (the driver container's
// nvidia-persistenced answers it and lets go of the GPU, as it does for
// `nvidia-smi -pm 0`; the host's NVML does not reach that daemon), else
// through NVML.
func (p *gpuResetPlan) setPersistence(ctx context.Context, rt Runtime, uuid string, on bool) error {
	if !strings.HasPrefix(p.route, routeSMIRootPrefix) {
		return p.d.Devices.SetPersistenceMode(uuid, on)
	}
	mode := "0"
	if on {
		mode = "1"
	}
	out, stderr, err := p.runner(rt)(ctx, "nvidia-smi", "-i", uuid, "-pm", mode)
	if err != nil {
		msg := strings.TrimSpace(string(out) + " " + string(stderr))
		return fmt.Errorf("%s: chroot %s nvidia-smi -i %s -pm %s: %w (%s)", uuid, strings.TrimPrefix(p.route, routeSMIRootPrefix), uuid, mode, err, msg)
	}
	p.d.log().Info("persistence mode set through the driver root's nvidia-smi", "gpu", uuid, "on", on, "route", p.route)
	return nil
}

// known lists the UUIDs a recorded change may name: the selection and
// every GPU NVML lists (the reset group may be wider than the selection).
func (p *gpuResetPlan) known() ([]string, error) {
	return knownGPUs(p.d.Devices, p.group)
}

func knownGPUs(m *devices.Manager, selected []string) ([]string, error) {
	out := slices.Clone(selected)
	inv, err := m.List()
	for _, g := range inv {
		if g.UUID != "" && !slices.Contains(out, g.UUID) {
			out = append(out, g.UUID)
		}
	}
	return out, err
}

// restoreRecorded turns persistence mode back on where a change is
// recorded, dropping each record after its GPU is restored.
func (p *gpuResetPlan) restoreRecorded(ctx context.Context, rt Runtime, uuids []string) ([]string, error) {
	d := p.d
	var restored []string
	var errs []error
	for _, u := range uuids {
		ch := gpuChange(changeGPUPersistence, u)
		if !rt.Owns(ch) {
			continue
		}
		if rt.Host().Simulated() {
			d.log().Info("simulate: would restore persistence mode", "event", rt.EventName(), "gpu", u)
		} else if err := p.setPersistence(ctx, rt, u, true); err != nil {
			errs = append(errs, fmt.Errorf("gpu-reset: restoring persistence mode: %w", err))
			continue
		}
		if err := rt.Disown(ch); err != nil {
			errs = append(errs, err)
			continue
		}
		restored = append(restored, u)
	}
	return restored, errors.Join(errs...)
}

func (p *gpuResetPlan) restorePersistence(ctx context.Context, rt Runtime) error {
	// After a crash inside the reset step: resume our session, bring back
	// what was unplugged.
	if err := p.d.resumeSession(ctx, rt); err != nil {
		return err
	}
	if err := p.d.rediscoverUnplugged(rt, p.group); err != nil {
		return err
	}
	// The reset step's done record is committed: its evidence can go.
	if err := rt.Disown(gpuChange(changeGPUResetIssued, rt.EventName())); err != nil {
		return err
	}
	// gofail: var gpuResetBeforeRestorePersistence struct{}
	if err := p.d.failpoint(FailpointGPUResetBeforeRestorePersistence); err != nil {
		return err
	}
	uuids, err := p.known()
	if err != nil {
		return fmt.Errorf("gpu-reset: listing GPUs to restore persistence mode: %w", err)
	}
	restored, err := p.restoreRecorded(ctx, rt, uuids)
	if err != nil {
		return err
	}
	switch {
	case len(restored) == 0:
		rt.Progress("no persistence mode to restore")
	case rt.Host().Simulated():
		rt.Progress("simulate: would restore persistence mode on " + strings.Join(restored, ", "))
	default:
		rt.Progress("persistence mode restored on " + strings.Join(restored, ", "))
	}
	return nil
}
