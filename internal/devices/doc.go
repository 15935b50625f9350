// Package devices is the agent's only door to NVIDIA GPUs: inventory,
// health, XID events and the verbs of the gpu-reset driver. It is the only
// package allowed to import github.com/NVIDIA/go-nvml (STYLE 2; a deps test
// enforces it). Build with cgo and -tags kustomize_disable_go_plugin_support
// (go-nvml leaves nvml* symbols unresolved until Init dlopens
// libnvidia-ml.so.1; a BIND_NOW binary dies at exec).
//
// # Lifecycle
//
// New(Config) validates; Init loads NVML; Shutdown (only after a successful
// Init, idempotent) stops watchers and unloads it. Config.NVML nil means
// nvml.New(), so callers never import go-nvml; tests pass go-nvml's
// mock/dgxh100 or mock/dgxa100 servers. On a host without libnvidia-ml (or
// without a loaded driver) Init returns an error matching ErrNoNVML, e.g.
// "devices: no NVML (Init: ERROR_LIBRARY_NOT_FOUND)"; the agent then does not
// publish the gpu-reset transition. Every call runs under a read lock, so
// Shutdown never unloads the library under a running call. Time comes from
// the injected clock; nothing sleeps.
//
// # Errors
//
// An nvml.Return becomes an *Error at the package edge, naming the GPU UUID
// and the operation: "devices: GPU-…: GetRemappedRows: ERROR_NOT_SUPPORTED".
// errors.Is works against the nvml.Return and against ErrNotSupported,
// ErrInUse, ErrGPULost, ErrNoPermission.
//
// # What is read (Snapshot, per GPU, keyed by UUID)
//
//	identity       index, UUID, name, PCI bus ID, architecture, minor number
//	MIG            GetMigMode current/pending
//	persistence    GetPersistenceMode
//	processes      GetComputeRunningProcesses + GetGraphicsRunningProcesses (PIDs)
//	retired pages  GetRetiredPagesPendingStatus
//	remapped rows  GetRemappedRows: correctable/uncorrectable rows, pending, failure
//	ECC            GetTotalEccErrors, VOLATILE counters (errors since driver load or reset)
//	recovery       field FI_DEV_GET_GPU_RECOVERY_ACTION (230)
//	fabric         GetGpuFabricInfo state and status (Hopper+ NVSwitch)
//	topology       GetNvLinkState / GetNvLinkRemoteDeviceType (NVSwitch detection)
//	XIDs           critical XIDs latched by WatchEvents since ClearXIDs
//
// Calls introduced in later drivers (GetRemappedRows, GetGpuFabricInfo,
// GetNvLinkRemoteDeviceType, DeviceRemoveGpu_v2) are looked up once at Init
// and skipped when absent, because calling a missing lazy symbol kills the
// process. The snapshot is Prometheus-free; the agent makes gauges from it.
//
// # What counts as unhealthy (Evaluate)
//
// GPULost, ResetRequired, NVMLReadFailed (any read failing with anything but
// NOT_SUPPORTED: fail closed), RetiredPagesPending, RemappedRowsPending,
// RemappedRowsFailure, UncorrectableECC (volatile uncorrected > 0),
// RecoveryAction=<X> (anything but NONE), FabricNotCompleted / FabricFailed
// (NVSwitch systems only: a fabric state other than NOT_SUPPORTED and
// NOT_STARTED, an NVLink to an NVSwitch, or a switch in the nvidia-nvswitch
// driver's device list /proc/driver/nvidia-nvswitch/devices — links not yet
// trained before Fabric Manager runs hide the switches from NVML; a single
// SXM GPU without NVSwitches reads NOT_STARTED and is healthy), and "XID <n>" for a latched
// XID whose class is reset, reboot or replace (the class is in the details). A signal
// answered with ERROR_NOT_SUPPORTED is unknown and listed, never unhealthy.
// The Node condition is GPUHealthy: True/AllHealthy (or NoGPUs),
// False/GPUUnhealthy with a message naming each failing GPU and its signals,
// Unknown/NVMLError when NVML cannot enumerate. Messages are capped at 1024
// bytes.
//
// # XID watcher
//
// WatchEvents registers EventTypeXidCriticalError | EventTypeDoubleBitEccError
// | EventTypeGpuRecoveryAction (intersected with GetSupportedEventTypes) and
// loops on EventSet.Wait(EventWait, default 1 s) until ctx or Shutdown.
// Every XID is judged per code by ClassifyXID (xid.go, from NVIDIA's XID
// catalogue): ignorable (13, 31, 43, 45, 68, 109, the device plugin's list;
// Config.IgnoredXIDs overrides), informational (63, 92, 94, 154: logged and
// delivered, never unhealthy), needs a GPU reset (48, 74, 95, 119, 120, 140
// and any code not in the table: fail closed), needs a node reboot (62, 79),
// needs the GPU replaced (64). Unhealthy ones are latched per GPU until
// ClearXIDs (ResetAndVerify clears them after a successful reset); LatchXID
// latches one seen elsewhere (the kernel log, the state journaled across
// restarts: internal/gpuhealth). Restart the watcher after a reset:
// registrations die with the handles.
//
// # Kernel log
//
// KernelLog (kmsg.go) reads /dev/kmsg non-blocking, one record per read,
// kept open so each Records call returns what was logged since the last;
// KernelXIDOf turns a kernel-facility record "NVRM: Xid (PCI:0000:3b:00):
// 79, …" into the XID and its PCI address, and BusKey puts NVML's bus ID in
// the same form. It needs no NVML.
//
// # GPU selection
//
// The gpu-reset parameter `gpus` is "all", a comma list of UUIDs, or a comma
// list of indices, never mixed (SelectGPUs); errors name the parameter and
// the bad value.
//
// # Reset routes and their preconditions
//
// NVML has no single reset call. Two Resetters:
//
//   - SMIResetter: `nvidia-smi --gpu-reset -i <uuid,…>` through an injected
//     CommandRunner (default os/exec with a context timeout and WaitDelay;
//     the error carries stdout and stderr).
//   - NVMLResetter: per GPU DeviceModifyDrainState(ENABLED) →
//     DeviceQueryDrainState → DeviceRemoveGpu_v2(DETACH_GPU_REMOVE,
//     PCIE_LINK_KEEP), then one DeviceDiscoverGpus (full PCI rescan; ECC
//     scrub takes seconds per GPU), then re-resolution by UUID (handles and
//     indices change). A failed removal (ERROR_IN_USE) undrains that GPU and
//     rediscovers those already removed.
//
// resetMethod: nvidia-smi | nvml | auto. auto is nvidia-smi when found
// (ResetterConfig.SMIPath, else PATH) and otherwise an error wrapping
// ErrNoResetRoute: PCI remove/rediscover detaches GPUs from the bus and is
// used only when configured by name. ResetterConfig.BeforeRemove is called
// before each removal (the driver journals the unplug there); Rediscover
// rescans the bus and fails naming any UUID still missing.
//
// # Holders
//
// FindHolders lists processes with a GPU's /dev/nvidia<minor> open (from
// /proc/*/fd, with comm, systemd unit and pod UID from the cgroup), which
// is what nvidia-smi refuses a reset on ("In use by another client"): an
// NVML session counts, not only CUDA work. Processes whose fd table cannot
// be read (permission denied) are listed apart (HolderScan.Unreadable): a
// caller deciding a reset must treat them as possible holders. HolderPaths
// maps UUIDs to their nodes (GPUInfo.Minor, GetMinorNumber).
// DryRun logs the plan and changes nothing. Both routes need root, no
// compute or graphics processes, persistence mode off (ResetAndVerify turns
// it off and restores it), MIG disabled, and other NVML clients (DCGM,
// dcgm-exporter, device plugin) stopped by the caller. Preconditions reports
// each blocker by GPU (PIDs named); ResetAndVerify refuses on any. A process
// list unreadable only because the GPU answers ERROR_RESET_REQUIRED is a
// note, not a blocker (refusing would keep the GPU the reset is for
// unusable): the caller must then check the device node's holders
// (FindHolders) before it resets, as the gpu-reset driver's reset step does.
//
// # NVSwitch decision
//
// ResetGroup: on an NVSwitch system with pre-Hopper GPUs (DGX/HGX A100) the
// selection expands to every GPU, because GPUs and NVSwitches reset together
// with Fabric Manager stopped (the caller stops nvidia-fabricmanager); on
// Hopper and later (HGX H100/H200) single GPUs may be reset, and
// WaitFabricCompleted polls GetGpuFabricInfo until GPU_FABRIC_STATE_COMPLETED.
// Pre-Ampere NVLink groups also expand to every GPU. Unknown architectures on
// NVSwitch count as pre-Hopper.
//
// # Units
//
// ECC counts are errors; remapped rows are rows; PIDs are host PIDs;
// EventWait, FabricPollInterval and FabricTimeout are time.Duration
// (EventWait is passed to NVML in milliseconds); the recovery action and
// fabric state mirror the NVML enums value for value.
package devices
