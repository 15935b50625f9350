package host

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"k8s.io/utils/clock"
)

// Notifier sends sd_notify(3) messages to systemd (unit Type=notify).
// Without NOTIFY_SOCKET (not started by systemd) every call is a no-op that
// returns nil. The environment is read at each call, never unset.
type Notifier struct {
	log   *slog.Logger
	clock clock.Clock
}

// NewNotifier returns a Notifier. A nil logger discards; a nil clock is the
// real one (it times RunWatchdog).
func NewNotifier(logger *slog.Logger, clk clock.Clock) *Notifier {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Notifier{log: logger, clock: clk}
}

// Enabled reports whether systemd asked for notifications.
func (n *Notifier) Enabled() bool { return os.Getenv("NOTIFY_SOCKET") != "" }

func (n *Notifier) notify(op string, lines ...string) error {
	if _, err := daemon.SdNotify(false, strings.Join(lines, "\n")); err != nil {
		return fmt.Errorf("host: sd_notify %s: %w", op, err)
	}
	return nil
}

// statusLine formats STATUS=; a newline would start a new assignment.
func statusLine(s string) string {
	return "STATUS=" + strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
}

// Ready tells systemd that start-up finished (READY=1) with a status line.
// Send it after the journal replay and local repairs.
func (n *Notifier) Ready(status string) error {
	return n.notify("READY", daemon.SdNotifyReady, statusLine(status))
}

// Status sets the status line shown by systemctl status.
func (n *Notifier) Status(status string) error {
	return n.notify("STATUS", statusLine(status))
}

// Stopping tells systemd that shutdown of the service began.
func (n *Notifier) Stopping(status string) error {
	return n.notify("STOPPING", daemon.SdNotifyStopping, statusLine(status))
}

// ExtendTimeout asks systemd to extend the current start, stop or runtime
// timeout to d from now (EXTEND_TIMEOUT_USEC); repeat it before d passes
// during a long start or stop.
func (n *Notifier) ExtendTimeout(d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("host: sd_notify EXTEND_TIMEOUT: %w: %s", ErrInvalidArgument, d)
	}
	return n.notify("EXTEND_TIMEOUT", fmt.Sprintf("EXTEND_TIMEOUT_USEC=%d", d.Microseconds()))
}

// Watchdog sends one watchdog keep-alive (WATCHDOG=1).
func (n *Notifier) Watchdog() error {
	return n.notify("WATCHDOG", daemon.SdNotifyWatchdog)
}

// WatchdogInterval returns the unit's WatchdogSec (from WATCHDOG_USEC and
// WATCHDOG_PID), or 0 when the watchdog is off or meant for another
// process. Ping at half of it.
func (n *Notifier) WatchdogInterval() (time.Duration, error) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("host: watchdog interval: %w", err)
	}
	return d, nil
}

// RunWatchdog pings the watchdog at once and then every
// WatchdogInterval()/2 until ctx ends, as long as healthy (nil: always
// healthy) returns nil. While healthy fails no ping is sent, so systemd
// restarts a wedged agent. It returns nil at once when the watchdog is off,
// and nil when ctx ends.
func (n *Notifier) RunWatchdog(ctx context.Context, healthy func() error) error {
	interval, err := n.WatchdogInterval()
	if err != nil {
		return err
	}
	if interval <= 0 {
		return nil
	}
	period := interval / 2
	n.log.Info("watchdog enabled", "interval", interval, "ping_every", period)
	wasHealthy := true
	for {
		var herr error
		if healthy != nil {
			herr = healthy()
		}
		switch {
		case herr == nil:
			if !wasHealthy {
				n.log.Info("watchdog: healthy again; pinging")
			}
			wasHealthy = true
			if err := n.Watchdog(); err != nil {
				n.log.Warn("watchdog ping failed", "err", err)
			}
		case wasHealthy:
			// Logged once per unhealthy spell, not per tick.
			n.log.Error("watchdog: unhealthy; withholding pings so systemd restarts the agent", "err", herr)
			wasHealthy = false
		}
		t := n.clock.NewTimer(period)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}
