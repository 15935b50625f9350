package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

// shutdownGuard holds logind's delay lock on "shutdown" at all times and
// runs the shutdown driver when logind announces a shutdown (STYLE rule
// 10): take the lock at start; on PrepareForShutdown(true) journal and post
// within the budget, then release it; on PrepareForShutdown(false) take it
// again and revert. The *InhibitLock is kept referenced, so its fd is never
// closed by the garbage collector.
type shutdownGuard struct {
	logind *host.Logind
	eng    *engine.Engine
	budget time.Duration
	log    *slog.Logger

	mu   sync.Mutex
	lock *host.InhibitLock
}

func (g *shutdownGuard) take(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lock.Held() {
		return nil
	}
	l, err := g.logind.Inhibit(ctx, "shutdown", "lifecycle-agent", "journal, cordon and report before the node goes down", host.ModeDelay)
	if err != nil {
		return err
	}
	g.lock = l
	return nil
}

// release gives the delay lock back (after the journal step is committed,
// or before the agent's own reboot, which logind would otherwise delay).
func (g *shutdownGuard) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.lock.Release(); err != nil {
		g.log.Warn("releasing the delay inhibitor failed", "err", err)
	}
}

// run watches PrepareForShutdown until ctx ends.
//
// The revert after a cancel needs the API server (uncordon, conditions)
// and is retried until it succeeds; it runs beside the loop so that a new
// PrepareForShutdown(true) during an outage is still journaled and its
// lock released within the budget: that stops the revert first (the two
// never run at once), and the new shutdown supersedes it.
func (g *shutdownGuard) run(ctx context.Context) {
	ch, err := g.logind.WatchPrepareForShutdown(ctx)
	if err != nil {
		g.log.Warn("cannot watch logind for shutdowns; the shutdown driver is off", "err", err)
		return
	}
	var stopRevert context.CancelFunc = func() {}
	revert := func(why string) {
		stopRevert()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		stopRevert = func() { cancel(); <-done }
		go func() { defer close(done); g.revert(rctx, why) }()
	}
	defer func() { stopRevert() }()
	// A shutdown journaled in this boot while logind no longer prepares one
	// was cancelled while the agent was down (or restarting): the cancel is
	// a signal nobody replays, so revert now, as on PrepareForShutdown(false).
	// Read after subscribing: a shutdown starting now still arrives on ch.
	if preparing, err := g.logind.PreparingForShutdown(ctx); err != nil {
		g.log.Warn("cannot read logind's PreparingForShutdown; a shutdown journaled in this boot is kept", "err", err)
	} else if !preparing {
		revert("a shutdown cancelled while the agent was down")
	}
	for prepare := range ch {
		if prepare {
			stopRevert()
			start := time.Now()
			sctx, cancel := context.WithTimeout(ctx, g.budget)
			err := g.eng.PrepareShutdown(sctx)
			cancel()
			if err != nil {
				g.log.Error("shutdown: journaling failed", "err", err)
			}
			g.release()
			g.log.Info("shutdown: delay lock released", "took", time.Since(start).String())
			continue
		}
		if err := g.take(ctx); err != nil {
			g.log.Error("shutdown cancelled, but the delay lock could not be taken again", "err", err)
		}
		revert("shutdown cancelled")
	}
}

// revertRetry is the pause between tries of a revert that failed.
const revertRetry = 2 * time.Second

// revert undoes a cancelled shutdown (engine.CancelShutdown: a no-op when
// none is journaled for this boot), retrying until it succeeds or ctx ends.
func (g *shutdownGuard) revert(ctx context.Context, why string) {
	for {
		err := g.eng.CancelShutdown(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		g.log.Warn("reverting the shutdown failed; retrying", "cause", why, "err", err, "retryIn", revertRetry.String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(revertRetry):
		}
	}
}

// startShutdownGuard connects to logind, checks its InhibitDelayMaxSec
// against the budget (optionally raising it with a drop-in), takes the
// delay lock and starts watching. Without logind (no system bus) it warns
// and returns nil: the agent still runs its other drivers.
func startShutdownGuard(ctx context.Context, cfg *config.Config, l *host.Logind, eng *engine.Engine, log *slog.Logger) *shutdownGuard {
	if cfg.Shutdown.ManageLogindDropIn {
		if changed, err := l.EnsureInhibitDelay(ctx, cfg.Shutdown.Budget); err != nil {
			log.Warn("could not raise logind's InhibitDelayMaxSec", "err", err)
		} else if changed {
			log.Info("raised logind's InhibitDelayMaxSec", "dropIn", l.DropInPath(), "budget", cfg.Shutdown.Budget.String())
		}
		// The kubelet starts after us and may write a larger value.
		go func() {
			if err := l.FollowKubeletDropIn(ctx, cfg.Shutdown.Budget); err != nil {
				log.Warn("not following the kubelet's logind drop-in: restart the agent after changing the kubelet's shutdownGracePeriod", "err", err)
			}
		}()
	}
	if d, err := l.InhibitDelayMax(ctx); err != nil {
		log.Warn("no logind: the shutdown driver is off", "err", err)
		return nil
	} else if d < cfg.Shutdown.Budget {
		log.Warn("logind's InhibitDelayMaxSec is below the shutdown budget: logind will not wait that long",
			"inhibitDelayMax", d.String(), "budget", cfg.Shutdown.Budget.String(), "fix", "set shutdown.manageLogindDropIn: true, or raise InhibitDelayMaxSec")
	}
	g := &shutdownGuard{logind: l, eng: eng, budget: cfg.Shutdown.Budget, log: log}
	if err := g.take(ctx); err != nil {
		log.Warn("could not take logind's delay lock: the shutdown driver is off", "err", err)
		return nil
	}
	go g.run(ctx)
	return g
}
