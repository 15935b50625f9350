//go:build lifecycle_testnvml

package agent

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
)

// EnvTestNVML names the go-nvml mock server (devicestest.Model: dgxh100,
// dgxa100) a test build uses instead of the host's NVML. Only builds with
// the tag lifecycle_testnvml read it; release builds do not contain this
// file.
const EnvTestNVML = "LIFECYCLE_AGENT_TEST_NVML"

// EnvTestNVMLFaults sets GPU faults in that mock at start, so that a test
// of the real binary sees what the GPU monitor makes of them: a comma list
// of INDEX:FAULT, FAULT a recovery action's name (GPU_RESET, NODE_REBOOT,
// DRAIN_AND_RESET, …) or REMAP_FAILURE (row remapping failed). A fault the
// test build cannot read stops the agent at start.
const EnvTestNVMLFaults = "LIFECYCLE_AGENT_TEST_NVML_FAULTS"

// EnvTestKernelLog names a file in /dev/kmsg's record format that the GPU
// monitor reads for XIDs while the mock is on; unset, it reads none (the
// mock's GPUs are not the host's).
const EnvTestKernelLog = "LIFECYCLE_AGENT_TEST_KERNEL_LOG"

func init() {
	testNVML = func(log *slog.Logger) (devices.Library, bool) {
		model := os.Getenv(EnvTestNVML)
		if model == "" {
			return nil, false
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
		return f.NVML(), true
	}
}

func setFaults(f *devicestest.Fleet, list string) error {
	for _, item := range strings.Split(list, ",") {
		idx, fault, ok := strings.Cut(strings.TrimSpace(item), ":")
		i, err := strconv.Atoi(idx)
		if !ok || err != nil || i < 0 {
			return fmt.Errorf("%q: want INDEX:FAULT", item)
		}
		if fault == "REMAP_FAILURE" {
			f.Set(i, func(g *devicestest.GPU) { g.RemappedRowsFailure = true })
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
