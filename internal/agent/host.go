package agent

import (
	"context"
	"log/slog"
	"path/filepath"

	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
)

// lockHooks lets the host's Reboot release and re-take the shutdown guard's
// delay lock; the guard starts after the host operations are built.
type lockHooks struct{ guard *shutdownGuard }

func (h *lockHooks) release() error {
	if h.guard != nil {
		h.guard.release()
	}
	return nil
}

func (h *lockHooks) retake(ctx context.Context) error {
	if h.guard != nil {
		return h.guard.take(ctx)
	}
	return nil
}

// newHostOps builds the host operations host.mode asks for: real ones over
// logind and systemd, or simulated ones that log and journal but perform
// nothing (their state, such as the simulated boot ID, lives next to the
// journal).
func newHostOps(cfg *config.Config, logind *host.Logind, hooks *lockHooks, log *slog.Logger, clk clock.Clock) (drivers.HostOps, error) {
	if cfg.Host.Mode == config.HostModeSimulate {
		return hostops.NewSimulated(hostops.SimulatedConfig{StateDir: filepath.Dir(cfg.JournalPath), Logger: log, Clock: clk})
	}
	return hostops.NewReal(hostops.RealConfig{Logind: logind, ReleaseLocks: hooks.release, RetakeLocks: hooks.retake, Logger: log, Clock: clk})
}
