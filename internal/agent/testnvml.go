//go:build lifecycle_testnvml

package agent

import (
	"log/slog"
	"os"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
)

// EnvTestNVML names the go-nvml mock server (devicestest.Model: dgxh100,
// dgxa100) a test build uses instead of the host's NVML. Only builds with
// the tag lifecycle_testnvml read it; release builds do not contain this
// file.
const EnvTestNVML = "LIFECYCLE_AGENT_TEST_NVML"

func init() {
	testNVML = func(log *slog.Logger) (devices.Library, bool) {
		model := os.Getenv(EnvTestNVML)
		if model == "" {
			return nil, false
		}
		log.Warn("TEST BUILD: NVML is go-nvml's mock server, not the host's library", "model", model)
		f := devicestest.New(devicestest.Model(model))
		f.StableUUIDs() // a restarted agent finds the GPUs it journaled
		return f.NVML(), true
	}
}
