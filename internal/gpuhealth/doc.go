// Package gpuhealth watches the node's NVIDIA GPUs and reports their health:
// the Node condition GPUHealthy, Prometheus gauges, and — only when asked —
// a gpu-reset LifecycleEvent for a GPU whose driver says it needs a reset.
//
// # Loop
//
// Monitor.Run evaluates once at start, then every Config.Interval (default
// 30 s) on the injected clock, and at once when the XID watcher
// (devices.WatchEvents) delivers an event; a burst of events is coalesced
// into one evaluation. An evaluation is one devices Snapshot judged by
// devices.Evaluate, so the rule for "unhealthy" is devices' (lost, reset
// required, failed reads, pending retired pages or row remaps, row-remap
// failure, volatile uncorrected ECC, a recovery action, fabric not
// registered, a latched critical XID). A watcher that ends or cannot start
// is started again at the next tick; Rewatch restarts it at once (call it
// after a GPU reset: registrations die with the device handles). Nothing
// sleeps; tests drive the clock.
//
// # Node condition
//
// Type GPUHealthy, written through ConditionSink (*apiclient.Client's
// SetNodeConditions: a strategic-merge patch that leaves the kubelet's
// conditions alone) and only when status, reason or message differ from the
// last condition written successfully; a failed write is retried at the
// next evaluation.
//
//	True    AllHealthy | NoGPUs       "8 GPUs healthy[; not supported: …]"
//	False   GPU<index>:<Signal>[,…]   "2 of 8 GPUs unhealthy: GPU-… (index 3): XID 79; …"
//	Unknown NVMLError                 the NVML error
//
// The False reason names each failing GPU with each signal, e.g.
// "GPU3:XID79,GPU5:RemappedRowsPending,GPU5:RecoveryAction_GPU_RESET" (only
// letters, digits, '_', ':' and ',', so it is also a valid metav1.Condition
// reason), capped at MaxReasonLength bytes with ",More" when cut; the
// message has the UUIDs and the read errors (devices caps it at 1024 bytes).
//
// # Baseline (issue 14.6)
//
// With Config.BaselinePath the monitor keeps every GPU UUID it has seen on
// the node (Baseline, saved atomically at the first reading that lists
// GPUs and whenever one appears). A GPU of the baseline that NVML no
// longer lists — one that fell off the bus — makes GPUHealthy False with
// SignalGPUsMissing first in the reason and the UUIDs first in the
// message, and is a reboot cause. A baseline that cannot be read is
// replaced by the next reading (logged); a failed save is retried.
//
// # XIDs across restarts and the kernel log (issue 14.5)
//
// A critical XID is latched on its GPU until a reset clears it (devices).
// With Config.State (the journal's gpuhealth bucket, journal.GPUHealthState)
// the latched XIDs and the kernel log position are saved whenever they
// change, and read back at the first good reading after a restart: in the
// same boot every saved XID is latched again; after a reboot only those of
// class replace (XID 64: the reboot reset the GPUs, which is what the
// others asked for). With Config.KernelLog (/dev/kmsg) the monitor reads
// the NVIDIA module's "NVRM: Xid (PCI:dddd:bb:dd): N, …" records: at start
// those logged since the saved position (in the same boot) or since boot
// (after a reboot) — the XIDs logged while the agent was down — then at
// each evaluation those logged since. Each is judged like a watcher's
// (ignorable and informational ones are not latched) and latched on the
// GPU NVML lists at that PCI address (none there: logged, dropped). Only
// records of the kernel's facility count: a process writing to /dev/kmsg
// gets LOG_USER and cannot forge an XID. Records the ring buffer overwrote
// before they were read (a gap in the sequence numbers) are logged as
// lost. Around a GPU reset (Pause/Resume): Pause reads the kernel log and
// saves the state first (a crash during the reset loses nothing); Resume
// moves past the records logged during the reset without latching them
// (the reset cleared the GPUs' XIDs, and what a reset logs is not a fault
// after it) and saves what NVML reads then. An unreadable state or kernel
// log is logged and the monitor goes on without it.
//
// # Needs (issue 15.1)
//
// Each evaluation also reads what the GPUs ask of the node (NeedsOf:
// reset, reboot, replacement, from the recovery action, the pending
// remaps, a lost GPU and the latched XIDs by class) and writes, in the
// same patch as GPUHealthy and only when they changed:
//
//	GPUResetRequired        True GPU<index>:<cause>[,…] | False NotRequired | Unknown NVMLError
//	GPUReplacementRequired  True GPU<index>:<cause>[,…] | False NotRequired | Unknown NVMLError
//
// The reboot need goes to internal/needs (Config.RebootNeed), which owns
// RebootRequired and merges it with the reboot-required sentinel (reason
// GPUHealth). An unreadable NVML makes the two conditions Unknown and
// leaves the reboot cause as it was. Read errors are debounced: after a
// good reading one failed reading changes nothing (it is logged), and
// ReadFailuresBeforeUnknown (2) in a row turn GPUHealthy and the needs
// Unknown; at start, with nothing read yet, the first failure does. So a
// transient NVML error never flips GPUHealthy, and one that lasts does so
// within two intervals (60 s by default). Per-GPU gauges
// lifecycle_agent_gpu_reset_required and ..._replacement_required follow.
// Nothing here acts on a need unless gpu.autoRemediate asks (below); an
// operator acts with `kubectl lifecycle rollout gpu-reset --needs-gpu-reset`.
//
// # Metrics
//
// Gauges carry the labels gpu (UUID; empty when NVML cannot name the GPU)
// and index. A signal the GPU does not support has no series; GPUs that
// disappear, and every GPU when NVML cannot be read, lose theirs.
//
//	lifecycle_agent_gpu_healthy                     1 healthy, 0 not
//	lifecycle_agent_gpu_remapped_rows_pending       1 when a row remap waits for a reset
//	lifecycle_agent_gpu_retired_pages_pending       1 when page retirement waits for a reset
//	lifecycle_agent_gpu_ecc_volatile_uncorrected    errors since driver load or reset
//	lifecycle_agent_gpu_xid_events_total{gpu,xid}   critical XID events seen (counter)
//
// # Auto-remediation (config gpu.autoRemediate, off by default)
//
// When on, a GPU whose recovery action (field 230 in the snapshot, or a
// recovery-action event) is GPU_RESET gets a LifecycleEvent for this node's
// gpu-reset transition (<node>-gpu-reset) with parameters gpus=<uuid>;
// DRAIN_AND_RESET adds drain=true. The event is created through the
// injected CreateEvent and named EventName(node, uuid, bootID) =
// <node>-gpu-reset-<first 8 hex of the UUID>-<first 8 hex of the boot ID>,
// so each GPU gets at most one automatic reset per boot: a second request
// (after a restart of the agent, or a reset that did not help) meets
// AlreadyExists and is treated as done. A GPU that still asks for a reset
// after it is then a case for an operator or a reboot. The agent's
// CreateEvent goes through internal/needs' Requester (journaled once per
// GPU and need, in disruption group gpu.remediation.group, behind its
// circuit breaker); Released tells it which GPUs no longer ask. Other recovery
// actions (NODE_REBOOT, DRAIN_P2P, …) are only reported.
package gpuhealth
