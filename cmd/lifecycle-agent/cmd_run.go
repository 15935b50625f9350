package main

import (
	"context"
	"sync/atomic"

	"github.com/spf13/cobra"

	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

func newRunCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent (what systemd starts)",
		Long: `Run the agent in the foreground: replay the journal, take the logind delay lock,
publish this node's LifecycleTransitions, claim and run LifecycleEvents, and
serve metrics on a loopback address. Stops on SIGTERM or SIGINT.`,
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return failed(runAgent(cmd.Context(), e))
		},
	}
	config.AddFlags(cmd.Flags(), config.RunFlags)
	return cmd
}

// runAgent is `lifecycle-agent run`. e.cfg is loaded and valid.
func runAgent(ctx context.Context, e *env) error {
	n := host.NewNotifier(e.log, nil)
	// The watchdog pings only while the engine shows progress (see
	// engine.Healthy): a wedged agent is restarted by systemd.
	var check atomic.Pointer[func() error]
	go n.RunWatchdog(ctx, func() error {
		if f := check.Load(); f != nil {
			return (*f)()
		}
		return nil
	})
	return daemon.Run(ctx, daemon.Options{
		Config:       e.cfg,
		Log:          e.log,
		CheckCommand: journalOptions().CheckCommand,
		Health:       func(f func() error) { check.Store(&f) },
		Notify: func(kind, msg string) {
			var err error
			switch kind {
			case "READY":
				err = n.Ready(msg)
			case "STATUS":
				err = n.Status(msg)
			case "STOPPING":
				err = n.Stopping(msg)
			}
			if err != nil {
				e.log.Warn("sd_notify failed", "err", err)
			}
		},
	})
}
