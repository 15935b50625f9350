package agent

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/notify"
)

// newNotifier builds the notifier of notifications.urls (nil when none is
// configured; its metrics are registered either way).
func newNotifier(cfg *config.Config, j *journal.Journal, reg prometheus.Registerer, log *slog.Logger, clk clock.Clock) (*notify.Notifier, error) {
	m := notify.NewMetrics(reg)
	if len(cfg.Notifications.URLs) == 0 {
		return nil, nil
	}
	ts, err := notify.Parse(cfg.Notifications.URLs)
	if err != nil {
		return nil, err // refused at load already; a second look costs nothing
	}
	services := make([]string, len(ts))
	for i, t := range ts {
		services[i] = t.String()
	}
	log.Info("notifications on", "targets", services)
	return &notify.Notifier{Journal: j, Targets: ts, Timeout: cfg.Notifications.Timeout, Log: log, Clock: clk, Metrics: m}, nil
}

// startNotifier runs n (if any) until the returned function is called,
// which returns as soon as n has stopped touching the journal.
func startNotifier(ctx context.Context, n *notify.Notifier) (stop func()) {
	if n == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
