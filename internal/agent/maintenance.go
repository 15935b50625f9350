package agent

import (
	"log/slog"
	"regexp"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/maintenance"
)

// Gates builds the configured gates (gates.*), in the order they are
// evaluated: the command, the pods, Prometheus. pods lists this node's
// pods (the agent's API client). Config.Load validated every value.
func Gates(cfg *config.Config, pods maintenance.PodLister, log *slog.Logger) ([]maintenance.Gate, error) {
	var out []maintenance.Gate
	if cfg.Gates.Command != "" {
		out = append(out, &maintenance.Command{Command: cfg.Gates.Command, Timeout: cfg.Gates.CommandTimeout,
			Runner: host.NewRunner(host.RunnerConfig{Logger: log, DefaultTimeout: cfg.Gates.CommandTimeout})})
	}
	if cfg.Gates.BlockingPods != "" {
		out = append(out, &maintenance.Pods{Selector: cfg.Gates.BlockingPods, API: pods})
	}
	if cfg.Gates.Prometheus.URL != "" {
		pc := maintenance.PrometheusConfig{URL: cfg.Gates.Prometheus.URL, Timeout: cfg.Gates.Prometheus.Timeout}
		if cfg.Gates.Prometheus.AlertNames != "" {
			pc.Names = regexp.MustCompile(cfg.Gates.Prometheus.AlertNames)
		}
		if cfg.Gates.Prometheus.IgnoreAlerts != "" {
			pc.Ignore = regexp.MustCompile(cfg.Gates.Prometheus.IgnoreAlerts)
		}
		pg, err := maintenance.NewPrometheus(pc)
		if err != nil {
			return nil, err
		}
		out = append(out, pg)
	}
	return out, nil
}
