package drivers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// Parameters of the gpu-reset driver.
const (
	// GPUResetParamGPUs selects the GPUs: "all", a comma list of GPU UUIDs or
	// a comma list of NVML indices (devices.SelectGPUs). Required.
	GPUResetParamGPUs = "gpus"
	// GPUResetParamDrain drains the node first (cordon, evict, wait) when
	// "true"; the drain parameters (gracePeriodSeconds, deleteEmptyDirData,
	// podSelector) then apply. Default false.
	GPUResetParamDrain = "drain"
)

// Steps of the gpu-reset driver, in order. Drain's cordon, evict and
// wait-empty come right after gpuStepCheck with drain=true, and
// gpuStepUncordon last.
const (
	gpuStepCheck              = "check-gpus"
	gpuStepStopServices       = "stop-gpu-services"
	gpuStepPersistenceOff     = "persistence-off"
	gpuStepReset              = "gpu-reset"
	gpuStepRestorePersistence = "restore-persistence"
	gpuStepStartServices      = "start-gpu-services"
	gpuStepWaitFabric         = "wait-fabric"
	gpuStepVerify             = "verify-gpus"
	gpuStepUncordon           = "uncordon"
)

// Changes the gpu-reset driver records through Runtime.Own before making
// them. The Key always starts with the kind, so that two kinds never share a
// journal key even where the journal keeps only the key.
const (
	// changeGPUPersistence, key gpu-persistence/<uuid>: persistence mode was
	// on and the driver turned it off; undo: turn it on.
	changeGPUPersistence = "gpu-persistence"
	// changeGPUServices, key gpu-services/<event>: the driver stopped the
	// units of gpu.services; undo: start them.
	changeGPUServices = "gpu-services"
	// changeGPUResetIssued, key gpu-reset-issued/<event>: the reset call was
	// made (recorded right before it). It is the evidence the reset step's
	// Done check reads; nothing to undo, it is dropped after the reset step.
	changeGPUResetIssued = "gpu-reset-issued"
)

// Failpoints at the crash boundaries of the gpu-reset driver. Each is a
// gofail comment in the code (a crash test built with gofail kills the real
// binary there) and a call of GPUReset.Failpoint (unit tests stop the step
// there, as a crash would).
const (
	FailpointGPUResetBeforeStopUnits          = "gpuResetBeforeStopUnits"
	FailpointGPUResetBeforePersistenceOff     = "gpuResetBeforePersistenceOff"
	FailpointGPUResetBeforeInhibit            = "gpuResetBeforeInhibit"
	FailpointGPUResetBeforeRecord             = "gpuResetBeforeRecord"
	FailpointGPUResetBeforeRelease            = "gpuResetBeforeRelease"
	FailpointGPUResetBeforeRestorePersistence = "gpuResetBeforeRestorePersistence"
	FailpointGPUResetBeforeStartUnits         = "gpuResetBeforeStartUnits"
)

// GPUResetFailpoints lists every failpoint, in the order a run meets them.
var GPUResetFailpoints = []string{
	FailpointGPUResetBeforeStopUnits, FailpointGPUResetBeforePersistenceOff,
	FailpointGPUResetBeforeInhibit, FailpointGPUResetBeforeRecord, FailpointGPUResetBeforeRelease,
	FailpointGPUResetBeforeRestorePersistence, FailpointGPUResetBeforeStartUnits,
}

// GPUInhibit is what the reset step blocks while it runs.
const GPUInhibit = "shutdown:sleep"

// GPUReset is lifecycle-agent.x-k8s.io/gpu-reset: GPUResetStarted →
// GPUResetComplete. It resets NVIDIA GPUs of this node behind
// devices.Resetter (nvidia-smi --gpu-reset, or NVML's drain/remove/discover;
// Method chooses) with everything a reset needs around it.
//
// Parameters:
//
//	gpus    required: "all", GPU UUIDs, or NVML indices (comma lists, never
//	        mixed). Resolved to UUIDs against the inventory when the plan is
//	        made; a bad value fails the plan with ErrBadParameter naming
//	        parameters.gpus. The plan is made again when an interrupted
//	        event resumes, so indices are resolved again then: prefer UUIDs
//	        (indices shift only when a GPU drops off the bus).
//	drain   "true" drains the node first (drain's steps, parameters
//	        gracePeriodSeconds, deleteEmptyDirData, podSelector) and
//	        uncordons at the end what it cordoned. Default false: running
//	        compute or graphics processes then refuse the reset.
//
// Steps (every one journaled by the engine: intent, act, done):
//
//	check-gpus           resolve the selection, expand it to the reset group
//	                     (devices.ResetGroup: on a pre-Hopper NVSwitch system
//	                     such as DGX A100 every GPU), read the preconditions
//	                     and report them (Progress). Refuses on MIG enabled, a
//	                     lost GPU, unreadable modes or process lists, and —
//	                     without drain — running processes (naming GPU and
//	                     PIDs). Warns when a pre-Hopper NVSwitch system's
//	                     gpu.services lacks nvidia-fabricmanager. Changes
//	                     nothing.
//	cordon, evict,       drain=true only (DrainSteps).
//	wait-empty
//	stop-gpu-services    re-check every precondition (processes included),
//	                     record the change, stop Services (gpu.services: DCGM,
//	                     persistenced, device plugin…) through systemd in the
//	                     configured order.
//	persistence-off      per GPU of the group whose persistence mode is on:
//	                     record the change gpu-persistence/<uuid> (the journal
//	                     then holds the previous state), then turn it off.
//	gpu-reset            re-check every precondition, take the logind block
//	                     inhibitor "shutdown:sleep", record
//	                     gpu-reset-issued/<event>, reset the group in one
//	                     Resetter call, release the inhibitor.
//	restore-persistence  turn persistence back on where a gpu-persistence
//	                     change is recorded, then drop it.
//	start-gpu-services   start Services in reverse order; drop the change.
//	wait-fabric          re-resolve each GPU by UUID and wait until its
//	                     NVSwitch fabric registration is COMPLETED (Hopper+
//	                     on NVSwitch; returns at once where there is none).
//	verify-gpus          re-resolve each GPU by UUID and verify health
//	                     (devices.VerifyHealthy); fails naming the GPUs.
//	uncordon             drain=true only: uncordon if the cordon is ours.
//
// No double reset. The reset step's Done check (asked by the engine when a
// replay finds the step's intent but not its completion) answers "done" —
// do not reset again — when the boot ID differs from the intent's (a reboot
// resets every GPU), or when gpu-reset-issued/<event> is recorded: that
// record is committed right before the Resetter call, so without it the
// reset provably never started and it is safe to run it; with it, the reset
// may have run and is never repeated — the health verification that follows
// decides, and a GPU that still needs a reset fails the event (a new event
// resets it again). A crash between the record and the call is thus read
// as "maybe reset" and leads to verification, never to a second reset.
// Persistence mode is restored from the recorded changes, never from a
// re-read (which would see it off after our own step).
//
// What it undoes on failure or cancellation (Abort): persistence mode where
// recorded, the stopped services, the issued record, and the cordon if it
// is ours; the inhibitor is released when the step returns (or when the
// process dies). Failure modes, each failing the event with a message that
// names the GPUs: preconditions refused; the inhibitor cannot be taken; the
// Resetter fails (its error, carrying the UUID and nvidia-smi's output or
// the NVML return, is the message; services are restarted and persistence
// restored by Abort); the fabric does not register within
// devices.Config.FabricTimeout; a GPU is not visible or unhealthy after the
// reset.
//
// Simulate mode (HostOps.Simulated): every step runs and is journaled, the
// Resetter is built with DryRun (it logs what it would run), persistence
// mode is not written, and the health verification reports instead of
// failing. Services and the inhibitor are HostOps and so simulated there.
type GPUReset struct {
	// Devices is the agent's NVML manager (initialized). Plan fails when nil.
	Devices *devices.Manager
	// Method is gpu.resetMethod; "" means auto (nvidia-smi when on PATH).
	Method devices.ResetMethod
	// Services are the systemd units (gpu.services) stopped around a reset.
	Services []string
	// RetryDelay between PDB-refused evictions when drain=true.
	RetryDelay time.Duration
	// DrainTimeout bounds the drain's evictions (config drain.timeout).
	DrainTimeout time.Duration
	// SMITimeout bounds one nvidia-smi run; 0 means devices.DefaultSMITimeout.
	SMITimeout time.Duration
	// LookPath finds nvidia-smi for Method auto; nil means exec.LookPath.
	LookPath func(file string) (string, error)
	// Runner runs nvidia-smi; nil runs it through Runtime.Host().Run.
	Runner devices.CommandRunner
	// AfterReset, when set, is called with the reset group after a reset
	// took effect (the agent restarts its XID watcher: registrations die
	// with the handles).
	AfterReset func(uuids []string)
	// SMIPath is nvidia-smi on the host (gpu.nvidiaSMI; "" means auto:
	// DriverRoot's, else the one on PATH).
	SMIPath string
	// DriverRoot is gpu.driverRoot: with SMIPath "", a nvidia-smi under it
	// is run inside it (chroot), persistence mode included.
	DriverRoot string
	// Session pauses the agent's own NVML session and GPU monitor around
	// the reset; nil means the agent holds no GPU (tests, tools).
	Session GPUSession
	// Operator and the Operator* fields clear the GPU Operator's pods
	// (gpu.operator.*); Operator nil or no components: nothing is paused.
	Operator            GPUOperatorAPI
	OperatorComponents  []string
	OperatorLabelPrefix string        // "" means DefaultGPUOperatorLabelPrefix
	OperatorPausedValue string        // "" means DefaultGPUOperatorPausedValue
	OperatorPodTimeout  time.Duration // 0 means DefaultGPUOperatorPodTimeout
	OperatorPodPoll     time.Duration // 0 means DefaultGPUOperatorPodPoll
	// Clock drives the waits; nil means the real clock.
	Clock clock.Clock
	// Readiness is the checks before the uncordon of a reset with drain
	// (readiness.*): the device plugin's DaemonSet pod Ready again and
	// nvidia.com/gpu back to its count at claim, among others.
	Readiness Readiness
	// ProcRoot and DevRoot locate /proc and /dev for the holder scan (""
	// means the real ones).
	ProcRoot, DevRoot string
	// FindHolders replaces devices.FindHolders(ProcRoot, …) (tests).
	FindHolders func(paths []string) (devices.HolderScan, error)
	// Log; nil discards.
	Log *slog.Logger
	// Failpoint, when set, is called at each crash boundary with its name
	// (FailpointGPUReset*); a non-nil error stops the step there as if the
	// process had died. Tests only.
	Failpoint func(name string) error
}

func (GPUReset) Name() string       { return Prefix + "gpu-reset" }
func (GPUReset) Short() string      { return "gpu-reset" }
func (GPUReset) Start() string      { return "GPUResetStarted" }
func (GPUReset) End() string        { return "GPUResetComplete" }
func (GPUReset) SLA() time.Duration { return time.Hour }

// gpuResetPlan is one event's validated parameters and, once resolved at
// claim, its fixed plan.
type gpuResetPlan struct {
	d     GPUReset
	uuids []string // the selection, resolved to UUIDs, in index order
	drain bool
	o     apiclient.DrainOptions

	// From the resolved map (Resolve); resolved false: a plan made from raw
	// parameters, for validation only: its steps refuse to run.
	resolved bool
	group    []string
	services []string
	route    string
	labels   map[string]string
	all      bool
	count    int
	nvswitch bool
	whole    bool
}

func (d GPUReset) clock() clock.Clock {
	if d.Clock == nil {
		return clock.RealClock{}
	}
	return d.Clock
}

// Plan returns the steps (see GPUReset). Given the map Resolve fixed at
// claim, it reads the selection, group, route, services and labels from it
// and consults no live inventory (a replay never re-resolves). Given raw
// parameters it validates them against the inventory and returns steps
// that refuse to run (the engine always runs a resolved plan). The step
// list depends only on drain, so a replay gets the same list.
func (d GPUReset) Plan(m map[string]string) ([]Step, error) {
	var p *gpuResetPlan
	var err error
	if m[gpuResolvedVersion] == "1" {
		p, err = d.parseResolved(m)
	} else {
		p, err = d.parse(m)
	}
	if err != nil {
		return nil, err
	}
	run := func(f func(context.Context, Runtime) error) func(context.Context, Runtime) error {
		return func(ctx context.Context, rt Runtime) error {
			if !p.resolved {
				return errors.New("gpu-reset: the plan was not fixed at claim (drivers.Resolver); refusing to act on raw parameters")
			}
			return f(ctx, rt)
		}
	}
	steps := []Step{{Name: gpuStepCheck, Run: run(p.check)}}
	if p.drain {
		steps = append(steps, DrainSteps(p.o)...)
	}
	steps = append(steps,
		Step{Name: gpuStepPauseOperator, NeedsAPI: true, Disruptive: true, Run: run(p.pauseOperator)},
		Step{Name: gpuStepWaitOperator, NeedsAPI: true, Run: run(p.waitOperator)},
		Step{Name: gpuStepStopServices, Disruptive: true, Run: run(p.stopServices)},
		Step{Name: gpuStepPersistenceOff, Disruptive: true, Run: run(p.persistenceOff)},
		Step{Name: gpuStepReset, Disruptive: true, Run: run(p.reset), Done: p.resetDone},
		Step{Name: gpuStepRestorePersistence, Run: run(p.restorePersistence)},
		Step{Name: gpuStepStartServices, Run: run(p.startServices)},
		Step{Name: gpuStepWaitFabric, Run: run(p.waitFabric)},
		Step{Name: gpuStepVerify, Run: run(p.verify)},
		Step{Name: gpuStepRestoreOperator, NeedsAPI: true, Run: run(p.restoreOperator)},
	)
	if p.drain {
		steps = append(steps, d.Readiness.step(), Step{Name: gpuStepUncordon, NeedsAPI: true, Run: run(p.uncordon)})
	}
	return steps, nil
}

func (d GPUReset) parse(m map[string]string) (*gpuResetPlan, error) {
	o, err := DrainOptionsFrom(m, DrainTiming{d.RetryDelay, d.DrainTimeout}, append([]string{GPUResetParamGPUs, GPUResetParamDrain}, d.Readiness.params()...)...)
	errs := []error{err}
	p := &gpuResetPlan{d: d, o: o}
	if v, ok := m[GPUResetParamDrain]; ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: parameters.%s: %q is not true or false", ErrBadParameter, GPUResetParamDrain, v))
		}
		p.drain = b
	}
	if !p.drain {
		for _, k := range []string{"gracePeriodSeconds", "deleteEmptyDirData", "podSelector"} {
			if _, ok := m[k]; ok {
				errs = append(errs, fmt.Errorf("%w: parameters.%s applies only with parameters.drain=true", ErrBadParameter, k))
			}
		}
	}
	param := strings.TrimSpace(m[GPUResetParamGPUs])
	switch {
	case param == "":
		errs = append(errs, fmt.Errorf("%w: parameters.%s: required: %q, a comma list of GPU UUIDs or a comma list of indices",
			ErrBadParameter, GPUResetParamGPUs, "all"))
	case d.Devices == nil:
		errs = append(errs, errors.New("gpu-reset: no NVML on this node (the driver has no GPU manager)"))
	default:
		uuids, err := d.Devices.SelectGPUs(param)
		switch {
		case errors.Is(err, devices.ErrInvalidSelection):
			errs = append(errs, fmt.Errorf("%w: parameters.%s: %w", ErrBadParameter, GPUResetParamGPUs, err))
		case err != nil:
			errs = append(errs, fmt.Errorf("gpu-reset: reading the GPU inventory to resolve parameters.%s: %w", GPUResetParamGPUs, err))
		}
		p.uuids = uuids
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

func (d GPUReset) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d.Log
}

// failpoint is called at each crash boundary; see GPUReset.Failpoint.
func (d GPUReset) failpoint(name string) error {
	if d.Failpoint == nil {
		return nil
	}
	return d.Failpoint(name)
}

func gpuChange(kind, id string) Change { return Change{Kind: kind, Key: kind + "/" + id} }

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
	// Warnings do not refuse the reset but will likely make it fail, e.g.
	// Fabric Manager left running on a pre-Hopper NVSwitch system.
	Warnings []string
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
	return c, nil
}

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
	holders, err := p.blockingHolders(paths, os.Getpid())
	if err != nil {
		return err
	}
	if len(holders) > 0 {
		msg := "gpu-reset refused: processes hold the GPUs being reset: " + holderList(holders)
		rt.Progress(msg)
		return fmt.Errorf("%w: %s", devices.ErrPreconditions, strings.TrimPrefix(msg, "gpu-reset refused: "))
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
	if err := r.Reset(ctx, group); err != nil {
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
		rt.Progress("the node was not cordoned by this event; leaving it as it is")
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

// Abort undoes what the event recorded: persistence mode, the stopped
// services, the issued record, and the cordon if it is ours. It tries
// everything and returns every failure.
func (d GPUReset) Abort(ctx context.Context, rt Runtime) error {
	var errs []error
	plan, perr := d.parseResolved(rt.Params())
	if perr != nil {
		plan = &gpuResetPlan{d: d}
	}
	errs = append(errs, d.resumeSession(ctx, rt))
	if d.Devices != nil {
		errs = append(errs, d.rediscoverUnplugged(rt, plan.group))
		selected := plan.group
		if perr != nil {
			if u, err := d.Devices.SelectGPUs(rt.Params()[GPUResetParamGPUs]); err == nil {
				selected = u
			}
		}
		uuids, err := knownGPUs(d.Devices, selected)
		if err != nil {
			errs = append(errs, fmt.Errorf("gpu-reset: abort: listing GPUs: %w", err))
		}
		restored, err := plan.restoreRecorded(ctx, rt, uuids)
		errs = append(errs, err)
		if len(restored) > 0 {
			rt.Progress("abort: persistence mode restored on " + strings.Join(restored, ", "))
		}
	}
	if ch := gpuChange(changeGPUServices, rt.EventName()); rt.Owns(ch) {
		units := reversed(plan.services)
		if perr != nil {
			units = reversed(d.Services) // no plan to read: every configured unit
		}
		if err := rt.Host().StartUnits(ctx, units...); err != nil {
			errs = append(errs, fmt.Errorf("gpu-reset: abort: starting %s: %w", strings.Join(units, ", "), err))
		} else if err := rt.Disown(ch); err != nil {
			errs = append(errs, err)
		} else {
			rt.Progress("abort: started " + strings.Join(units, ", "))
		}
	}
	if ch := gpuChange(changeGPUResetIssued, rt.EventName()); rt.Owns(ch) {
		errs = append(errs, rt.Disown(ch))
	}
	if msg, err := d.restoreLabels(ctx, rt, plan.labels); err != nil {
		errs = append(errs, fmt.Errorf("gpu-reset: abort: %w", err))
	} else if msg != "" {
		rt.Progress("abort: " + msg)
	}
	if kept := CordonKept(rt.Node()); rt.Owns(kept) {
		// The readiness checks timed out with readiness.onTimeout
		// keepCordoned: the cordon stays for an admin (see Readiness).
		errs = append(errs, rt.Disown(Change{Kind: "cordon", Key: rt.Node()}), rt.Disown(kept))
		rt.Progress("abort: the node stays cordoned (readiness.onTimeout: keepCordoned)")
	} else if ch := (Change{Kind: "cordon", Key: rt.Node()}); rt.Owns(ch) {
		if _, err := rt.API().Uncordon(ctx, rt.EventName(), false); err != nil {
			errs = append(errs, fmt.Errorf("gpu-reset: abort: uncordon: %w", err))
		} else if err := rt.Disown(ch); err != nil {
			errs = append(errs, err)
		} else {
			rt.Progress("abort: node uncordoned")
		}
	}
	return errors.Join(errs...)
}
