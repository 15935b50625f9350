package devices

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/utils/clock"
)

// Defaults for Config fields left zero.
const (
	// DefaultEventWait bounds one EventSet.Wait call; it is also the worst-case
	// latency for a watcher to notice ctx cancellation or Shutdown.
	DefaultEventWait = time.Second
	// DefaultFabricPollInterval is the GetGpuFabricInfo polling period.
	DefaultFabricPollInterval = time.Second
	// DefaultFabricTimeout bounds WaitFabricCompleted on the injected clock.
	DefaultFabricTimeout = 5 * time.Minute
	// DefaultLogEvery rate-limits repeated warning lines (same key).
	DefaultLogEvery = time.Minute
)

// Symbols introduced in later drivers. go-nvml links every nvml* symbol
// lazily, so calling one the loaded driver lacks kills the process; these are
// looked up once at Init and treated as "not supported" when absent.
const (
	symRemoveGpuV2        = "nvmlDeviceRemoveGpu_v2"
	symRemappedRows       = "nvmlDeviceGetRemappedRows"
	symGpuFabricInfo      = "nvmlDeviceGetGpuFabricInfo"
	symNvLinkRemoteDevice = "nvmlDeviceGetNvLinkRemoteDeviceType"
)

var optionalSymbols = []string{symRemoveGpuV2, symRemappedRows, symGpuFabricInfo, symNvLinkRemoteDevice}

// Config builds a Manager. Only NVML-facing code lives behind it; callers
// (the agent, the gpu-reset driver, doctor) use the verbs on *Manager.
type Config struct {
	// NVML is the library. nil means nvml.New() (optionally with LibraryPath),
	// so callers outside this package never import go-nvml. Tests pass
	// dgxh100.New() / dgxa100.New().
	NVML Library
	// LibraryPath overrides libnvidia-ml.so.1 when NVML is nil.
	LibraryPath string
	// Logger; nil discards.
	Logger *slog.Logger
	// Clock drives every wait and timestamp; nil means the real clock.
	Clock clock.Clock
	// IgnoredXIDs are application XIDs that never make a GPU unhealthy.
	// nil means DefaultIgnoredXIDs(); an empty non-nil slice ignores none.
	IgnoredXIDs []uint64
	// EventWait is the timeout of one EventSet.Wait (ms resolution).
	EventWait time.Duration
	// FabricPollInterval and FabricTimeout drive WaitFabricCompleted.
	FabricPollInterval time.Duration
	FabricTimeout      time.Duration
	// LogEvery rate-limits repeated warnings; 0 means DefaultLogEvery.
	LogEvery time.Duration
	// NVSwitchDevices is the nvidia-nvswitch driver's device list: an
	// entry there makes the host an NVSwitch system whatever NVML's live
	// fabric state and NVLink state say (links NOT_STARTED before Fabric
	// Manager runs can hide the switches; NVIDIA's driver container looks
	// here too). "" means DefaultNVSwitchDevices; NoNVSwitchDevices reads
	// none (tests on a mock).
	NVSwitchDevices string
}

// DefaultNVSwitchDevices is where the nvidia-nvswitch module lists the
// NVSwitches of the host.
const DefaultNVSwitchDevices = "/proc/driver/nvidia-nvswitch/devices"

// NoNVSwitchDevices as Config.NVSwitchDevices reads no device list.
const NoNVSwitchDevices = "-"

// DefaultIgnoredXIDs returns the application XIDs the NVIDIA device plugin
// ignores (internal/rm/health.go): 13 graphics engine exception, 31 GPU
// memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
// 68 video processor exception, 109 context-switch timeout. They point at
// the workload, not the GPU. The full per-code table is ClassifyXID's.
func DefaultIgnoredXIDs() []uint64 { return []uint64{13, 31, 43, 45, 68, 109} }

// Library is go-nvml's interface to the NVML library (the host's, or a
// mock in tests): the name other packages use, so that only this one
// imports go-nvml (STYLE rule 2, deps_test.go).
type Library = nvml.Interface

// Manager owns the NVML lifecycle and every NVML call of the agent.
//
// Concurrency: every NVML call runs under mu.RLock with initialized checked,
// so Shutdown (mu.Lock) never unloads the library under a running call. No
// method takes the read lock twice on one goroutine.
type Manager struct {
	// nvswitchDir is Config.NVSwitchDevices.
	nvswitchDir string
	lib         nvml.Interface
	log         *slog.Logger
	clk         clock.Clock
	ignored     map[uint64]bool
	// ignoredCfg is Config.IgnoredXIDs as given (nil: the table's default).
	ignoredCfg []uint64
	// libPath is Config.LibraryPath: named when it cannot be loaded.
	libPath string

	eventWait     time.Duration
	fabricPoll    time.Duration
	fabricTimeout time.Duration

	mu          sync.RWMutex
	initialized bool
	symbols     map[string]bool
	stop        chan struct{} // closed by Shutdown; stops watchers
	watchers    sync.WaitGroup

	xmu  sync.Mutex
	xids map[string][]uint64 // latched critical XIDs per UUID since ClearXIDs

	limit *logLimiter
}

// New validates cfg and returns a Manager. It does not touch NVML; call Init.
func New(cfg Config) (*Manager, error) {
	if cfg.NVML == nil {
		var opts []nvml.LibraryOption
		if cfg.LibraryPath != "" {
			opts = append(opts, nvml.WithLibraryPath(cfg.LibraryPath))
		}
		cfg.NVML = nvml.New(opts...)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	ignoredCfg := cfg.IgnoredXIDs
	if cfg.IgnoredXIDs == nil {
		cfg.IgnoredXIDs = DefaultIgnoredXIDs()
	}
	if cfg.EventWait == 0 {
		cfg.EventWait = DefaultEventWait
	}
	if cfg.FabricPollInterval == 0 {
		cfg.FabricPollInterval = DefaultFabricPollInterval
	}
	if cfg.FabricTimeout == 0 {
		cfg.FabricTimeout = DefaultFabricTimeout
	}
	if cfg.LogEvery == 0 {
		cfg.LogEvery = DefaultLogEvery
	}
	if cfg.NVSwitchDevices == "" {
		cfg.NVSwitchDevices = DefaultNVSwitchDevices
	}
	if cfg.EventWait < time.Millisecond || cfg.FabricPollInterval < 0 || cfg.FabricTimeout < 0 || cfg.LogEvery < 0 {
		return nil, errors.New("devices: config: EventWait must be ≥1ms and durations must not be negative")
	}
	ignored := make(map[uint64]bool, len(cfg.IgnoredXIDs))
	for _, x := range cfg.IgnoredXIDs {
		ignored[x] = true
	}
	return &Manager{
		lib:           cfg.NVML,
		log:           cfg.Logger,
		clk:           cfg.Clock,
		ignored:       ignored,
		ignoredCfg:    ignoredCfg,
		libPath:       cfg.LibraryPath,
		eventWait:     cfg.EventWait,
		fabricPoll:    cfg.FabricPollInterval,
		fabricTimeout: cfg.FabricTimeout,
		xids:          map[string][]uint64{},
		limit:         newLogLimiter(cfg.Clock, cfg.LogEvery),
		nvswitchDir:   cfg.NVSwitchDevices,
	}, nil
}

// Init loads and initializes NVML. It is idempotent while initialized.
// No library or no driver gives an error matching ErrNoNVML (and the
// nvml.Return): "devices: no NVML (Init: ERROR_LIBRARY_NOT_FOUND)".
// Call Shutdown only when Init returned nil.
func (m *Manager) Init() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.initialized {
		return nil
	}
	if m.stop != nil {
		return errors.New("devices: Init during Shutdown")
	}
	ret := m.lib.Init()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
		m.log.Info("NVML not available; GPU features disabled", "reason", ReturnName(ret), "library", m.libPath)
		if m.libPath != "" {
			return fmt.Errorf("%w: loading %s (Init: %w)", ErrNoNVML, m.libPath, codeError{ret})
		}
		return fmt.Errorf("%w (Init: %w)", ErrNoNVML, codeError{ret})
	default:
		return nvmlErr("", "Init", ret)
	}
	m.symbols = make(map[string]bool, len(optionalSymbols))
	for _, s := range optionalSymbols {
		m.symbols[s] = m.lookupSymbol(s)
	}
	m.initialized = true
	m.stop = make(chan struct{})
	if v, ret := m.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		m.log.Info("NVML initialized", "driver", v)
	}
	return nil
}

func (m *Manager) lookupSymbol(name string) bool {
	ext := m.lib.Extensions()
	if ext == nil {
		return false
	}
	return ext.LookupSymbol(name) == nil
}

// Shutdown stops event watchers and shuts NVML down. It is idempotent and a
// no-op when Init did not succeed.
func (m *Manager) Shutdown() error {
	m.mu.Lock()
	if !m.initialized {
		m.mu.Unlock()
		return nil
	}
	m.initialized = false // new calls now fail with ErrNotInitialized
	stop := m.stop
	m.mu.Unlock()

	close(stop)
	m.watchers.Wait() // each exits within one EventWait and frees its set

	m.mu.Lock()
	defer m.mu.Unlock()
	m.stop = nil
	if err := nvmlErr("", "Shutdown", m.lib.Shutdown()); err != nil {
		return err
	}
	m.log.Info("NVML shut down")
	return nil
}

// Reinit opens a new NVML session: Shutdown (its error logged, not
// returned: a session whose driver went away may not close cleanly) and
// Init, which loads the library again — after a driver upgrade, the new
// one. Call it when a call failed with DriverGone; its error is Init's.
func (m *Manager) Reinit() error {
	if err := m.Shutdown(); err != nil {
		m.log.Warn("closing the old NVML session failed; opening a new one anyway", "err", err)
	}
	if err := m.Init(); err != nil {
		return err
	}
	m.log.Info("NVML session opened again")
	return nil
}

// acquire takes the read lock when NVML is initialized. Callers defer the
// returned release.
func (m *Manager) acquire() (nvml.Interface, func(), error) {
	m.mu.RLock()
	if !m.initialized {
		m.mu.RUnlock()
		return nil, nil, ErrNotInitialized
	}
	return m.lib, m.mu.RUnlock, nil
}

// has reports whether an optional symbol is present. Call under acquire.
func (m *Manager) has(sym string) bool { return m.symbols[sym] }

// deviceByUUID resolves a handle. Handles are never cached: after a reset
// (remove/discover) every handle and index is invalid.
func deviceByUUID(lib nvml.Interface, uuid string) (nvml.Device, error) {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	switch ret {
	case nvml.SUCCESS:
		return dev, nil
	case nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
		return nil, fmt.Errorf("%w %s (DeviceGetHandleByUUID: %w)", ErrUnknownGPU, uuid, codeError{ret})
	}
	return nil, nvmlErr(uuid, "DeviceGetHandleByUUID", ret)
}

// logLimiter lets one line per key through every interval (STYLE 13).
type logLimiter struct {
	clk   clock.PassiveClock
	every time.Duration
	mu    sync.Mutex
	last  map[string]time.Time
}

func newLogLimiter(clk clock.PassiveClock, every time.Duration) *logLimiter {
	return &logLimiter{clk: clk, every: every, last: map[string]time.Time{}}
}

func (l *logLimiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clk.Now()
	if t, ok := l.last[key]; ok && now.Sub(t) < l.every {
		return false
	}
	l.last[key] = now
	return true
}
