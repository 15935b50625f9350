package drivers

// The gpu-reset checks: what a reset of the selection would meet (check-gpus,
// the re-check before each disruptive step, gpu reset --dry-run).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// GPUResetCheck is what the checks before a reset found. The gpu-reset
// steps use it; `lifecycle-agent gpu reset --dry-run` prints it.
type GPUResetCheck struct {
	// Requested is the selection resolved to UUIDs; Group what is reset
	// together (devices.ResetGroup).
	Requested []string
	Group     devices.Group
	// Preconditions for the group, as read now.
	Preconditions devices.PreconditionReport
	// Fabric is each group GPU's fabric registration, as read now.
	Fabric map[string]devices.Fabric
	// PersistenceOn lists the group GPUs whose persistence mode is on: it is
	// turned off before the reset and restored after it.
	PersistenceOn []string
	// Services are stopped in this order and started in reverse.
	Services []string
	// Drain: the node is drained first.
	Drain bool
	// Steps are the planned step names.
	Steps []string
	// Resetter says what the reset would run (devices.Describe).
	Resetter string
	// Blockers refuse the reset now. With Drain, running processes are
	// listed too: the drain is expected to end them.
	Blockers []string
	// Warnings do not refuse the reset but may make it fail, e.g. Fabric
	// Manager left running on a pre-Hopper NVSwitch system, or a GPU that
	// requires a reset and cannot list its processes.
	Warnings []string
	// Holders are the processes with a group GPU's device node open now,
	// other than the caller (its own NVML session): the running agent, which
	// lets go for the reset, the units of Services, the GPU Operator's
	// pods, and whatever else would refuse the reset at its step.
	Holders []devices.Holder
}

// inspect reads the group, its preconditions and fabric state. Read-only.
func (d GPUReset) inspect(uuids []string) (GPUResetCheck, error) {
	c := GPUResetCheck{Requested: uuids, Services: slices.Clone(d.Services), Fabric: map[string]devices.Fabric{}}
	g, err := d.Devices.ResetGroup(uuids)
	if err != nil {
		return c, fmt.Errorf("gpu-reset: reset group of %s: %w", strings.Join(uuids, ", "), err)
	}
	c.Group = g
	pre, err := d.Devices.Preconditions(g.UUIDs)
	if err != nil {
		return c, fmt.Errorf("gpu-reset: preconditions of %s: %w", strings.Join(g.UUIDs, ", "), err)
	}
	c.Preconditions = pre
	c.Blockers = pre.Blockers
	// A GPU that requires a reset cannot list its processes: the reset
	// step's scan of its device node's holders decides (devices.Preconditions).
	c.Warnings = append(c.Warnings, pre.Notes...)
	if pre.NVSwitch && pre.WholeSet && !slices.ContainsFunc(d.Services, func(u string) bool { return strings.Contains(u, "fabricmanager") }) {
		c.Warnings = append(c.Warnings, "pre-Hopper NVSwitch system: Fabric Manager must be stopped for the reset, "+
			"but gpu.services does not name nvidia-fabricmanager.service")
	}
	for _, gp := range pre.GPUs {
		if gp.Persistence == devices.TriTrue {
			c.PersistenceOn = append(c.PersistenceOn, gp.UUID)
		}
	}
	s, err := d.Devices.Snapshot()
	if err != nil {
		return c, fmt.Errorf("gpu-reset: reading the GPUs: %w", err)
	}
	for _, u := range g.UUIDs {
		if gi, ok := s.GPU(u); ok {
			c.Fabric[u] = gi.Fabric
		}
	}
	return c, nil
}

// Check runs the gpu-reset checks for params up to, not including, the
// reset — parameters, selection, reset group, preconditions, fabric read,
// the services it would stop and what the Resetter would run — and changes
// nothing: no unit, persistence mode or GPU is touched. Bad parameters
// return an error wrapping ErrBadParameter; refusals are in Blockers.
func (d GPUReset) Check(params map[string]string) (GPUResetCheck, error) {
	p, err := d.parse(params)
	if err != nil {
		return GPUResetCheck{}, err
	}
	c, err := d.inspect(p.uuids)
	if err != nil {
		return c, err
	}
	c.Drain = p.drain
	steps, err := d.Plan(params)
	if err != nil {
		return c, err
	}
	for _, s := range steps {
		c.Steps = append(c.Steps, s.Name)
	}
	// The route the claim would fix (gpu.resetMethod, gpu.nvidiaSMI and
	// the driver root, resolved now).
	route, err := d.route()
	if err != nil {
		return c, err
	}
	rc := devices.ResetterConfig{Method: devices.ResetMethodNVML, DryRun: true,
		Runner: func(context.Context, string, ...string) ([]byte, []byte, error) {
			return nil, nil, errors.New("gpu-reset: dry run: nothing runs")
		}}
	prefix := ""
	if path, ok := strings.CutPrefix(route, routeSMIPrefix); ok {
		rc.Method, rc.SMIPath = devices.ResetMethodSMI, path
	} else if root, ok := strings.CutPrefix(route, routeSMIRootPrefix); ok {
		rc.Method, rc.SMIPath, prefix = devices.ResetMethodSMI, "nvidia-smi", "chroot "+root+" "
	}
	r, err := d.Devices.NewResetter(rc)
	if err != nil {
		return c, err
	}
	c.Resetter = devices.Describe(r, c.Group.UUIDs)
	if prefix != "" {
		c.Resetter = strings.Replace(c.Resetter, "run ", "run "+prefix, 1)
	}
	paths, err := d.holderPaths(c.Group.UUIDs)
	if err != nil {
		return c, err
	}
	scan, err := d.findHolders(paths)
	if err != nil {
		return c, fmt.Errorf("gpu-reset: listing holders of %s: %w", strings.Join(paths, ", "), err)
	}
	self := os.Getpid()
	c.Holders = slices.DeleteFunc(scan.Holders, func(h devices.Holder) bool { return h.PID == self })
	if len(scan.Unreadable) > 0 {
		c.Warnings = append(c.Warnings, unreadableHolders(scan.Unreadable, c.Group.UUIDs)+
			"; the reset is refused if they still cannot be read when it runs")
	}
	return c, nil
}

// OperatorLabels reads the GPU Operator deploy labels that a reset would
// pause on this Node now (gpu.operator.*; the claim journals the same
// read), label → current value; none without Operator or components.
func (d GPUReset) OperatorLabels(ctx context.Context) (map[string]string, error) {
	return d.labelsToPause(ctx)
}

// PausedValue is the value OperatorLabels' labels would be set to.
func (d GPUReset) PausedValue() string { return d.pausedValue() }

// summary is the check step's status line.
func (c GPUResetCheck) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d GPU(s) selected", len(c.Requested))
	if c.Group.Expanded {
		fmt.Fprintf(&b, ", reset group expanded to %d: %s", len(c.Group.UUIDs), c.Group.Reason)
	}
	if c.Preconditions.NVSwitch {
		b.WriteString("; NVSwitch system")
	}
	if len(c.PersistenceOn) > 0 {
		fmt.Fprintf(&b, "; persistence mode on for %s (turned off for the reset and restored)", strings.Join(c.PersistenceOn, ", "))
	}
	if len(c.Services) > 0 {
		fmt.Fprintf(&b, "; will stop %s", strings.Join(c.Services, ", "))
	}
	return b.String()
}

// withoutProcesses drops the "processes running" blockers (drain=true: the
// drain is expected to end them; later steps check again).
func withoutProcesses(blockers []string) []string {
	var out []string
	for _, b := range blockers {
		if !strings.Contains(b, ": processes running (") {
			out = append(out, b)
		}
	}
	return out
}

func (p *gpuResetPlan) check(_ context.Context, rt Runtime) error {
	c, err := p.d.inspect(p.uuids)
	if err != nil {
		return err
	}
	blockers := c.Blockers
	if p.drain {
		blockers = withoutProcesses(blockers)
	}
	if len(blockers) > 0 {
		return p.refuse(rt, blockers)
	}
	msg := "preconditions met: " + c.summary()
	for _, w := range c.Warnings {
		msg += "; warning: " + w
	}
	if p.drain && len(c.Blockers) > 0 {
		msg += "; processes running now, draining first: " + strings.Join(c.Blockers, "; ")
	}
	rt.Progress(msg)
	return nil
}

// refuse reports blockers in the status and returns them as the error.
func (p *gpuResetPlan) refuse(rt Runtime, blockers []string) error {
	msg := "gpu-reset refused: " + strings.Join(blockers, "; ")
	if !p.drain && slices.ContainsFunc(blockers, func(b string) bool { return strings.Contains(b, ": processes running (") }) {
		msg += "; stop them, or set parameters.drain=true to drain the node first"
	}
	rt.Progress(msg)
	return fmt.Errorf("%w: %s", devices.ErrPreconditions, strings.TrimPrefix(msg, "gpu-reset refused: "))
}

// recheck reads the group's preconditions again, processes included, and
// refuses on any blocker (fail closed).
func (p *gpuResetPlan) recheck(rt Runtime) ([]string, error) {
	pre, err := p.d.Devices.Preconditions(p.group)
	if err != nil {
		return nil, fmt.Errorf("gpu-reset: preconditions of %s: %w", strings.Join(p.group, ", "), err)
	}
	if len(pre.Blockers) > 0 {
		return nil, p.refuse(rt, pre.Blockers)
	}
	return slices.Clone(p.group), nil
}
