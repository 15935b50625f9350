package drivers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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

func (GPUReset) Name() string { return Prefix + "gpu-reset" }

func (GPUReset) Short() string { return "gpu-reset" }

func (GPUReset) Start() string { return "GPUResetStarted" }

func (GPUReset) End() string { return "GPUResetComplete" }

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
	// The node's workloads back — the GPU Operator's DaemonSet pods Ready
	// again after their labels were restored, nvidia.com/gpu at its count —
	// before the event says Succeeded (and before the uncordon of a drain).
	steps = append(steps, d.Readiness.step())
	if p.drain {
		steps = append(steps, Step{Name: gpuStepUncordon, NeedsAPI: true, UncordonsOwn: true, Run: run(p.uncordon)})
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
	if rt.Owns(CordonKept(rt.Node())) {
		// The readiness checks timed out with readiness.onTimeout
		// keepCordoned: the cordon stays for an admin (see Readiness).
		// The kept record stays (the engine drops it with the event): an
		// abort run again after a crash here leaves the cordon again.
		errs = append(errs, rt.Disown(Change{Kind: "cordon", Key: rt.Node()}))
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
