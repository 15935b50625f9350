package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/gpuhealth"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/needs"
)

// gpuStack is NVML, the gpu-reset driver and the GPU health monitor. On a
// host without the NVIDIA library it is nil: nothing is published for GPUs.
type gpuStack struct {
	mgr    *devices.Manager
	driver drivers.Driver
	// monitor is set by startMonitor, after the driver exists; the driver
	// reads it from the engine's goroutine (session, AfterReset).
	monitor atomic.Pointer[gpuhealth.Monitor]

	// holdMu guards holds (reason → NVML released) and upgrading (the
	// driver upgrade state while it has NVML released); see hold.
	holdMu    sync.Mutex
	holds     map[string]bool
	upgrading string
}

// session is the agent's hold on the GPUs as the gpu-reset driver pauses
// it around a reset (drivers.GPUSession): the health monitor (its XID
// event set and handles) and the NVML session under it, which keeps every
// /dev/nvidia* node open. Without it the driver's holder check — and
// nvidia-smi itself — refuse every reset on the nvidia-smi route, naming
// the agent.
func (g *gpuStack) session() gpuhealth.Session {
	return gpuhealth.Session{Monitor: g.monitor.Load(), NVML: g.mgr}
}

// stackSession adapts gpuStack to drivers.GPUSession, reading the monitor
// at the time of the call (it starts after the driver is built).
type stackSession struct{ g *gpuStack }

func (s stackSession) Pause(ctx context.Context, release bool) error {
	return s.g.hold(ctx, holdGPUReset, release)
}

func (s stackSession) Blocked() error { return s.g.blocked() }

func (s stackSession) Resume(ctx context.Context) error {
	return s.g.unhold(ctx, holdGPUReset, false, nil)
}

// testGPU is what a test build (tag lifecycle_testnvml) puts in place of
// the host's GPUs: go-nvml's mock, and changes to the gpu-reset driver
// (device nodes, the nvidia-smi double) that only a test build makes.
type testGPU struct {
	lib    devices.Library
	driver func(*drivers.GPUReset)
}

// testNVML, set only in a build with the tag lifecycle_testnvml (the crash
// tests' failpoint build: testnvml.go), replaces the host's NVML with
// go-nvml's mock when the environment asks for it.
var testNVML func(log *slog.Logger) (testGPU, bool)

// kernelLog is where the GPU monitor reads the NVIDIA module's XIDs; a
// test build with the NVML mock reads EnvTestKernelLog's file instead
// (testnvml.go), never the host's kernel log.
var kernelLog = devices.DefaultKernelLog

// NVMLLibrary is the libnvidia-ml.so.1 the agent loads: "" for the host's
// (the dynamic loader finds it), or the one under gpu.driverRoot (an error
// naming the root and where it looked when there is none). cfg may be nil.
func NVMLLibrary(cfg *config.Config) (string, error) {
	if cfg == nil || cfg.GPU.DriverRoot == "" {
		return "", nil
	}
	return devices.DriverRootLibrary(cfg.GPU.DriverRoot)
}

// GPUResetSMI returns the gpu-reset driver's SMIPath and DriverRoot from
// gpu.nvidiaSMI and gpu.driverRoot: SMIPath "" is auto (the driver root's
// nvidia-smi, run inside it, when there is one; else PATH's).
func GPUResetSMI(cfg *config.Config) (smiPath, driverRoot string) {
	if cfg.GPU.NvidiaSMI != config.NvidiaSMIAuto {
		smiPath = cfg.GPU.NvidiaSMI
	}
	return smiPath, cfg.GPU.DriverRoot
}

// newGPUStack loads NVML and builds the GPU stack, logging why not when
// it cannot (nil, and the reason).
func newGPUStack(cfg *config.Config, api *apiclient.Client, log *slog.Logger, clk clock.Clock) (*gpuStack, error) {
	g, err := loadGPUStack(cfg, api, log, clk)
	switch {
	case err == nil:
	case errors.Is(err, devices.ErrNoNVML):
		log.Info("no NVML on this host: the gpu-reset driver and GPU health are off")
	case errors.Is(err, errNoDriverRootLibrary):
		log.Warn("NVML not loaded: the gpu-reset driver and GPU health are off", "err", err)
	default:
		log.Warn("NVML failed to start: the gpu-reset driver and GPU health are off", "err", err)
	}
	return g, err
}

var errNoDriverRootLibrary = errors.New("no NVML library under gpu.driverRoot")

// loadGPUStack is newGPUStack without the logging.
func loadGPUStack(cfg *config.Config, api *apiclient.Client, log *slog.Logger, clk clock.Clock) (*gpuStack, error) {
	dc := devices.Config{Logger: log, Clock: clk}
	var test testGPU
	if testNVML != nil {
		if tg, ok := testNVML(log); ok {
			dc.NVML, test = tg.lib, tg
		}
	}
	if dc.NVML == nil {
		lib, err := NVMLLibrary(cfg)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errNoDriverRootLibrary, err)
		}
		dc.LibraryPath = lib
	}
	mgr, err := devices.New(dc)
	if err == nil {
		err = mgr.Init()
	}
	if err != nil {
		return nil, err
	}
	method, _ := devices.ParseResetMethod(cfg.GPU.ResetMethod)
	g := &gpuStack{mgr: mgr}
	smiPath, driverRoot := GPUResetSMI(cfg)
	d := drivers.GPUReset{Devices: mgr, Session: stackSession{g}, Method: method, Services: cfg.GPU.Services, RetryDelay: cfg.Drain.EvictRetryDelay, DrainTimeout: cfg.Drain.Timeout, Log: log,
		// The GPU Operator's DaemonSet pods on this node (gpu.operator.*).
		Operator: api, OperatorComponents: cfg.GPU.Operator.Components, OperatorLabelPrefix: cfg.GPU.Operator.LabelPrefix,
		OperatorPausedValue: cfg.GPU.Operator.PausedValue, OperatorPodTimeout: cfg.GPU.Operator.PodTimeout,
		// nvidia-smi: gpu.nvidiaSMI, or the driver root's (chroot).
		SMIPath: smiPath, DriverRoot: driverRoot,
		// The checks before the uncordon of a reset with drain.
		Readiness: readinessOf(cfg, api, clk, true),
		AfterReset: func([]string) {
			if m := g.monitor.Load(); m != nil {
				m.Rewatch()
			}
		}}
	if test.driver != nil {
		test.driver(&d)
	}
	g.driver = d
	return g, nil
}

// gpuRetryInterval is how often the agent tries NVML again while it may
// still appear (gpuMayAppear).
var gpuRetryInterval = 15 * time.Second

// gpuMayAppear reports whether NVML, not loaded at start for reason err,
// may load later without a restart: under a GPU Operator driver root the
// operator starts the driver pod after the agent at every boot, and a
// host's NVIDIA module may load after the agent (NVML then answers
// DRIVER_NOT_LOADED or a version mismatch until it does). A host without
// the NVIDIA library at all is taken as a node without GPUs.
func gpuMayAppear(cfg *config.Config, err error) bool {
	return cfg.GPU.DriverRoot != "" || !errors.Is(err, devices.ErrNoNVML)
}

// waitForGPU tries NVML every gpuRetryInterval until it loads or ctx
// ends, then calls started with the stack (which starts the monitor and
// publishes the gpu-reset driver): no restart needed when the driver
// comes up after the agent.
func waitForGPU(ctx context.Context, cfg *config.Config, api *apiclient.Client, log *slog.Logger, clk clock.Clock, why error, started func(*gpuStack)) {
	log.Info("waiting for NVML: the gpu-reset driver and GPU health start once it loads", "every", gpuRetryInterval, "reason", why)
	for {
		select {
		case <-ctx.Done():
			return
		case <-clk.After(gpuRetryInterval):
		}
		g, err := loadGPUStack(cfg, api, log, clk)
		if err != nil {
			log.Debug("NVML still not loaded", "err", err)
			continue
		}
		log.Info("NVML loaded after start: starting the gpu-reset driver and GPU health")
		started(g)
		return
	}
}

// gpuRequestKey is a GPU's key among the journal's automatic requests.
func gpuRequestKey(uuid string) string { return "gpu-reset/" + uuid }

// GPUBaselineFile is the GPU health monitor's baseline (gpuhealth.Baseline),
// in the journal's directory: delete it, with the agent stopped, to accept
// the GPUs present at the next start as the node's GPUs.
const GPUBaselineFile = "gpu-baseline.json"

// startMonitor publishes GPUHealthy, the GPU needs and the GPU gauges
// until ctx ends; the GPUs' reboot cause goes to reboot (nil: nowhere).
func (g *gpuStack) startMonitor(ctx context.Context, cfg *config.Config, api *apiclient.Client, j *journal.Journal, bootID string, reboot *needs.Reboot, reg prometheus.Registerer, log *slog.Logger, clk clock.Clock) {
	gc := gpuhealth.Config{Node: cfg.NodeName, Devices: g.mgr, Conditions: api, Registerer: reg, Clock: clk, Log: log,
		AutoRemediate: cfg.GPU.AutoRemediate, BootID: bootID,
		// Next to the journal: /var/lib/lifecycle-agent/gpu-baseline.json.
		BaselinePath: filepath.Join(filepath.Dir(cfg.JournalPath), GPUBaselineFile),
		// Latched XIDs and the kernel log's position survive a restart.
		State: j, KernelLog: kernelLog,
		CreateEvent: requestAPI{api}.CreateEvent}
	if cfg.GPU.AutoRemediate {
		// Through a Requester: once per GPU and need, journaled, capped
		// by gpu.remediation.group's slots and its circuit breaker.
		rm := cfg.GPU.Remediation
		req, err := needs.NewRequester(needs.RequestConfig{Need: "gpu-reset", KeyPrefix: gpuRequestKey(""),
			Group: rm.Group, MaxConcurrent: rm.MaxConcurrent, BreakerFailures: rm.BreakerFailures,
			API: requestAPI{api}, Journal: j, Registerer: reg, Clock: clk, Log: log})
		if err != nil {
			log.Error("GPU health monitor not started", "err", err)
			return
		}
		gc.CreateEvent = func(ctx context.Context, ev *v1alpha1.LifecycleEvent) error {
			return req.Request(ctx, gpuRequestKey(ev.Spec.Parameters["gpus"]), ev)
		}
		gc.Released = func(ctx context.Context, uuid string) { req.Release(ctx, gpuRequestKey(uuid)) }
		go req.Run(ctx)
	}
	if reboot != nil {
		gc.RebootNeed = reboot.SetGPUCause
	}
	m, err := gpuhealth.New(gc)
	if err != nil {
		log.Error("GPU health monitor not started", "err", err)
		return
	}
	g.monitor.Store(m)
	go func() { _ = m.Run(ctx) }()
}
