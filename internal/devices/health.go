package devices

import (
	"fmt"
	"strings"
	"time"
)

// Node condition published from a HealthReport.
const (
	ConditionType = "GPUHealthy"

	ConditionTrue    = "True"
	ConditionFalse   = "False"
	ConditionUnknown = "Unknown"

	ReasonAllHealthy   = "AllHealthy"
	ReasonNoGPUs       = "NoGPUs"
	ReasonGPUUnhealthy = "GPUUnhealthy"
	ReasonNVMLError    = "NVMLError"

	// maxConditionMessage caps Condition.Message (bytes).
	maxConditionMessage = 1024
)

// Signal names used in GPUHealth.Reasons. XIDs appear as "XID <n>" and the
// recovery action as "RecoveryAction=<ACTION>".
const (
	SignalGPULost             = "GPULost"
	SignalResetRequired       = "ResetRequired"
	SignalNVMLReadFailed      = "NVMLReadFailed"
	SignalRetiredPagesPending = "RetiredPagesPending"
	SignalRemappedRowsPending = "RemappedRowsPending"
	SignalRemappedRowsFailure = "RemappedRowsFailure"
	SignalUncorrectableECC    = "UncorrectableECC"
	SignalFabricNotCompleted  = "FabricNotCompleted"
	SignalFabricFailed        = "FabricFailed"
)

// Names of signals that can be unknown, used in GPUHealth.Unknown.
const (
	SignalRetiredPages   = "RetiredPages"
	SignalRemappedRows   = "RemappedRows"
	SignalECC            = "ECC"
	SignalRecoveryAction = "RecoveryAction"
	SignalFabric         = "Fabric"
)

// GPUHealth is the verdict for one GPU.
type GPUHealth struct {
	Index   int
	UUID    string // empty when NVML could not name the GPU
	Healthy bool
	// Reasons name the failing signals in a fixed order, e.g.
	// ["RemappedRowsPending", "XID 79"].
	Reasons []string
	// Details are the read errors behind NVMLReadFailed.
	Details []string
	// Unknown names signals this GPU/driver does not support. Never unhealthy.
	Unknown []string
}

// Condition is a Node condition, free of k8s types.
type Condition struct {
	Type    string
	Status  string // True | False | Unknown
	Reason  string // CamelCase
	Message string
}

// HealthReport is the per-GPU verdict plus the GPUHealthy condition.
type HealthReport struct {
	At        time.Time
	GPUs      []GPUHealth
	Condition Condition
}

// Unhealthy returns the unhealthy entries.
func (r HealthReport) Unhealthy() []GPUHealth {
	var out []GPUHealth
	for _, g := range r.GPUs {
		if !g.Healthy {
			out = append(out, g)
		}
	}
	return out
}

// Health takes a Snapshot and evaluates it. When the snapshot itself fails
// the report carries Status Unknown / NVMLError and the error is returned.
func (m *Manager) Health() (HealthReport, error) {
	s, err := m.Snapshot()
	if err != nil {
		return HealthReport{
			At: m.clk.Now(),
			Condition: Condition{
				Type: ConditionType, Status: ConditionUnknown, Reason: ReasonNVMLError,
				Message: truncate(err.Error(), maxConditionMessage),
			},
		}, err
	}
	return Evaluate(s), nil
}

// Evaluate is the pure health rule. A GPU is unhealthy when any of these
// holds (Reasons, in this order):
//
//	GPULost              a read returned ERROR_GPU_IS_LOST (or no handle)
//	ResetRequired        a read returned ERROR_RESET_REQUIRED
//	NVMLReadFailed       a read failed with anything but NOT_SUPPORTED
//	RetiredPagesPending  dynamic page retirement waits for a reset
//	RemappedRowsPending  row remapping waits for a reset
//	RemappedRowsFailure  row remapping failed (service the GPU)
//	UncorrectableECC     volatile uncorrected ECC count > 0
//	RecoveryAction=X     field 230 says anything but NONE
//	FabricNotCompleted   NVSwitch system, fabric state is not COMPLETED
//	FabricFailed         fabric COMPLETED with a non-SUCCESS status
//	XID <n>              a non-ignored XID latched since the last reset
//
// A signal the driver does not support is listed in Unknown and never makes
// a GPU unhealthy.
func Evaluate(s Snapshot) HealthReport {
	r := HealthReport{At: s.At}
	for _, g := range s.GPUs {
		r.GPUs = append(r.GPUs, evaluateGPU(g, s.NVSwitch))
	}
	r.Condition = condition(r.GPUs)
	return r
}

func evaluateGPU(g GPUInfo, nvswitch bool) GPUHealth {
	h := GPUHealth{Index: g.Index, UUID: g.UUID}
	add := func(reason string) { h.Reasons = append(h.Reasons, reason) }

	if g.Lost || g.UUID == "" {
		add(SignalGPULost)
	}
	if g.ResetRequired {
		add(SignalResetRequired)
	}
	if len(g.ReadErrors) > 0 {
		add(SignalNVMLReadFailed)
		h.Details = append(h.Details, g.ReadErrors...)
	}
	switch g.RetiredPagesPending {
	case TriTrue:
		add(SignalRetiredPagesPending)
	case TriUnknown:
		h.Unknown = append(h.Unknown, SignalRetiredPages)
	}
	if g.RemappedRows.Known {
		if g.RemappedRows.Pending {
			add(SignalRemappedRowsPending)
		}
		if g.RemappedRows.Failure {
			add(SignalRemappedRowsFailure)
		}
	} else {
		h.Unknown = append(h.Unknown, SignalRemappedRows)
	}
	if g.ECC.Known {
		if g.ECC.VolatileUncorrected > 0 {
			add(SignalUncorrectableECC)
		}
	} else {
		h.Unknown = append(h.Unknown, SignalECC)
	}
	switch g.RecoveryAction {
	case RecoveryActionNone:
	case RecoveryActionUnknown:
		h.Unknown = append(h.Unknown, SignalRecoveryAction)
	default:
		add("RecoveryAction=" + g.RecoveryAction.String())
	}
	if nvswitch {
		switch {
		case !g.Fabric.Known || g.Fabric.State == FabricNotSupported:
			h.Unknown = append(h.Unknown, SignalFabric)
		case g.Fabric.State != FabricCompleted:
			add(SignalFabricNotCompleted)
		case g.Fabric.Status != "" && g.Fabric.Status != "SUCCESS":
			add(SignalFabricFailed)
		}
	}
	for _, x := range g.CriticalXIDs {
		add(xidSignal(x))
		h.Details = append(h.Details, xidDetail(x, ClassifyXID(x, nil)))
	}
	h.Healthy = len(h.Reasons) == 0
	return h
}

func condition(gpus []GPUHealth) Condition {
	c := Condition{Type: ConditionType}
	if len(gpus) == 0 {
		c.Status, c.Reason, c.Message = ConditionTrue, ReasonNoGPUs, "NVML reports no GPUs"
		return c
	}
	var bad []string
	unknown := map[string]int{}
	for _, g := range gpus {
		for _, u := range g.Unknown {
			unknown[u]++
		}
		if g.Healthy {
			continue
		}
		detail := strings.Join(g.Reasons, ", ")
		if len(g.Details) > 0 {
			detail += " (" + strings.Join(g.Details, "; ") + ")"
		}
		bad = append(bad, fmt.Sprintf("%s: %s", gpuLabel(g.UUID, g.Index), detail))
	}
	if len(bad) == 0 {
		c.Status, c.Reason = ConditionTrue, ReasonAllHealthy
		c.Message = fmt.Sprintf("%d GPUs healthy", len(gpus))
		if len(unknown) > 0 {
			var parts []string
			for _, name := range []string{SignalRetiredPages, SignalRemappedRows, SignalECC, SignalRecoveryAction, SignalFabric} {
				if n := unknown[name]; n > 0 {
					parts = append(parts, fmt.Sprintf("%s on %d", name, n))
				}
			}
			c.Message += "; not supported: " + strings.Join(parts, ", ")
		}
		return c
	}
	c.Status, c.Reason = ConditionFalse, ReasonGPUUnhealthy
	c.Message = truncate(fmt.Sprintf("%d of %d GPUs unhealthy: %s", len(bad), len(gpus), strings.Join(bad, "; ")), maxConditionMessage)
	return c
}

// gpuLabel names a GPU in messages: "GPU-… (index 3)" or "index 3".
func gpuLabel(uuid string, index int) string {
	if uuid == "" {
		return fmt.Sprintf("GPU at index %d", index)
	}
	return fmt.Sprintf("%s (index %d)", uuid, index)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const more = " …"
	cut := n - len(more)
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + more
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
