package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
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
	return notImplemented(issueRun)
}
