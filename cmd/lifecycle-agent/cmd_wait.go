package main

import (
	"context"

	"github.com/spf13/cobra"
)

type waitOptions struct {
	Event string
	followOptions
}

func newWaitCmd(e *env) *cobra.Command {
	var o waitOptions
	cmd := &cobra.Command{
		Use:   "wait <event> [--timeout D] [-o text|json]",
		Short: "Wait for an event of this node to end; the exit code says how",
		Long: `Follow a LifecycleEvent of this node until it ends, through the running
agent's control socket: for a pipeline that asked for a reboot with
"lifecycle-agent request reboot -o name" and comes back after it. While the
API server does not answer, the agent answers from what it runs and from its
journal; while the agent itself does not answer (stopped, restarting), the
outcome is read from its journal's history, and the wait goes on for up to
--agent-timeout for the agent to return.`,
		Example: `  ev=$(lifecycle-agent request reboot -o name)
  # ... the node reboots; the pipeline reconnects ...
  lifecycle-agent wait "$ev" --timeout 30m`,
		Args:        exactArgs(1, "event name, e.g. 'lifecycle-agent wait worker-1-reboot-20261130-113908-438243'"),
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Event = args[0]
			if err := checkOutput(o.Output, outText, outJSON); err != nil {
				return err
			}
			return failed(runWait(cmd.Context(), e, o))
		},
	}
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, "give up waiting after this long, exit 4 (0: no limit)")
	cmd.Flags().DurationVar(&o.AgentTimeout, "agent-timeout", defaultAgentTimeout, "give up, exit 6, once the agent has not answered (and its journal not told the outcome) for this long")
	addOutputFlag(cmd, &o.Output, outText, outJSON)
	return cmd
}

// runWait is `lifecycle-agent wait`.
func runWait(ctx context.Context, e *env, o waitOptions) error {
	return follow(ctx, e, o.Event, o.followOptions)
}
