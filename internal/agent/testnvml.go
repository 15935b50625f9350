//go:build lifecycle_testnvml

package agent

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// EnvTestNVML names the go-nvml mock server (devicestest.Model: dgxh100,
// dgxa100) a test build uses instead of the host's NVML. Only builds with
// the tag lifecycle_testnvml read it; release builds do not contain this
// file.
const EnvTestNVML = "LIFECYCLE_AGENT_TEST_NVML"

// EnvTestNVMLFaults sets GPU faults in that mock at start, so that a test
// of the real binary sees what the GPU monitor makes of them: a comma list
// of INDEX:FAULT, FAULT a recovery action's name (GPU_RESET, NODE_REBOOT,
// DRAIN_AND_RESET, …), REMAP_FAILURE (row remapping failed),
// RESET_REQUIRED (its state reads answer ERROR_RESET_REQUIRED) or
// PERSISTENCE (persistence mode on). A fault the test build cannot read
// stops the agent at start.
const EnvTestNVMLFaults = "LIFECYCLE_AGENT_TEST_NVML_FAULTS"

// EnvTestKernelLog names a file in /dev/kmsg's record format that the GPU
// monitor reads for XIDs while the mock is on; unset, it reads none (the
// mock's GPUs are not the host's).
const EnvTestKernelLog = "LIFECYCLE_AGENT_TEST_KERNEL_LOG"

// EnvTestGPUDevices names a directory where the mock's GPUs get device
// node files (devicestest.Fleet.DeviceNodes): the agent's NVML session
// holds them open as libnvidia-ml does /dev/nvidia*, the gpu-reset driver
// looks for their holders there, and nvidia-smi is the fleet's double
// (Fleet.RunSMI, run in this process: the mock's GPUs exist only here),
// which refuses a reset while any process holds a node — the agent too.
// gpu.resetMethod auto finds that double as /usr/bin/nvidia-smi.
const EnvTestGPUDevices = "LIFECYCLE_AGENT_TEST_GPU_DEVICES"

// EnvTestGPUResetLog names a file where the mock appends one line per GPU
// reset that took effect: "reset <uuid> session=<open|closed>
// eventsets=<n>" — whether this process held NVML and how many event sets
// (the health monitor's XID watcher) were live at that moment.
const EnvTestGPUResetLog = "LIFECYCLE_AGENT_TEST_GPU_RESET_LOG"

// EnvTestGPUResetTakes makes each of the mock's nvidia-smi resets take
// this long (a Go duration; devicestest.Fleet.SlowReset), killed if the
// agent cancels it meanwhile, so that a test can cancel an event or stop
// the agent while a reset runs.
const EnvTestGPUResetTakes = "LIFECYCLE_AGENT_TEST_GPU_RESET_TAKES"

// EnvTestNoGPUSession=1 builds the gpu-reset driver without the agent's
// GPU session, as the agent was wired before it paused its own hold on the
// GPUs: the test that proves the wiring shows that it then fails.
const EnvTestNoGPUSession = "LIFECYCLE_AGENT_TEST_NO_GPU_SESSION"

// EnvTestNVMLAfter names a file: until it exists the mock is not there
// (as NVML under a GPU Operator driver root before the driver pod runs),
// so a test sees the agent start its GPU stack once it appears.
const EnvTestNVMLAfter = "LIFECYCLE_AGENT_TEST_NVML_AFTER"

func init() {
	testNVML = func(log *slog.Logger) (testGPU, bool) {
		model := os.Getenv(EnvTestNVML)
		if model == "" {
			return testGPU{}, false
		}
		if after := os.Getenv(EnvTestNVMLAfter); after != "" {
			if _, err := os.Stat(after); err != nil {
				return testGPU{}, false
			}
		}
		log.Warn("TEST BUILD: NVML is go-nvml's mock server, not the host's library", "model", model)
		kernelLog = os.Getenv(EnvTestKernelLog)
		f := devicestest.New(devicestest.Model(model))
		f.StableUUIDs() // a restarted agent finds the GPUs it journaled
		if faults := os.Getenv(EnvTestNVMLFaults); faults != "" {
			if err := setFaults(f, faults); err != nil {
				panic(fmt.Sprintf("%s=%q: %v", EnvTestNVMLFaults, faults, err))
			}
			log.Warn("TEST BUILD: GPU faults set in the mock", "faults", faults)
		}
		tg := testGPU{lib: f.NVML()}
		if p := os.Getenv(EnvTestGPUResetLog); p != "" {
			w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
			if err != nil {
				panic(fmt.Sprintf("%s=%q: %v", EnvTestGPUResetLog, p, err))
			}
			f.LogResets(w)
		}
		if v := os.Getenv(EnvTestGPUResetTakes); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				panic(fmt.Sprintf("%s=%q: %v", EnvTestGPUResetTakes, v, err))
			}
			f.SlowReset(d)
		}
		dir := os.Getenv(EnvTestGPUDevices)
		noSession := os.Getenv(EnvTestNoGPUSession) == "1"
		if dir != "" {
			if _, err := f.DeviceNodes(dir); err != nil {
				panic(fmt.Sprintf("%s=%q: %v", EnvTestGPUDevices, dir, err))
			}
			log.Warn("TEST BUILD: GPU device nodes and nvidia-smi are the mock's", "dir", dir)
		}
		if dir != "" || noSession {
			tg.driver = func(d *drivers.GPUReset) {
				if dir != "" {
					d.DevRoot, d.Runner = dir, f.SMIRunner()
					d.LookPath = func(string) (string, error) { return "/usr/bin/nvidia-smi", nil }
				}
				if noSession {
					log.Warn("TEST BUILD: the gpu-reset driver does not pause the agent's own NVML session")
					d.Session = nil
				}
			}
		}
		return tg, true
	}
}

func setFaults(f *devicestest.Fleet, list string) error {
	for _, item := range strings.Split(list, ",") {
		idx, fault, ok := strings.Cut(strings.TrimSpace(item), ":")
		i, err := strconv.Atoi(idx)
		if !ok || err != nil || i < 0 {
			return fmt.Errorf("%q: want INDEX:FAULT", item)
		}
		if fault == "PERSISTENCE" { // not a fault: persistence mode on
			f.Set(i, func(g *devicestest.GPU) { g.Persistence = true })
			continue
		}
		if fault == "REMAP_FAILURE" {
			f.Set(i, func(g *devicestest.GPU) { g.RemappedRowsFailure = true })
			continue
		}
		if fault == "RESET_REQUIRED" {
			f.Set(i, func(g *devicestest.GPU) { g.ResetRequired = true })
			continue
		}
		a := devices.RecoveryActionUnknown
		for v := devices.RecoveryActionNone; v <= devices.RecoveryActionSystemReboot; v++ {
			if v.String() == fault {
				a = v
			}
		}
		if a == devices.RecoveryActionUnknown {
			return fmt.Errorf("%q: unknown fault %q", item, fault)
		}
		f.Set(i, func(g *devicestest.GPU) { g.RecoveryAction = a })
	}
	return nil
}
