package drivers

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// GPU Operator defaults (NVIDIA GPU Operator, state labels of its
// ClusterPolicy components; the operator deploys a component's DaemonSet
// on a node whose label nvidia.com/gpu.deploy.<component> is "true" and
// removes it when the label is "false").
const (
	DefaultGPUOperatorLabelPrefix = "nvidia.com/gpu.deploy."
	DefaultGPUOperatorPausedValue = "false"
	DefaultGPUOperatorPodTimeout  = 5 * time.Minute
	DefaultGPUOperatorPodPoll     = 2 * time.Second
)

// DefaultGPUOperatorComponents are the GPU Operator components that hold
// GPUs open and that a reset must clear: never "driver" (that would unload
// the driver) nor "container-toolkit".
func DefaultGPUOperatorComponents() []string {
	return []string{"device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "operator-validator", "mig-manager"}
}

// GPUOperatorAPI is what gpu-reset needs from the API to clear the GPU
// Operator's pods from this node (*apiclient.Client implements it).
type GPUOperatorAPI interface {
	// NodeLabels returns this Node's labels.
	NodeLabels(ctx context.Context) (map[string]string, error)
	// SetNodeLabels patches this Node's labels (a nil value removes one).
	SetNodeLabels(ctx context.Context, labels map[string]*string) error
	// PodsSelectingLabels lists the pods on this node, not finished, whose
	// spec.nodeSelector names one of keys: the DaemonSet pods that the
	// labels deploy.
	PodsSelectingLabels(ctx context.Context, keys []string) ([]string, error)
}

// GPUSession is the agent's own hold on the GPUs: its NVML session and the
// GPU health monitor (XID event set, device handles). The agent implements
// it (internal/agent/gpu.go).
type GPUSession interface {
	// Pause stops the health monitor's evaluations and its event watcher
	// and, when release is true, shuts NVML down in this process so that
	// no device node stays open. Idempotent.
	Pause(ctx context.Context, release bool) error
	// Resume initializes NVML again where released and restarts the
	// monitor. Idempotent; a no-op when not paused.
	Resume(ctx context.Context) error
}

// GPUSessionBlocker is what a GPUSession implements when it can say that
// no reset may be planned now (the agent's: the GPU Operator is replacing
// the driver); Resolve then refuses the event with that error.
type GPUSessionBlocker interface {
	Blocked() error
}

// Owned-change kinds of the holder steps (see changeGPU*).
const (
	// changeGPUOperatorLabels, key gpu-operator-labels/<event>: the deploy
	// labels of the plan were (maybe) set to the paused value; undo: set
	// them back to the values journaled in the plan.
	changeGPUOperatorLabels = "gpu-operator-labels"
	// changeGPUSessionPaused, key gpu-session-paused/<event>: the agent's
	// own NVML session and monitor were (maybe) paused; undo: resume. A
	// fresh process after a crash runs an unpaused monitor, and the next
	// step that finds the record resumes (a no-op) and drops it.
	changeGPUSessionPaused = "gpu-session-paused"
	// changeGPUUnplugged, key gpu-unplugged/<uuid>: the NVML route is
	// (maybe) removing this GPU from the bus; undo: rediscover.
	changeGPUUnplugged = "gpu-unplugged"
)

// Steps of the holder clearing.
const (
	gpuStepPauseOperator   = "pause-gpu-operator"
	gpuStepWaitOperator    = "wait-gpu-operator-pods"
	gpuStepRestoreOperator = "restore-gpu-operator"
)

func (p *gpuResetPlan) labelKeys() []string {
	keys := make([]string, 0, len(p.labels))
	for k := range p.labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// pauseOperator sets each planned deploy label to the paused value, after
// checking that it still has the value journaled at claim (refusing,
// without a change, when someone changed it since).
func (p *gpuResetPlan) pauseOperator(ctx context.Context, rt Runtime) error {
	if len(p.labels) == 0 {
		rt.Progress("no GPU Operator deploy labels to pause on this node")
		return nil
	}
	if p.d.Operator == nil {
		return fmt.Errorf("gpu-reset: the plan pauses GPU Operator labels %s but the driver has no API for them", strings.Join(p.labelKeys(), ", "))
	}
	have, err := p.d.Operator.NodeLabels(ctx)
	if err != nil {
		return fmt.Errorf("gpu-reset: reading the Node's labels: %w", err)
	}
	paused := p.d.pausedValue()
	set := map[string]*string{}
	for _, k := range p.labelKeys() {
		v, ok := have[k]
		switch {
		case ok && v == paused && rt.Owns(gpuChange(changeGPUOperatorLabels, rt.EventName())):
			continue // ours, from before a crash
		case !ok || v != p.labels[k]:
			return fmt.Errorf("gpu-reset: Node label %s is %q, not %q as when the event was claimed; refusing to change it (someone else manages it now)", k, v, p.labels[k])
		}
		set[k] = &paused
	}
	if err := rt.Own(gpuChange(changeGPUOperatorLabels, rt.EventName())); err != nil {
		return err
	}
	if len(set) > 0 {
		if err := p.d.Operator.SetNodeLabels(ctx, set); err != nil {
			return fmt.Errorf("gpu-reset: pausing GPU Operator components (%s=%s): %w", strings.Join(p.labelKeys(), ", "), paused, err)
		}
	}
	rt.Progress(fmt.Sprintf("GPU Operator components paused: %s set to %q (restored after the reset)", strings.Join(p.labelKeys(), ", "), paused))
	return nil
}

// waitOperator waits, on the injected clock, until no pod on this node
// selects a paused label.
func (p *gpuResetPlan) waitOperator(ctx context.Context, rt Runtime) error {
	if len(p.labels) == 0 || p.d.Operator == nil {
		return nil
	}
	keys := p.labelKeys()
	timeout, poll := p.d.OperatorPodTimeout, p.d.OperatorPodPoll
	if timeout == 0 {
		timeout = DefaultGPUOperatorPodTimeout
	}
	if poll == 0 {
		poll = DefaultGPUOperatorPodPoll
	}
	clk := p.d.clock()
	deadline := clk.Now().Add(timeout)
	for {
		left, err := p.d.Operator.PodsSelectingLabels(ctx, keys)
		if err != nil {
			return fmt.Errorf("gpu-reset: listing GPU Operator pods: %w", err)
		}
		if len(left) == 0 {
			rt.Progress("GPU Operator pods gone from the node")
			return nil
		}
		if !clk.Now().Before(deadline) {
			return fmt.Errorf("gpu-reset: GPU Operator pods still on the node after %s: %s", timeout, strings.Join(left, ", "))
		}
		rt.Progress(fmt.Sprintf("waiting for %d GPU Operator pod(s) to leave: %s", len(left), strings.Join(left, ", ")))
		t := clk.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}

// restoreLabels puts the planned labels back to their values at claim,
// leaving alone a label someone changed away from the paused value in
// between; it drops the record. Used by the restore step and Abort.
func (d GPUReset) restoreLabels(ctx context.Context, rt Runtime, labels map[string]string) (string, error) {
	ch := gpuChange(changeGPUOperatorLabels, rt.EventName())
	if !rt.Owns(ch) {
		return "", nil
	}
	if len(labels) > 0 {
		if d.Operator == nil {
			return "", fmt.Errorf("gpu-reset: cannot restore GPU Operator labels: no API")
		}
		have, err := d.Operator.NodeLabels(ctx)
		if err != nil {
			return "", fmt.Errorf("gpu-reset: reading the Node's labels: %w", err)
		}
		set := map[string]*string{}
		var skipped []string
		for k, v := range labels {
			switch cur, ok := have[k]; {
			case ok && cur == v:
			case ok && cur == d.pausedValue():
				set[k] = &v
			default:
				skipped = append(skipped, fmt.Sprintf("%s=%q", k, cur))
			}
		}
		if len(set) > 0 {
			if err := d.Operator.SetNodeLabels(ctx, set); err != nil {
				return "", fmt.Errorf("gpu-reset: restoring GPU Operator labels: %w", err)
			}
		}
		if err := rt.Disown(ch); err != nil {
			return "", err
		}
		msg := fmt.Sprintf("GPU Operator labels restored (%d)", len(set))
		if len(skipped) > 0 {
			sort.Strings(skipped)
			msg += "; left as changed by someone else: " + strings.Join(skipped, ", ")
		}
		return msg, nil
	}
	return "", rt.Disown(ch)
}

func (p *gpuResetPlan) restoreOperator(ctx context.Context, rt Runtime) error {
	msg, err := p.d.restoreLabels(ctx, rt, p.labels)
	if err != nil {
		return err
	}
	if msg == "" {
		msg = "no GPU Operator labels to restore"
	}
	rt.Progress(msg)
	return nil
}

// resumeSession resumes the agent's NVML session and monitor when the
// journal says they were paused, and drops the record.
func (d GPUReset) resumeSession(ctx context.Context, rt Runtime) error {
	ch := gpuChange(changeGPUSessionPaused, rt.EventName())
	if !rt.Owns(ch) {
		return nil
	}
	if d.Session != nil {
		if err := d.Session.Resume(ctx); err != nil {
			return fmt.Errorf("gpu-reset: resuming the agent's NVML session and GPU monitor: %w", err)
		}
	}
	return rt.Disown(ch)
}

// rediscoverUnplugged brings back GPUs the journal says the NVML route was
// removing when the agent stopped, then drops the records. It fails naming
// a GPU that does not come back.
func (d GPUReset) rediscoverUnplugged(rt Runtime, candidates []string) error {
	var unplugged []string
	for _, u := range candidates {
		if rt.Owns(gpuChange(changeGPUUnplugged, u)) {
			unplugged = append(unplugged, u)
		}
	}
	if len(unplugged) == 0 {
		return nil
	}
	if rt.Host().Simulated() {
		d.log().Info("simulate: would rediscover GPUs", "event", rt.EventName(), "gpus", strings.Join(unplugged, ","))
	} else if err := d.Devices.Rediscover(unplugged); err != nil {
		return fmt.Errorf("gpu-reset: rediscovering %s after an interrupted unplug: %w", strings.Join(unplugged, ", "), err)
	}
	for _, u := range unplugged {
		if err := rt.Disown(gpuChange(changeGPUUnplugged, u)); err != nil {
			return err
		}
	}
	rt.Progress("rediscovered " + strings.Join(unplugged, ", ") + " (unplugged when the agent stopped)")
	return nil
}

// blockingHolders lists the holders a reset of the group would be refused
// on: every process with a group GPU's node open, except Fabric Manager on
// a Hopper+ NVSwitch system (reset with it running) and, on the NVML route,
// this process (NVML performs the reset itself). unreadable lists the
// processes whose open files could not be read: they may hold a node
// unseen, and for a GPU that requires a reset (its process lists
// unreadable) this scan is the only check left, so they refuse the reset
// too.
func (p *gpuResetPlan) blockingHolders(paths []string, self int) (holders []devices.Holder, unreadable []int, err error) {
	scan, err := p.d.findHolders(paths)
	if err != nil {
		return nil, nil, fmt.Errorf("gpu-reset: listing holders of %s: %w", strings.Join(paths, ", "), err)
	}
	return slices.DeleteFunc(scan.Holders, func(h devices.Holder) bool {
		return (p.nvswitch && !p.whole && isFabricManagerHolder(h)) || (p.route == routeNVML && h.PID == self)
	}), scan.Unreadable, nil
}

// unreadableHolders says which processes' open files the holder scan could
// not read while looking for holders of the group's GPUs.
func unreadableHolders(pids []int, group []string) string {
	s := make([]string, len(pids))
	for i, pid := range pids {
		s[i] = strconv.Itoa(pid)
	}
	return "the open files of PIDs " + strings.Join(s, ", ") +
		" could not be read (permission denied), so whether they hold " + strings.Join(group, ", ") + " is unknown"
}

func holderList(hs []devices.Holder) string {
	s := make([]string, len(hs))
	for i, h := range hs {
		s[i] = h.String()
	}
	return strings.Join(s, "; ")
}
