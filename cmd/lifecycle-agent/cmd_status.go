package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"

	"github.com/spf13/cobra"
)

type statusOptions struct {
	Output string // outText or outJSON
}

func newStatusCmd(e *env) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what the running agent is doing",
		Long: `Ask the running agent, over its control socket, for the event it holds, the
current step, whether it hears from the API server, host.mode (a node in
simulate mode performs no reboot: shown first, loudly), queued local
requests, pending status writes, the published drivers and the ones it does
not publish (with why).

state: is "starting" until the agent has published its transitions and
watches its events (it resumes journaled events before that), then "idle",
"event <name>: step <step>", "event <name>: finishing (...)", "event <name>:
waiting for a disruption slot (...)" or "shutting down".`,
		Args:        noArgs,
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Output, err = outputOf(cmd, o.Output, outText, outJSON); err != nil {
				return err
			}
			return failed(runStatus(cmd.Context(), e, o))
		},
	}
	addOutputFlags(cmd, &o.Output, outText, outJSON)
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
	if o.Output == outJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	if s.HostMode == config.HostModeSimulate {
		fmt.Fprintf(w, "mode:\tSIMULATE: reboots, shutdowns and host commands are journaled, NOT performed (host.mode: simulate)\n")
	}
	state := s.State
	if state == "starting" && !s.API.Reachable {
		state += " (publishes its transitions once the API server answers)"
	}
	fmt.Fprintf(w, "node:\t%s\nidentity:\t%s\nstate:\t%s\napi:\t%s\n", s.Node, s.Identity, state, apiLine(s.API, time.Now()))
	if s.HostMode != config.HostModeSimulate {
		fmt.Fprintf(w, "mode:\t%s\n", orDefault(s.HostMode, "unknown"))
	}
	fmt.Fprintf(w, "queued:\t%d local request(s) waiting for the API server\noutbox:\t%d pending status write(s)\ndrivers:\t%s\n",
		s.Queued, s.Outbox, strings.Join(s.Drivers, ", "))
	for _, u := range s.Unpublished {
		fmt.Fprintf(w, "not published:\t%s: %s\n", u.Driver, u.Reason)
	}
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

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
