package devices

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestHealth(t *testing.T) {
	tests := []struct {
		name        string
		arch        arch
		gpu         int // GPU whose state mod changes
		mod         func(*gpuState)
		xid         uint64 // latched on gpu when non-zero
		wantStatus  string
		wantReason  string
		wantReasons []string // for gpu
		wantUnknown []string // for gpu
		wantMsg     []string // substrings; "{uuid}" is replaced by gpu's UUID
	}{
		{
			name: "healthy H100 fleet", arch: archH100, gpu: 0, mod: func(*gpuState) {},
			wantStatus: ConditionTrue, wantReason: ReasonAllHealthy,
			wantMsg: []string{"8 GPUs healthy"},
		},
		{
			name: "healthy A100 fleet, fabric unknown", arch: archA100, gpu: 0, mod: func(*gpuState) {},
			wantStatus: ConditionTrue, wantReason: ReasonAllHealthy, wantUnknown: []string{SignalFabric},
			wantMsg: []string{"8 GPUs healthy", "not supported: Fabric on 8"},
		},
		{
			name: "remapped rows pending", arch: archH100, gpu: 3, mod: func(g *gpuState) { g.remapPending = true },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{SignalRemappedRowsPending},
			wantMsg: []string{"1 of 8 GPUs unhealthy", "{uuid} (index 3): RemappedRowsPending"},
		},
		{
			name: "retired pages pending and remap failure", arch: archA100, gpu: 1,
			mod:        func(g *gpuState) { g.retiredPending = nvml.FEATURE_ENABLED; g.remapFailure = true },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy,
			wantReasons: []string{SignalRetiredPagesPending, SignalRemappedRowsFailure}, wantUnknown: []string{SignalFabric},
			wantMsg: []string{"{uuid} (index 1): RetiredPagesPending, RemappedRowsFailure"},
		},
		{
			name: "uncorrectable ECC", arch: archH100, gpu: 7, mod: func(g *gpuState) { g.eccUnc = 2; g.eccCor = 100 },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{SignalUncorrectableECC},
		},
		{
			name: "corrected ECC only is healthy", arch: archH100, gpu: 7, mod: func(g *gpuState) { g.eccCor = 100 },
			wantStatus: ConditionTrue, wantReason: ReasonAllHealthy,
		},
		{
			name: "recovery action GPU reset", arch: archH100, gpu: 5,
			mod:        func(g *gpuState) { g.recovery = uint32(nvml.GPU_RECOVERY_ACTION_GPU_RESET) },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{"RecoveryAction=GPU_RESET"},
			wantMsg: []string{"{uuid} (index 5): RecoveryAction=GPU_RESET"},
		},
		{
			name: "recovery action not supported is unknown", arch: archH100, gpu: 5,
			mod:        func(g *gpuState) { g.recoveryRet = nvml.ERROR_NOT_SUPPORTED },
			wantStatus: ConditionTrue, wantReason: ReasonAllHealthy, wantUnknown: []string{SignalRecoveryAction},
			wantMsg: []string{"not supported: RecoveryAction on 1"},
		},
		{
			name: "all signals not supported is healthy", arch: archH100, gpu: 2,
			mod: func(g *gpuState) {
				g.remapRet, g.eccRet, g.retiredRet, g.recoveryRet = nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
				g.fabricRet = nvml.ERROR_NOT_SUPPORTED
			},
			wantStatus: ConditionTrue, wantReason: ReasonAllHealthy,
			wantUnknown: []string{SignalRetiredPages, SignalRemappedRows, SignalECC, SignalRecoveryAction, SignalFabric},
		},
		{
			name: "fabric not completed on H100", arch: archH100, gpu: 6,
			mod:        func(g *gpuState) { g.fabricState = nvml.GPU_FABRIC_STATE_IN_PROGRESS },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{SignalFabricNotCompleted},
		},
		{
			name: "fabric completed with error", arch: archH100, gpu: 6,
			mod:        func(g *gpuState) { g.fabricStatus = nvml.ERROR_UNKNOWN },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{SignalFabricFailed},
		},
		{
			name: "latched XID 79", arch: archH100, gpu: 4, mod: func(*gpuState) {}, xid: 79,
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{"XID 79"},
			wantMsg: []string{"{uuid} (index 4): XID 79"},
		},
		{
			name: "read error fails closed", arch: archH100, gpu: 0, mod: func(g *gpuState) { g.eccRet = nvml.ERROR_UNKNOWN },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{SignalNVMLReadFailed},
			wantUnknown: []string{SignalECC},
			wantMsg:     []string{"NVMLReadFailed (GetTotalEccErrors(uncorrected): ERROR_UNKNOWN; GetTotalEccErrors(corrected): ERROR_UNKNOWN)"},
		},
		{
			name: "lost GPU", arch: archH100, gpu: 2, mod: func(g *gpuState) { g.lostUUID = true },
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, wantReasons: []string{SignalGPULost},
			wantMsg: []string{"GPU at index 2: GPULost"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.arch)
			f.set(tc.gpu, tc.mod)
			m, _ := newTestManager(t, f)
			if tc.xid != 0 {
				m.latchXID(f.uuid(tc.gpu), tc.xid)
			}
			r, err := m.Health()
			if err != nil {
				t.Fatalf("Health: %v", err)
			}
			c := r.Condition
			if c.Type != ConditionType || c.Status != tc.wantStatus || c.Reason != tc.wantReason {
				t.Errorf("condition = %+v, want %s/%s", c, tc.wantStatus, tc.wantReason)
			}
			for _, want := range tc.wantMsg {
				containsAll(t, "message", c.Message, strings.ReplaceAll(want, "{uuid}", f.uuid(tc.gpu)))
			}
			g := r.GPUs[tc.gpu]
			if !slices.Equal(g.Reasons, tc.wantReasons) {
				t.Errorf("GPU %d reasons = %q, want %q", tc.gpu, g.Reasons, tc.wantReasons)
			}
			if g.Healthy != (len(tc.wantReasons) == 0) {
				t.Errorf("GPU %d healthy = %v with reasons %q", tc.gpu, g.Healthy, g.Reasons)
			}
			if !slices.Equal(g.Unknown, tc.wantUnknown) {
				t.Errorf("GPU %d unknown = %q, want %q", tc.gpu, g.Unknown, tc.wantUnknown)
			}
			for i, other := range r.GPUs {
				if i != tc.gpu && !other.Healthy {
					t.Errorf("GPU %d unexpectedly unhealthy: %q", i, other.Reasons)
				}
			}
			if len(r.Unhealthy()) != map[bool]int{true: 0, false: 1}[g.Healthy] {
				t.Errorf("Unhealthy() = %+v", r.Unhealthy())
			}
		})
	}
}

func TestConditionEdges(t *testing.T) {
	tests := []struct {
		name       string
		snap       Snapshot
		wantStatus string
		wantReason string
		maxLen     int
	}{
		{name: "no GPUs", snap: Snapshot{}, wantStatus: ConditionTrue, wantReason: ReasonNoGPUs},
		{
			name: "long message is capped",
			snap: func() Snapshot {
				var s Snapshot
				for i := range 64 {
					s.GPUs = append(s.GPUs, GPUInfo{Index: i, UUID: "GPU-" + strings.Repeat("a", 36), RecoveryAction: RecoveryActionNodeReboot,
						RemappedRows: RemappedRows{Known: true, Pending: true}})
				}
				return s
			}(),
			wantStatus: ConditionFalse, wantReason: ReasonGPUUnhealthy, maxLen: maxConditionMessage,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Evaluate(tc.snap).Condition
			if c.Status != tc.wantStatus || c.Reason != tc.wantReason {
				t.Errorf("condition = %+v", c)
			}
			if tc.maxLen > 0 && (len(c.Message) > tc.maxLen || !strings.HasSuffix(c.Message, "…")) {
				t.Errorf("message length %d (cap %d): %q", len(c.Message), tc.maxLen, c.Message)
			}
		})
	}
}

func TestHealthNVMLError(t *testing.T) {
	f := newFleet(t, archH100)
	f.srv.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	m, _ := newTestManager(t, f)
	r, err := m.Health()
	if err == nil {
		t.Fatal("Health: want error")
	}
	if r.Condition.Status != ConditionUnknown || r.Condition.Reason != ReasonNVMLError {
		t.Errorf("condition = %+v", r.Condition)
	}
	containsAll(t, "message", r.Condition.Message, "DeviceGetCount: ERROR_UNKNOWN")
}
