package gpuhealth

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// Need is one kind of work the GPUs ask of the node.
type Need int

const (
	// NeedReset: a GPU reset recovers the GPU.
	NeedReset Need = iota
	// NeedReboot: only a reboot of the node recovers it.
	NeedReboot
	// NeedReplace: the GPU is failing and needs service (an RMA).
	NeedReplace
)

func (n Need) String() string {
	switch n {
	case NeedReset:
		return "reset"
	case NeedReboot:
		return "reboot"
	case NeedReplace:
		return "replacement"
	}
	return fmt.Sprintf("need%d", int(n))
}

// Reasons for the False and Unknown need conditions (True names the GPUs
// and causes, as GPUHealthy's False does).
const (
	ReasonNotRequired = "NotRequired"
	ReasonNoGPUs      = devices.ReasonNoGPUs
	ReasonNVMLError   = devices.ReasonNVMLError
)

// GPUNeed is one GPU's causes for one need, e.g. ["RecoveryAction_GPU_RESET",
// "RemappedRowsPending"].
type GPUNeed struct {
	Index  int
	UUID   string
	Causes []string
}

// Needs maps each need to the GPUs that have it, in snapshot order.
type Needs map[Need][]GPUNeed

// NeedsOf reads what each GPU of a snapshot asks for, following NVIDIA's
// guidance as devices classifies it:
//
//	reset        recovery action GPU_RESET or DRAIN_AND_RESET; a read that
//	             returned RESET_REQUIRED; a row remap or page retirement
//	             pending (they take effect at the next reset); a latched XID
//	             whose resolution is a reset (devices.ClassifyXID)
//	reboot       recovery action NODE_REBOOT or SYSTEM_REBOOT; the GPU lost
//	             (fallen off the bus); a latched XID whose resolution is a
//	             reboot (79, 62)
//	replacement  row remapping failed; a latched XID whose resolution is
//	             to replace the GPU (64)
//
// The other recovery actions (DRAIN_P2P, RECOVER_IMEX_DOMAIN, BUS_RESET)
// are fabric or platform work this agent has no driver for: they show in
// GPUHealthy only.
func NeedsOf(s devices.Snapshot) Needs {
	out := Needs{}
	for _, g := range s.GPUs {
		causes := map[Need][]string{}
		add := func(n Need, c string) { causes[n] = append(causes[n], c) }
		switch g.RecoveryAction {
		case devices.RecoveryActionGPUReset, devices.RecoveryActionDrainAndReset:
			add(NeedReset, "RecoveryAction_"+g.RecoveryAction.String())
		case devices.RecoveryActionNodeReboot, devices.RecoveryActionSystemReboot:
			add(NeedReboot, "RecoveryAction_"+g.RecoveryAction.String())
		}
		if g.ResetRequired {
			add(NeedReset, devices.SignalResetRequired)
		}
		if g.RemappedRows.Known && g.RemappedRows.Pending {
			add(NeedReset, devices.SignalRemappedRowsPending)
		}
		if g.RetiredPagesPending == devices.TriTrue {
			add(NeedReset, devices.SignalRetiredPagesPending)
		}
		if g.Lost || g.UUID == "" {
			add(NeedReboot, devices.SignalGPULost)
		}
		if g.RemappedRows.Known && g.RemappedRows.Failure {
			add(NeedReplace, devices.SignalRemappedRowsFailure)
		}
		for _, x := range g.CriticalXIDs {
			tok := fmt.Sprintf("XID%d", x)
			switch devices.ClassifyXID(x, nil) {
			case devices.XIDNeedsReset:
				add(NeedReset, tok)
			case devices.XIDNeedsReboot:
				add(NeedReboot, tok)
			case devices.XIDNeedsReplace:
				add(NeedReplace, tok)
			}
		}
		for n, c := range causes {
			out[n] = append(out[n], GPUNeed{Index: g.Index, UUID: g.UUID, Causes: c})
		}
	}
	return out
}

// NeedConditionTypes are the Node conditions the monitor writes for the
// reset and replacement needs; the reboot need goes to internal/needs'
// RebootRequired (RebootCause).
var NeedConditionTypes = map[Need]string{
	NeedReset:   v1alpha1.NodeConditionGPUResetRequired,
	NeedReplace: v1alpha1.NodeConditionGPUReplacementRequired,
}

// NeedCondition is the Node condition of a reset or replacement need:
//
//	True    GPU<index>:<Cause>[,…]   "1 of 8 GPUs needs a reset: GPU-… (index 3): RecoveryAction_GPU_RESET"
//	False   NotRequired | NoGPUs     "no GPU needs a reset (8 GPUs)"
//
// The True reason is capped like GPUHealthy's (MaxReasonLength, ",More").
// `kubectl lifecycle rollout gpu-reset --needs-gpu-reset` reads the
// indices back from it.
func NeedCondition(n Need, needs Needs, gpus int) apiclient.NodeCondition {
	c := apiclient.NodeCondition{Type: NeedConditionTypes[n]}
	list := needs[n]
	if len(list) == 0 {
		c.Status, c.Reason = corev1.ConditionFalse, ReasonNotRequired
		c.Message = fmt.Sprintf("no GPU needs a %s (%d GPUs)", n, gpus)
		if gpus == 0 {
			c.Reason, c.Message = ReasonNoGPUs, "NVML reports no GPUs"
		}
		return c
	}
	c.Status = corev1.ConditionTrue
	c.Reason, c.Message = describe(n, list, gpus)
	return c
}

// describe is the reason and message of a True need.
func describe(n Need, list []GPUNeed, gpus int) (reason, message string) {
	var parts, msgs []string
	for _, g := range list {
		for _, c := range g.Causes {
			parts = append(parts, fmt.Sprintf("GPU%d:%s", g.Index, c))
		}
		name := g.UUID
		if name == "" {
			name = "unnamed GPU"
		}
		msgs = append(msgs, fmt.Sprintf("%s (index %d): %s", name, g.Index, strings.Join(g.Causes, ", ")))
	}
	verb := "need"
	if len(list) == 1 {
		verb = "needs"
	}
	return capReason(parts), capMessage(fmt.Sprintf("%d of %d GPUs %s a %s: %s", len(list), gpus, verb, n, strings.Join(msgs, "; ")))
}

// NVMLUnknown is a need condition when the GPUs cannot be read.
func NVMLUnknown(n Need, err error) apiclient.NodeCondition {
	return apiclient.NodeCondition{Type: NeedConditionTypes[n], Status: corev1.ConditionUnknown,
		Reason: ReasonNVMLError, Message: capMessage(err.Error())}
}

// RebootCause is the GPUs' part of RebootRequired: empty when no GPU asks
// for a reboot, else the message naming them. internal/needs merges it
// with the sentinel's (reason GPURecoveryAction).
func RebootCause(needs Needs, gpus int) string {
	list := needs[NeedReboot]
	if len(list) == 0 {
		return ""
	}
	_, msg := describe(NeedReboot, list, gpus)
	return msg
}

func capMessage(s string) string {
	const max = 1024
	if len(s) <= max {
		return s
	}
	return s[:max-3] + "..."
}
