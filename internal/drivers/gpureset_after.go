package drivers

// After a gpu-reset: the fabric registration, the health verification and
// the uncordon.

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// visibleGroup is the plan's group, every GPU of which must be visible
// again; with gpus=all the GPU count must also equal the count at claim.
// It fails naming each missing GPU.
func (p *gpuResetPlan) visibleGroup() ([]string, error) {
	inv, err := p.d.Devices.List()
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: after the reset: %w", err)
	}
	var missing []string
	for _, u := range p.group {
		if !slices.ContainsFunc(inv, func(g devices.GPUInfo) bool { return g.UUID == u }) {
			missing = append(missing, u)
		}
	}
	switch {
	case len(missing) > 0:
		return nil, fmt.Errorf("gpu-reset: after the reset: %w: %s not visible to NVML (%d of %d GPUs seen at claim are back)",
			devices.ErrUnknownGPU, strings.Join(missing, ", "), len(p.group)-len(missing), len(p.group))
	case p.all && len(inv) != p.count:
		return nil, fmt.Errorf("gpu-reset: after the reset: %d GPUs visible, %d at claim", len(inv), p.count)
	}
	return slices.Clone(p.group), nil
}

func (p *gpuResetPlan) waitFabric(ctx context.Context, rt Runtime) error {
	group, err := p.visibleGroup()
	if err != nil {
		return err
	}
	s, err := p.d.Devices.Snapshot()
	if err != nil {
		return fmt.Errorf("gpu-reset: reading fabric state: %w", err)
	}
	if !s.NVSwitch {
		rt.Progress("no NVSwitch fabric: nothing to wait for")
		return nil
	}
	if !slices.ContainsFunc(group, func(u string) bool {
		g, ok := s.GPU(u)
		return !ok || (g.Fabric.Known && g.Fabric.State != devices.FabricNotSupported)
	}) {
		rt.Progress("NVSwitch system without per-GPU fabric registration (pre-Hopper): nothing to wait for")
		return nil
	}
	if rt.Host().Simulated() {
		rt.Progress("simulate: no reset happened; not waiting for fabric registration")
		return nil
	}
	rt.Progress(fmt.Sprintf("NVSwitch system: waiting for fabric registration of %d GPU(s)", len(group)))
	for _, u := range group {
		// By UUID: handles and indices changed. A GPU still re-enumerating
		// is polled again, not failed.
		if err := p.d.Devices.WaitFabricCompleted(ctx, u); err != nil {
			return fmt.Errorf("gpu-reset: %w", err)
		}
	}
	rt.Progress(fmt.Sprintf("fabric registration completed on %d GPU(s)", len(group)))
	return nil
}

func (p *gpuResetPlan) verify(_ context.Context, rt Runtime) error {
	group, err := p.visibleGroup()
	if err != nil {
		return err
	}
	var where []string
	for _, u := range group {
		g, err := p.d.Devices.ResolveByUUID(u)
		if err != nil {
			return fmt.Errorf("gpu-reset: re-resolving after the reset: %w", err)
		}
		where = append(where, fmt.Sprintf("%s (index %d, %s)", u, g.Index, g.PCIBusID))
	}
	if err := p.d.Devices.VerifyHealthy(group); err != nil {
		if rt.Host().Simulated() {
			rt.Progress("simulate: GPUs were not reset; health now: " + err.Error())
			return nil
		}
		return fmt.Errorf("gpu-reset: after the reset: %w", err)
	}
	rt.Progress(fmt.Sprintf("%d GPU(s) re-resolved by UUID and healthy: %s", len(group), strings.Join(where, ", ")))
	return nil
}

func (p *gpuResetPlan) uncordon(ctx context.Context, rt Runtime) error {
	ch := Change{Kind: "cordon", Key: rt.Node()}
	if !rt.Owns(ch) {
		rt.Progress(CordonLeft)
		return nil
	}
	if _, err := rt.API().Uncordon(ctx, rt.EventName(), false); err != nil {
		return err
	}
	if err := rt.Disown(ch); err != nil {
		return err
	}
	rt.Progress("node uncordoned")
	return nil
}
