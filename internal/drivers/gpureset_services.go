package drivers

// The systemd units (gpu.services) stopped before a gpu-reset and started
// after it.

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

func (p *gpuResetPlan) stopServices(ctx context.Context, rt Runtime) error {
	if _, err := p.recheck(rt); err != nil {
		return err
	}
	if len(p.services) == 0 {
		rt.Progress("no GPU service holds the GPUs being reset (of gpu.services); none stopped")
		return nil
	}
	if err := rt.Own(gpuChange(changeGPUServices, rt.EventName())); err != nil {
		return err
	}
	// gofail: var gpuResetBeforeStopUnits struct{}
	if err := p.d.failpoint(FailpointGPUResetBeforeStopUnits); err != nil {
		return err
	}
	if err := rt.Host().StopUnits(ctx, p.services...); err != nil {
		return fmt.Errorf("gpu-reset: stopping %s: %w", strings.Join(p.services, ", "), err)
	}
	rt.Progress("stopped " + strings.Join(p.services, ", "))
	return nil
}

func reversed(ss []string) []string {
	out := slices.Clone(ss)
	slices.Reverse(out)
	return out
}

func (p *gpuResetPlan) startServices(ctx context.Context, rt Runtime) error {
	if len(p.services) == 0 {
		return nil
	}
	// gofail: var gpuResetBeforeStartUnits struct{}
	if err := p.d.failpoint(FailpointGPUResetBeforeStartUnits); err != nil {
		return err
	}
	units := reversed(p.services)
	if err := rt.Host().StartUnits(ctx, units...); err != nil {
		return fmt.Errorf("gpu-reset: starting %s: %w", strings.Join(units, ", "), err)
	}
	if err := rt.Disown(gpuChange(changeGPUServices, rt.EventName())); err != nil {
		return err
	}
	rt.Progress("started " + strings.Join(units, ", "))
	return nil
}
