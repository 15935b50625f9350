package agent

import (
	"log/slog"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/readiness"
)

// readinessOf is readiness.* as the drivers run it: GPUHealthy must be True
// where the agent runs the GPU stack (gpu), besides readiness.conditions.
func readinessOf(cfg *config.Config, api readiness.API, clk clock.Clock, gpu bool) drivers.Readiness {
	rc := readiness.Config{Enabled: slices.Clone(cfg.Readiness.Checks), CommandTimeout: cfg.Readiness.CommandTimeout,
		Timeout: cfg.Readiness.Timeout, Uncordon: cfg.Readiness.OnTimeout == config.ReadinessUncordon,
		Conditions: map[string]corev1.ConditionStatus{}}
	if rc.Enabled == nil {
		rc.Enabled = []string{} // configured as none
	}
	if cfg.Readiness.Command != "" {
		rc.Command = []string{"/bin/sh", "-c", cfg.Readiness.Command}
	}
	for _, c := range cfg.Readiness.Conditions {
		t, st, _ := strings.Cut(c, "=") // checked at load
		rc.Conditions[t] = corev1.ConditionStatus(st)
	}
	if gpu {
		rc.Conditions[devices.ConditionType] = corev1.ConditionTrue
	}
	// Checked at load (readiness.daemonSets.*).
	rc.DaemonSets, _ = readiness.NewDaemonSetFilter(cfg.Readiness.DaemonSets.Namespaces, cfg.Readiness.DaemonSets.Selector)
	return drivers.Readiness{Config: rc, API: api, Clock: clk}
}

// rebootConfigOf is reboot.* and readiness.* as the reboot and os-upgrade
// drivers run them, and the boot after a shutdown (engine.Config.ShutdownReturn).
func rebootConfigOf(cfg *config.Config, api readiness.API, clk clock.Clock, nvml bool) drivers.RebootConfig {
	return drivers.RebootConfig{ReadyTimeout: cfg.Reboot.ReadyTimeout, DrainRetryDelay: cfg.Drain.EvictRetryDelay, DrainTimeout: cfg.Drain.Timeout, Clock: clk,
		Readiness: readinessOf(cfg, api, clk, nvml)}
}

// builtinDrivers returns the drivers the configuration enables, plus one
// per exec driver of the local config. The shutdown driver is not among
// them: logind starts it, nothing claims it (see engine.PrepareShutdown).
func builtinDrivers(cfg *config.Config, log *slog.Logger, clk clock.Clock, nvml bool, api readiness.API) []drivers.Driver {
	rc := rebootConfigOf(cfg, api, clk, nvml)
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
