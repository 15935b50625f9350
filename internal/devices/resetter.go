package devices

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Resetter resets a set of GPUs, named by UUID. Implementations refuse what
// they can check (persistence on, GPU in use) and say in the error what they
// left behind after a partial failure.
type Resetter interface {
	Reset(ctx context.Context, uuids []string) error
}

// Describer is implemented by Resetters that can say, in one line, what
// Reset would do; dry runs log it.
type Describer interface {
	Describe(uuids []string) string
}

// Describe returns r's plan for uuids, or a generic line when r is not a
// Describer.
func Describe(r Resetter, uuids []string) string {
	if d, ok := r.(Describer); ok {
		return d.Describe(uuids)
	}
	return fmt.Sprintf("%T.Reset(%s)", r, strings.Join(uuids, ","))
}

// ResetMethod selects a Resetter (config `resetMethod`).
type ResetMethod string

const (
	ResetMethodAuto ResetMethod = "auto"       // nvidia-smi; an error when it is not found (never nvml)
	ResetMethodSMI  ResetMethod = "nvidia-smi" // nvidia-smi --gpu-reset -i <uuid,…>
	ResetMethodNVML ResetMethod = "nvml"       // drain → query → remove → discover
)

// ParseResetMethod accepts "", auto, nvidia-smi and nvml ("" means auto).
func ParseResetMethod(s string) (ResetMethod, error) {
	switch ResetMethod(strings.TrimSpace(s)) {
	case "", ResetMethodAuto:
		return ResetMethodAuto, nil
	case ResetMethodSMI:
		return ResetMethodSMI, nil
	case ResetMethodNVML:
		return ResetMethodNVML, nil
	}
	return "", fmt.Errorf("devices: resetMethod %q: want %s, %s or %s", s, ResetMethodSMI, ResetMethodNVML, ResetMethodAuto)
}

// CommandRunner runs a command and returns its output. The agent injects its
// host exec runner; ExecRunner is the os/exec default.
type CommandRunner func(ctx context.Context, name string, args ...string) (stdout, stderr []byte, err error)

// Exec defaults.
const (
	DefaultSMITimeout = 5 * time.Minute // a reset scrubs ECC: seconds per GPU
	execWaitDelay     = 10 * time.Second
)

// ExecRunner runs commands with os/exec, a context timeout (0: none beyond
// ctx) and cmd.WaitDelay so a child holding the pipes cannot hang us.
func ExecRunner(timeout time.Duration) CommandRunner {
	return func(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.WaitDelay = execWaitDelay
		err := cmd.Run()
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return stdout.Bytes(), stderr.Bytes(), err
	}
}

// ResetterConfig chooses and builds a Resetter.
type ResetterConfig struct {
	Method ResetMethod // "" means auto
	// DryRun: the Resetter logs Describe() and does nothing.
	DryRun bool
	// Runner runs nvidia-smi; nil means ExecRunner(SMITimeout).
	Runner     CommandRunner
	SMITimeout time.Duration // 0 means DefaultSMITimeout
	// LookPath finds nvidia-smi for auto; nil means exec.LookPath.
	LookPath func(file string) (string, error)
	// SMIPath is the nvidia-smi binary; "" means "nvidia-smi" on PATH
	// (what the agent uses).
	SMIPath string
	// BeforeRemove (NVML route) is called with each GPU's UUID right before
	// its removal from the bus; an error stops the reset before that GPU.
	// The gpu-reset driver journals the unplug there, so that a crash
	// between removal and rediscovery rediscovers on replay.
	BeforeRemove func(uuid string) error
}

func smiPath(p string) string {
	if p == "" {
		return "nvidia-smi"
	}
	return p
}

// NewResetter builds the configured Resetter.
func (m *Manager) NewResetter(cfg ResetterConfig) (Resetter, error) {
	method := cfg.Method
	if method == "" {
		method = ResetMethodAuto
	}
	if _, err := ParseResetMethod(string(method)); err != nil {
		return nil, err
	}
	lookPath := cfg.LookPath
	if lookPath == nil {
		lookPath = exec.LookPath
	}
	runner := cfg.Runner
	if runner == nil {
		t := cfg.SMITimeout
		if t == 0 {
			t = DefaultSMITimeout
		}
		runner = ExecRunner(t)
	}
	var r Resetter
	switch method {
	case ResetMethodSMI:
		r = &SMIResetter{Path: smiPath(cfg.SMIPath), Run: runner, Log: m.log}
	case ResetMethodNVML:
		r = &NVMLResetter{m: m, BeforeRemove: cfg.BeforeRemove}
	case ResetMethodAuto:
		// Never a silent fallback to PCI remove/rediscover: that route
		// detaches the GPU from the bus and is chosen only by name.
		p, err := lookPath(smiPath(cfg.SMIPath))
		if err != nil {
			return nil, fmt.Errorf("%w: %s not found (%w); install it, or choose gpu.resetMethod=nvml (PCI remove and rediscover) explicitly",
				ErrNoResetRoute, smiPath(cfg.SMIPath), err)
		}
		r = &SMIResetter{Path: p, Run: runner, Log: m.log}
	}
	m.log.Info("GPU reset method chosen", "method", string(method), "resetter", fmt.Sprintf("%T", r), "dryRun", cfg.DryRun)
	if cfg.DryRun {
		r = m.dryRun(r)
	}
	return r, nil
}

// SMIResetter resets with `nvidia-smi --gpu-reset -i <uuid,…>`, the route
// NVSentinel uses. nvidia-smi refuses when the GPU is in use or persistence
// mode is on; its output is carried in the error.
type SMIResetter struct {
	Path string // nvidia-smi binary; "" means "nvidia-smi"
	Run  CommandRunner
	Log  *slog.Logger
}

// Args is the argv after the binary name.
func (r *SMIResetter) Args(uuids []string) []string {
	return []string{"--gpu-reset", "-i", strings.Join(uuids, ",")}
}

func (r *SMIResetter) path() string {
	if r.Path == "" {
		return "nvidia-smi"
	}
	return r.Path
}

// Describe implements Resetter.
func (r *SMIResetter) Describe(uuids []string) string {
	return "run " + r.path() + " " + strings.Join(r.Args(uuids), " ")
}

// Reset implements Resetter.
func (r *SMIResetter) Reset(ctx context.Context, uuids []string) error {
	if len(uuids) == 0 {
		return errors.New("devices: SMIResetter: no GPUs given")
	}
	run := r.Run
	if run == nil {
		run = ExecRunner(DefaultSMITimeout)
	}
	args := r.Args(dedupe(uuids))
	if r.Log != nil {
		r.Log.Info("resetting GPUs", "gpus", strings.Join(uuids, ","), "cmd", r.path()+" "+strings.Join(args, " "))
	}
	stdout, stderr, err := run(ctx, r.path(), args...)
	if err != nil {
		return fmt.Errorf("devices: %s %s: %w (stdout: %q, stderr: %q)",
			r.path(), strings.Join(args, " "), err, clip(stdout), clip(stderr))
	}
	return nil
}

func clip(b []byte) string {
	const limit = 4096
	s := strings.TrimSpace(string(b))
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

// NVMLResetter resets through NVML's drain-state group (there is no
// nvmlDeviceReset): for each GPU DeviceModifyDrainState(ENABLED) →
// DeviceQueryDrainState → DeviceRemoveGpu_v2(DETACH_GPU_REMOVE, PCIE_LINK_KEEP)
// (DeviceRemoveGpu on drivers without _v2); then one DeviceDiscoverGpus (a
// full PCI rescan, scrubbing ECC: seconds per GPU) and every UUID is
// re-resolved. Needs root and Linux. Refuses when persistence mode is on.
type NVMLResetter struct {
	m *Manager
	// BeforeRemove: see ResetterConfig.BeforeRemove.
	BeforeRemove func(uuid string) error
}

// NVMLResetter returns the NVML-route Resetter bound to m.
func (m *Manager) NVMLResetter() *NVMLResetter { return &NVMLResetter{m: m} }

// Rediscover runs DeviceDiscoverGpus (a PCI rescan that brings back GPUs
// removed by the NVML route) and then checks that every UUID given is
// visible again. The gpu-reset driver calls it on replay when the journal
// says a GPU was unplugged and the agent stopped before the rescan.
func (m *Manager) Rediscover(uuids []string) error {
	lib, release, err := m.acquire()
	if err != nil {
		return err
	}
	defer release()
	if _, ret := lib.DeviceDiscoverGpus(); ret != nvml.SUCCESS {
		return nvmlErr("", "DeviceDiscoverGpus", ret)
	}
	var missing []string
	for _, u := range uuids {
		if _, err := deviceByUUID(lib, u); err != nil {
			missing = append(missing, u)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s still missing after DeviceDiscoverGpus", ErrUnknownGPU, strings.Join(missing, ", "))
	}
	m.log.Info("GPUs rediscovered", "gpus", len(uuids))
	return nil
}

type resetTarget struct {
	uuid string
	pci  nvml.PciInfo
}

// Describe implements Resetter.
func (r *NVMLResetter) Describe(uuids []string) string {
	var names []string
	lib, release, err := r.m.acquire()
	if err == nil {
		defer release()
	}
	for _, u := range uuids {
		name := u
		if err == nil {
			if dev, derr := deviceByUUID(lib, u); derr == nil {
				if pci, ret := dev.GetPciInfo(); ret == nvml.SUCCESS {
					name += " [" + busID(pci) + "]"
				}
			}
		}
		names = append(names, name)
	}
	remove := "DeviceRemoveGpu_v2(DETACH_GPU_REMOVE, PCIE_LINK_KEEP)"
	if err == nil && !r.m.has(symRemoveGpuV2) {
		remove = "DeviceRemoveGpu"
	}
	return fmt.Sprintf("NVML reset of %s: DeviceModifyDrainState(ENABLED) → DeviceQueryDrainState → %s per GPU, then DeviceDiscoverGpus and re-resolve by UUID",
		strings.Join(names, ", "), remove)
}

// Reset implements Resetter. When a removal fails, the failing GPU is taken
// out of the draining state and GPUs already removed are rediscovered before
// the error (naming the GPU and the NVML return) is returned.
func (r *NVMLResetter) Reset(ctx context.Context, uuids []string) error {
	if len(uuids) == 0 {
		return errors.New("devices: NVMLResetter: no GPUs given")
	}
	lib, release, err := r.m.acquire()
	if err != nil {
		return err
	}
	defer release()
	log := r.m.log
	uuids = dedupe(uuids)

	// Resolve everything and check persistence before touching anything.
	targets := make([]resetTarget, 0, len(uuids))
	for _, u := range uuids {
		dev, err := deviceByUUID(lib, u)
		if err != nil {
			return err
		}
		pci, ret := dev.GetPciInfo()
		if err := nvmlErr(u, "GetPciInfo", ret); err != nil {
			return err
		}
		pm, ret := dev.GetPersistenceMode()
		if ret != nvml.ERROR_NOT_SUPPORTED {
			if err := nvmlErr(u, "GetPersistenceMode", ret); err != nil {
				return err
			}
			if pm == nvml.FEATURE_ENABLED {
				return fmt.Errorf("%w: %s: persistence mode is on (it counts as an attachment); turn it off first", ErrPreconditions, u)
			}
		}
		targets = append(targets, resetTarget{uuid: u, pci: pci})
	}

	v2 := r.m.has(symRemoveGpuV2)
	removed := 0
	var resetErr error
	for _, t := range targets {
		if err := ctx.Err(); err != nil {
			resetErr = fmt.Errorf("devices: reset stopped before %s: %w", t.uuid, err)
			break
		}
		if r.BeforeRemove != nil {
			if err := r.BeforeRemove(t.uuid); err != nil {
				resetErr = fmt.Errorf("devices: recording the removal of %s: %w", t.uuid, err)
				break
			}
		}
		if err := r.detach(lib, t, v2); err != nil {
			resetErr = err
			break
		}
		removed++
		log.Info("GPU removed", "gpu", t.uuid, "pci", busID(t.pci))
	}
	if removed > 0 {
		// Always bring back what was removed, also after a later failure.
		if _, ret := lib.DeviceDiscoverGpus(); ret != nvml.SUCCESS {
			return errors.Join(resetErr, nvmlErr("", "DeviceDiscoverGpus", ret))
		}
		log.Info("GPUs rediscovered", "removed", removed)
	}
	if resetErr != nil {
		return resetErr
	}

	var errs []error
	for _, t := range targets {
		dev, err := deviceByUUID(lib, t.uuid)
		if err != nil {
			errs = append(errs, fmt.Errorf("devices: %s: not found after rediscovery: %w", t.uuid, err))
			continue
		}
		if err := r.undrainIfNeeded(lib, dev, t.uuid); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *NVMLResetter) detach(lib nvml.Interface, t resetTarget, v2 bool) error {
	pci := t.pci
	if err := nvmlErr(t.uuid, "DeviceModifyDrainState", lib.DeviceModifyDrainState(&pci, nvml.FEATURE_ENABLED)); err != nil {
		return err
	}
	state, ret := lib.DeviceQueryDrainState(&pci)
	if err := nvmlErr(t.uuid, "DeviceQueryDrainState", ret); err != nil {
		r.undrain(lib, t)
		return err
	}
	if state != nvml.FEATURE_ENABLED {
		r.undrain(lib, t)
		return fmt.Errorf("devices: %s: drain state not entered after DeviceModifyDrainState", t.uuid)
	}
	var err error
	if v2 {
		err = nvmlErr(t.uuid, "DeviceRemoveGpu_v2", lib.DeviceRemoveGpu_v2(&pci, nvml.DETACH_GPU_REMOVE, nvml.PCIE_LINK_KEEP))
	} else {
		err = nvmlErr(t.uuid, "DeviceRemoveGpu", lib.DeviceRemoveGpu(&pci))
	}
	if err != nil {
		// NVML leaves the GPU draining after a failed removal.
		r.undrain(lib, t)
		return err
	}
	return nil
}

// undrain is the best-effort rollback after a failed detach.
func (r *NVMLResetter) undrain(lib nvml.Interface, t resetTarget) {
	pci := t.pci
	if err := nvmlErr(t.uuid, "DeviceModifyDrainState", lib.DeviceModifyDrainState(&pci, nvml.FEATURE_DISABLED)); err != nil {
		r.m.log.Warn("could not leave drain state after failed reset", "gpu", t.uuid, "err", err)
	}
}

// undrainIfNeeded makes sure a rediscovered GPU accepts work again.
func (r *NVMLResetter) undrainIfNeeded(lib nvml.Interface, dev nvml.Device, uuid string) error {
	pci, ret := dev.GetPciInfo()
	if err := nvmlErr(uuid, "GetPciInfo", ret); err != nil {
		return err
	}
	state, ret := lib.DeviceQueryDrainState(&pci)
	if ret != nvml.SUCCESS {
		r.m.log.Warn("drain state unreadable after rediscovery", "gpu", uuid, "err", nvmlErr(uuid, "DeviceQueryDrainState", ret))
		return nil
	}
	if state != nvml.FEATURE_ENABLED {
		return nil
	}
	return nvmlErr(uuid, "DeviceModifyDrainState", lib.DeviceModifyDrainState(&pci, nvml.FEATURE_DISABLED))
}

// dryRunResetter logs what the wrapped Resetter would do.
type dryRunResetter struct {
	inner Resetter
	m     *Manager
}

func (m *Manager) dryRun(r Resetter) Resetter {
	if _, ok := r.(*dryRunResetter); ok {
		return r
	}
	return &dryRunResetter{inner: r, m: m}
}

func (d *dryRunResetter) Describe(uuids []string) string { return Describe(d.inner, uuids) }

func (d *dryRunResetter) Reset(_ context.Context, uuids []string) error {
	d.m.log.Info("dry run: would reset GPUs", "gpus", strings.Join(uuids, ","), "plan", Describe(d.inner, uuids))
	return nil
}
