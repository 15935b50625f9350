package devices

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Tri is a reading that may be unknown (the driver or GPU does not support it,
// or the read failed). Values are explicit, not iota (STYLE 5).
type Tri int8

const (
	TriUnknown Tri = 0
	TriFalse   Tri = 1
	TriTrue    Tri = 2
)

func triOf(b bool) Tri {
	if b {
		return TriTrue
	}
	return TriFalse
}

func (t Tri) String() string {
	switch t {
	case TriFalse:
		return "false"
	case TriTrue:
		return "true"
	}
	return "unknown"
}

// RecoveryAction is the driver's FI_DEV_GET_GPU_RECOVERY_ACTION (field 230)
// verdict. Values mirror nvmlDeviceGpuRecoveryAction_t; -1 is "unknown"
// (driver predates the field, or the read failed).
type RecoveryAction int32

const (
	RecoveryActionUnknown           RecoveryAction = -1
	RecoveryActionNone              RecoveryAction = 0
	RecoveryActionGPUReset          RecoveryAction = 1
	RecoveryActionNodeReboot        RecoveryAction = 2
	RecoveryActionDrainP2P          RecoveryAction = 3
	RecoveryActionDrainAndReset     RecoveryAction = 4
	RecoveryActionRecoverIMEXDomain RecoveryAction = 5
	RecoveryActionBusReset          RecoveryAction = 6
	RecoveryActionSystemReboot      RecoveryAction = 7
)

func (a RecoveryAction) String() string {
	switch a {
	case RecoveryActionUnknown:
		return "UNKNOWN"
	case RecoveryActionNone:
		return "NONE"
	case RecoveryActionGPUReset:
		return "GPU_RESET"
	case RecoveryActionNodeReboot:
		return "NODE_REBOOT"
	case RecoveryActionDrainP2P:
		return "DRAIN_P2P"
	case RecoveryActionDrainAndReset:
		return "DRAIN_AND_RESET"
	case RecoveryActionRecoverIMEXDomain:
		return "RECOVER_IMEX_DOMAIN"
	case RecoveryActionBusReset:
		return "BUS_RESET"
	case RecoveryActionSystemReboot:
		return "SYSTEM_REBOOT"
	}
	return fmt.Sprintf("ACTION_%d", int32(a))
}

// FabricState mirrors NVML_GPU_FABRIC_STATE_*.
type FabricState uint8

const (
	FabricNotSupported FabricState = 0
	FabricNotStarted   FabricState = 1
	FabricInProgress   FabricState = 2
	FabricCompleted    FabricState = 3
)

func (s FabricState) String() string {
	switch s {
	case FabricNotSupported:
		return "NOT_SUPPORTED"
	case FabricNotStarted:
		return "NOT_STARTED"
	case FabricInProgress:
		return "IN_PROGRESS"
	case FabricCompleted:
		return "COMPLETED"
	}
	return fmt.Sprintf("STATE_%d", uint8(s))
}

// RemappedRows is GetRemappedRows. Counts are rows (not bytes).
type RemappedRows struct {
	Known         bool
	Correctable   int
	Uncorrectable int
	Pending       bool // a reset is required to remap
	Failure       bool // remapping failed: the GPU needs service
}

// ECCErrors are GetTotalEccErrors volatile counters (errors since the last
// driver load or GPU reset).
type ECCErrors struct {
	Known               bool
	VolatileCorrected   uint64
	VolatileUncorrected uint64
}

// Fabric is GetGpuFabricInfo. Known is false when the call is not supported
// (no NVSwitch, pre-Hopper, or the driver lacks the symbol).
type Fabric struct {
	Known bool
	State FabricState
	// Status is the registration status (ReturnName) once State is COMPLETED.
	Status string
}

// GPUInfo is one GPU as NVML sees it. Identity fields come first; the rest is
// filled by Snapshot only (List leaves them zero/unknown).
type GPUInfo struct {
	Index        int
	UUID         string
	Name         string
	PCIBusID     string // e.g. 00000000:07:00.0
	Architecture string // Ampere, Hopper, …
	// Minor is the device node's minor number: /dev/nvidia<Minor> (-1 when
	// unreadable). Holders of that node block a reset.
	Minor int
	arch  nvml.DeviceArchitecture

	MIGCurrent Tri
	MIGPending Tri
	// Persistence is persistence mode; "on" counts as an attachment and must
	// be off for a reset.
	Persistence Tri

	// ProcessesKnown is false when either process list could not be read.
	// ProcessesResetRequired: the only failures were ERROR_RESET_REQUIRED
	// (the GPU must be reset before it answers again).
	ProcessesKnown         bool
	ProcessesResetRequired bool
	ComputePIDs            []uint32
	GraphicsPIDs           []uint32

	RetiredPagesPending Tri
	RemappedRows        RemappedRows
	ECC                 ECCErrors
	RecoveryAction      RecoveryAction
	Fabric              Fabric

	// NVLinksActive counts enabled NVLinks; NVSwitchLinks those whose remote
	// end is an NVSwitch.
	NVLinksActive int
	NVSwitchLinks int

	// CriticalXIDs are non-ignored XIDs seen by a watcher since the last
	// ClearXIDs (latched: they stay until a reset clears them).
	CriticalXIDs []uint64

	// Lost: some read returned ERROR_GPU_IS_LOST. ResetRequired: some read
	// returned ERROR_RESET_REQUIRED.
	Lost          bool
	ResetRequired bool
	// ReadErrors lists reads that failed with anything but NOT_SUPPORTED
	// ("GetRemappedRows: ERROR_UNKNOWN"). Fail closed: they make the GPU
	// unhealthy.
	ReadErrors []string
}

// Snapshot is the whole-host reading, Prometheus-free: the agent turns it
// into gauges.
type Snapshot struct {
	At            time.Time
	DriverVersion string
	// NVSwitch: some GPU has an NVLink to an NVSwitch, or reports a fabric
	// state (Hopper+ with Fabric Manager).
	NVSwitch bool
	GPUs     []GPUInfo
}

// GPU returns the entry with that UUID.
func (s Snapshot) GPU(uuid string) (GPUInfo, bool) {
	for _, g := range s.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return GPUInfo{}, false
}

// note classifies a Return for a signal read: SUCCESS → true; NOT_SUPPORTED →
// false (unknown, not an error); anything else is recorded.
func (g *GPUInfo) note(op string, ret nvml.Return) bool {
	switch ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_NOT_SUPPORTED:
		return false
	case nvml.ERROR_GPU_IS_LOST:
		g.Lost = true
	case nvml.ERROR_RESET_REQUIRED:
		g.ResetRequired = true
	default:
		g.ReadErrors = append(g.ReadErrors, op+": "+ReturnName(ret))
	}
	return false
}

// List returns the identity of every GPU (index, UUID, name, PCI bus ID,
// architecture), in index order.
func (m *Manager) List() ([]GPUInfo, error) {
	lib, release, err := m.acquire()
	if err != nil {
		return nil, err
	}
	defer release()
	devs, err := m.enumerate(lib)
	if err != nil {
		return nil, err
	}
	out := make([]GPUInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.info)
	}
	return out, nil
}

// Snapshot reads everything for every GPU. A failing signal on one GPU is
// recorded on that GPU (see GPUInfo.note); only enumeration failures return
// an error.
func (m *Manager) Snapshot() (Snapshot, error) {
	lib, release, err := m.acquire()
	if err != nil {
		return Snapshot{}, err
	}
	defer release()
	return m.snapshot(lib)
}

func (m *Manager) snapshot(lib nvml.Interface) (Snapshot, error) {
	s := Snapshot{At: m.clk.Now()}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		s.DriverVersion = v
	}
	devs, err := m.enumerate(lib)
	if err != nil {
		return Snapshot{}, err
	}
	for _, d := range devs {
		g := d.info
		if d.dev != nil {
			m.readHealth(d.dev, &g)
			m.readTopology(d.dev, &g)
		}
		g.CriticalXIDs = m.latchedXIDs(g.UUID)
		// A fabric state counts only when it says a fabric exists: a single
		// SXM GPU without NVSwitches reads NOT_STARTED (or NOT_SUPPORTED)
		// forever and is healthy.
		if g.NVSwitchLinks > 0 || (g.Fabric.Known && g.Fabric.State != FabricNotSupported && g.Fabric.State != FabricNotStarted) {
			s.NVSwitch = true
		}
		if m.nvswitchPresent() {
			s.NVSwitch = true // the switches are there, whatever the links say now
		}
		s.GPUs = append(s.GPUs, g)
	}
	return s, nil
}

// nvswitchPresent reports whether the nvidia-nvswitch driver lists any
// NVSwitch (Config.NVSwitchDevices). An unreadable or absent list says
// nothing: a host without the module has no NVSwitch.
func (m *Manager) nvswitchPresent() bool {
	if m.nvswitchDir == NoNVSwitchDevices {
		return false
	}
	entries, err := os.ReadDir(m.nvswitchDir)
	return err == nil && len(entries) > 0
}

type enumerated struct {
	dev  nvml.Device // nil when the handle could not be obtained
	info GPUInfo
}

// enumerate walks indices 0..count-1 and reads identity. A GPU whose handle
// or UUID cannot be read is kept (UUID empty, Lost/ReadErrors set) so that
// health reports it instead of silently dropping it.
func (m *Manager) enumerate(lib nvml.Interface) ([]enumerated, error) {
	n, ret := lib.DeviceGetCount()
	if err := nvmlErr("", "DeviceGetCount", ret); err != nil {
		return nil, err
	}
	out := make([]enumerated, 0, n)
	for i := range n {
		g := newGPUInfo(i)
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if !g.note("DeviceGetHandleByIndex", ret) {
			out = append(out, enumerated{info: g})
			continue
		}
		readIdentity(dev, &g)
		out = append(out, enumerated{dev: dev, info: g})
	}
	return out, nil
}

func newGPUInfo(index int) GPUInfo {
	return GPUInfo{
		Index: index, Minor: -1, RecoveryAction: RecoveryActionUnknown,
		arch: nvml.DEVICE_ARCH_UNKNOWN, Architecture: archName(nvml.DEVICE_ARCH_UNKNOWN),
	}
}

func readIdentity(dev nvml.Device, g *GPUInfo) {
	if idx, ret := dev.GetIndex(); g.note("GetIndex", ret) {
		g.Index = idx
	}
	if u, ret := dev.GetUUID(); g.note("GetUUID", ret) {
		g.UUID = u
	}
	if name, ret := dev.GetName(); g.note("GetName", ret) {
		g.Name = name
	}
	if pci, ret := dev.GetPciInfo(); g.note("GetPciInfo", ret) {
		g.PCIBusID = busID(pci)
	}
	if a, ret := dev.GetArchitecture(); g.note("GetArchitecture", ret) {
		g.arch = a
		g.Architecture = archName(a)
	}
	if n, ret := dev.GetMinorNumber(); g.note("GetMinorNumber", ret) {
		g.Minor = n
	}
}

// DevicePath is the GPU's device node under devRoot ("" means /dev):
// <devRoot>/nvidia<Minor>, or "" when the minor number is unknown.
func (g GPUInfo) DevicePath(devRoot string) string {
	if g.Minor < 0 {
		return ""
	}
	if devRoot == "" {
		devRoot = "/dev"
	}
	return filepath.Join(devRoot, fmt.Sprintf("nvidia%d", g.Minor))
}

// failed reports whether a read whose op starts with prefix failed with
// something other than NOT_SUPPORTED.
func (g GPUInfo) failed(prefix string) bool {
	for _, e := range g.ReadErrors {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

// readHealth fills the per-GPU signals.
func (m *Manager) readHealth(dev nvml.Device, g *GPUInfo) {
	if cur, pend, ret := dev.GetMigMode(); g.note("GetMigMode", ret) {
		g.MIGCurrent = triOf(cur == nvml.DEVICE_MIG_ENABLE)
		g.MIGPending = triOf(pend == nvml.DEVICE_MIG_ENABLE)
	}
	if p, ret := dev.GetPersistenceMode(); g.note("GetPersistenceMode", ret) {
		g.Persistence = triOf(p == nvml.FEATURE_ENABLED)
	}
	g.ComputePIDs, g.GraphicsPIDs, g.ProcessesKnown, g.ProcessesResetRequired = readProcesses(dev, g)

	if p, ret := dev.GetRetiredPagesPendingStatus(); g.note("GetRetiredPagesPendingStatus", ret) {
		g.RetiredPagesPending = triOf(p == nvml.FEATURE_ENABLED)
	}
	if m.has(symRemappedRows) {
		// NOT_SUPPORTED while MIG is enabled and on pre-Ampere: unknown.
		if c, u, pending, failed, ret := dev.GetRemappedRows(); g.note("GetRemappedRows", ret) {
			g.RemappedRows = RemappedRows{Known: true, Correctable: c, Uncorrectable: u, Pending: pending, Failure: failed}
		}
	}
	unc, ret1 := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	ok1 := g.note("GetTotalEccErrors(uncorrected)", ret1)
	cor, ret2 := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	ok2 := g.note("GetTotalEccErrors(corrected)", ret2)
	if ok1 && ok2 {
		g.ECC = ECCErrors{Known: true, VolatileUncorrected: unc, VolatileCorrected: cor}
	}
	g.RecoveryAction = readRecoveryAction(dev, g)
	if m.has(symGpuFabricInfo) {
		if fi, ret := dev.GetGpuFabricInfo(); g.note("GetGpuFabricInfo", ret) {
			g.Fabric = Fabric{Known: true, State: FabricState(fi.State)}
			if g.Fabric.State == FabricCompleted {
				g.Fabric.Status = ReturnName(nvml.Return(fi.Status))
			}
		}
	}
}

// readProcesses returns compute and graphics PIDs; known is false unless both
// lists were read (NOT_SUPPORTED included: fail closed for reset).
// resetRequired is true when the lists were not read only because the GPU
// answered ERROR_RESET_REQUIRED.
func readProcesses(dev nvml.Device, g *GPUInfo) (compute, graphics []uint32, known, resetRequired bool) {
	cp, ret1 := dev.GetComputeRunningProcesses()
	ok1 := g.note("GetComputeRunningProcesses", ret1)
	gp, ret2 := dev.GetGraphicsRunningProcesses()
	ok2 := g.note("GetGraphicsRunningProcesses", ret2)
	resetRequired = !(ok1 && ok2) &&
		(ok1 || ret1 == nvml.ERROR_RESET_REQUIRED) && (ok2 || ret2 == nvml.ERROR_RESET_REQUIRED)
	for _, p := range cp {
		compute = append(compute, p.Pid)
	}
	for _, p := range gp {
		graphics = append(graphics, p.Pid)
	}
	slices.Sort(compute)
	slices.Sort(graphics)
	return slices.Compact(compute), slices.Compact(graphics), ok1 && ok2, resetRequired
}

// readRecoveryAction reads field 230. Per-field NOT_SUPPORTED or
// INVALID_ARGUMENT (drivers that predate the field) is unknown, not an error.
func readRecoveryAction(dev nvml.Device, g *GPUInfo) RecoveryAction {
	vals := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if !g.note("GetFieldValues(GPU_RECOVERY_ACTION)", dev.GetFieldValues(vals)) {
		return RecoveryActionUnknown
	}
	switch r := nvml.Return(vals[0].NvmlReturn); r {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		return RecoveryActionUnknown
	default:
		g.note("GetFieldValues(GPU_RECOVERY_ACTION)", r)
		return RecoveryActionUnknown
	}
	v, ok := fieldUint(vals[0])
	if !ok || v > math.MaxInt32 {
		g.ReadErrors = append(g.ReadErrors, fmt.Sprintf("GetFieldValues(GPU_RECOVERY_ACTION): value type %d", vals[0].ValueType))
		return RecoveryActionUnknown
	}
	return RecoveryAction(v)
}

// fieldUint decodes an integer FieldValue (a C union, host byte order).
func fieldUint(v nvml.FieldValue) (uint64, bool) {
	b := v.Value[:]
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return binary.NativeEndian.Uint64(b), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(b)), true
	}
	return 0, false
}

// readTopology counts active NVLinks and those ending at an NVSwitch. A GPU
// without NVLink answers NOT_SUPPORTED; links past the last answer
// INVALID_ARGUMENT. Neither is an error.
func (m *Manager) readTopology(dev nvml.Device, g *GPUInfo) {
	for link := range nvml.NVLINK_MAX_LINKS {
		st, ret := dev.GetNvLinkState(link)
		if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED {
			return
		}
		if !g.note("GetNvLinkState", ret) {
			return
		}
		if st != nvml.FEATURE_ENABLED {
			continue
		}
		g.NVLinksActive++
		if !m.has(symNvLinkRemoteDevice) {
			continue
		}
		t, ret := dev.GetNvLinkRemoteDeviceType(link)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if !g.note("GetNvLinkRemoteDeviceType", ret) {
			return
		}
		if t == nvml.NVLINK_DEVICE_TYPE_SWITCH {
			g.NVSwitchLinks++
		}
	}
}

func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) > 0 {
		return string(b)
	}
	if p.Domain == 0 && p.Bus == 0 && p.Device == 0 {
		return ""
	}
	return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
}

func archName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	}
	return "Unknown"
}
