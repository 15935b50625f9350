package agent

import (
	"log/slog"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// builtinDrivers returns the drivers the configuration enables, plus one
// per exec driver of the local config. The shutdown driver is not among
// them: logind starts it, nothing claims it (see engine.PrepareShutdown).
func builtinDrivers(cfg *config.Config, log *slog.Logger, clk clock.Clock, nvml bool) []drivers.Driver {
	rc := drivers.RebootConfig{ReadyTimeout: cfg.Reboot.ReadyTimeout, DrainRetryDelay: cfg.Drain.EvictRetryDelay, DrainTimeout: cfg.Drain.Timeout, Clock: clk}
	all := []drivers.Driver{
		drivers.Drain{RetryDelay: cfg.Drain.EvictRetryDelay, Timeout: cfg.Drain.Timeout},
		drivers.Uncordon{},
		drivers.Reboot{RebootConfig: rc},
		drivers.OSUpgrade{RebootConfig: rc, Profiles: cfg.OSUpgrade.Profiles},
	}
	var out []drivers.Driver
	for _, d := range all {
		if cfg.DriverEnabled(d.Short(), nvml, len(cfg.OSUpgrade.Profiles) > 0) {
			out = append(out, d)
		}
	}
	for _, def := range cfg.Exec.Drivers {
		d, err := drivers.NewExec(def)
		if err != nil {
			log.Error("exec driver refused", "driver", def.Name, "err", err)
			continue
		}
		if cfg.DriverEnabled(d.Name(), nvml, false) {
			out = append(out, d)
		}
	}
	return out
}
