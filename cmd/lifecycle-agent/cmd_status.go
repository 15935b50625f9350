package main

import (
	"context"

	"github.com/spf13/cobra"
)

type statusOptions struct {
	JSON bool // machine-readable output
}

func newStatusCmd(e *env) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what the running agent is doing",
		Long: `Ask the running agent, over its control socket, for the event it holds, the
current step, queued status writes and the enabled drivers.`,
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return failed(runStatus(cmd.Context(), e, o))
		},
	}
	cmd.Flags().BoolVar(&o.JSON, "json", false, "print JSON instead of text")
	return cmd
}

// runStatus is `lifecycle-agent status`.
func runStatus(ctx context.Context, e *env, o statusOptions) error {
	return notImplemented(issueStatus)
}
