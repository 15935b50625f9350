package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"

	"github.com/spf13/cobra"
)

// maxParams is the API's limit on LifecycleEvent spec.parameters.
const maxParams = 32

type requestOptions struct {
	Driver  string            // "drain" or a full name such as "example.com/bios-update"
	Params  map[string]string // from --param key=value
	Wait    bool              // wait for the event to end
	Timeout time.Duration     // with Wait: give up after this long; 0 = no limit
	// AgentTimeout: with Wait, give up once the agent has not answered
	// for this long.
	AgentTimeout time.Duration
	Output       string // outText, outName or outJSON
}

func newRequestCmd(e *env) *cobra.Command {
	var (
		params []string
		o      requestOptions
	)
	cmd := &cobra.Command{
		Use:   "request <driver> [--param key=value]... [--wait [--timeout D]] [-o text|name|json]",
		Short: "Request a transition on this node (for provisioning pipelines)",
		Long: `Create a LifecycleEvent for one of this node's drivers, e.g.
"lifecycle-agent request reboot --wait". Works offline: the request is kept in
the journal and synced when the API server is reachable.

The first line printed is the event's name ("<name> created", or with
-o name the bare name), so that a pipeline can keep it and follow the event
later with "lifecycle-agent wait <name>", e.g. after the reboot it asked for.
-o json prints one JSON object per line: the event at once, then with --wait
one per change, the last with "result" and "exitCode".`,
		Example: `  lifecycle-agent request drain --param gracePeriodSeconds=60 --wait --timeout 30m
  ev=$(lifecycle-agent request reboot -o name) && lifecycle-agent wait "$ev" --timeout 30m`,
		Args:        exactArgs(1, "driver name, e.g. 'lifecycle-agent request reboot'"),
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			o.Driver = args[0]
			if o.Params, err = parseParams(params); err != nil {
				return err
			}
			for _, f := range []string{"timeout", "agent-timeout"} {
				if cmd.Flags().Changed(f) && !o.Wait {
					return usageErrorf("--%s needs --wait", f)
				}
			}
			if err := checkOutput(o.Output, outText, outName, outJSON); err != nil {
				return err
			}
			return failed(runRequest(cmd.Context(), e, o))
		},
	}
	// StringArray, not StringSlice: values may hold commas (gpus=0,1).
	cmd.Flags().StringArrayVar(&params, "param", nil, "event parameter as key=value; repeat for more")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "wait until the event ends; the exit code says how (below)")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, "with --wait: give up waiting after this long, exit 4 (0: no limit)")
	cmd.Flags().DurationVar(&o.AgentTimeout, "agent-timeout", defaultAgentTimeout, "with --wait: give up, exit 6, once the agent has not answered for this long")
	addOutputFlag(cmd, &o.Output, outText, outName, outJSON)
	return cmd
}

// parseParams turns repeated --param key=value into a map.
func parseParams(raw []string) (map[string]string, error) {
	out := make(map[string]string, len(raw))
	for _, p := range raw {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usageErrorf("--param %q: want key=value", p)
		}
		if _, dup := out[k]; dup {
			return nil, usageErrorf("--param %s given twice", k)
		}
		out[k] = v
	}
	if len(out) > maxParams {
		return nil, usageErrorf("%d parameters; at most %d", len(out), maxParams)
	}
	return out, nil
}

// runRequest is `lifecycle-agent request`: the running agent validates the
// driver and parameters, creates the event as this node (or queues it in
// the journal while the API server is unreachable) and, with --wait, this
// command follows it.
func runRequest(ctx context.Context, e *env, o requestOptions) error {
	res, err := daemon.RequestViaSocket(ctx, e.cfg.SocketPath, daemon.RequestBody{Driver: o.Driver, Params: o.Params})
	var refused *daemon.ErrRefused
	if errors.As(err, &refused) {
		return &exitError{code: exitUsage, err: errors.New(refused.Msg)}
	}
	if err != nil {
		return err
	}
	switch o.Output {
	case outName:
		fmt.Fprintln(e.stdout, res.Event)
	case outJSON:
		p := progress{Event: res.Event, Queued: res.Queued}
		if !res.Queued {
			p.ClaimStatus = orPending("", false) // created, not claimed yet
		}
		b, _ := json.Marshal(p)
		fmt.Fprintln(e.stdout, string(b))
	default:
		if res.Queued {
			fmt.Fprintf(e.stdout, "%s queued: the API server is unreachable; the agent publishes it when it returns\n", res.Event)
		} else {
			fmt.Fprintf(e.stdout, "%s created\n", res.Event)
		}
	}
	if !o.Wait {
		return nil
	}
	return follow(ctx, e, res.Event, followOptions{
		Timeout: o.Timeout, AgentTimeout: o.AgentTimeout, Output: o.Output,
		ExternalUpgrade: strings.HasSuffix(o.Driver, "os-upgrade") && o.Params["mode"] == "external",
	})
}
