package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"

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

// apiLine is status's "api:" line: whether the agent hears from the API
// server, since when not, and the last error.
func apiLine(a engine.APISnapshot, now time.Time) string {
	ago := func(ts string) string {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			return ts
		}
		return fmt.Sprintf("%s (%s ago)", ts, now.Sub(t).Round(time.Second))
	}
	heard := "never"
	if a.LastHeard != "" {
		heard = ago(a.LastHeard)
	}
	if !a.Reachable {
		return fmt.Sprintf("UNREACHABLE since %s; last heard %s; last error: %s", ago(a.UnreachableSince), heard, a.LastError)
	}
	line := "reachable, last heard " + heard
	if !a.WatchSynced {
		line += "; event watch not synced yet"
	}
	return line
}

// runStatus is `lifecycle-agent status`.
func runStatus(ctx context.Context, e *env, o statusOptions) error {
	s, err := daemon.StatusFromSocket(ctx, e.cfg.SocketPath)
	if err != nil {
		return err
	}
	if o.JSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "node:\t%s\nidentity:\t%s\nstate:\t%s\napi:\t%s\noutbox:\t%d pending status write(s)\ndrivers:\t%s\n",
		s.Node, s.Identity, s.State, apiLine(s.API, time.Now()), s.Outbox, strings.Join(s.Drivers, ", "))
	if ev := s.Event; ev != nil {
		fmt.Fprintf(w, "event:\t%s (%s, %s)\n", ev.Name, ev.Driver, ev.ClaimStatus)
		if ev.Deadline != "" {
			fmt.Fprintf(w, "deadline:\t%s\n", ev.Deadline)
		}
		if ev.Message != "" {
			fmt.Fprintf(w, "message:\t%s\n", ev.Message)
		}
		for _, st := range ev.Steps {
			fmt.Fprintf(w, "  step %s:\t%s (attempt %d)\t%s\n", st.Name, st.State, st.Attempt, st.Message)
		}
	} else {
		fmt.Fprintf(w, "event:\tnone\n")
	}
	for _, h := range s.History {
		fmt.Fprintf(w, "finished:\t%s %s %s %s\n", h.Finished, h.Name, h.Outcome, h.Message)
	}
	return w.Flush()
}
