package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
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
}

func newRequestCmd(e *env) *cobra.Command {
	var (
		params []string
		o      requestOptions
	)
	cmd := &cobra.Command{
		Use:   "request <driver> [--param key=value]... [--wait [--timeout D]]",
		Short: "Request a transition on this node (for provisioning pipelines)",
		Long: `Create a LifecycleEvent for one of this node's drivers, e.g.
"lifecycle-agent request reboot --wait". Works offline: the request is kept in
the journal and synced when the API server is reachable.`,
		Example: `  lifecycle-agent request drain --param gracePeriodSeconds=60 --wait --timeout 30m
  lifecycle-agent request os-upgrade --param profile=debian-full-upgrade`,
		Args:        exactArgs(1, "driver name, e.g. 'lifecycle-agent request reboot'"),
		Annotations: needsConfig,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			o.Driver = args[0]
			if o.Params, err = parseParams(params); err != nil {
				return err
			}
			if cmd.Flags().Changed("timeout") && !o.Wait {
				return usageErrorf("--timeout needs --wait")
			}
			return failed(runRequest(cmd.Context(), e, o))
		},
	}
	// StringArray, not StringSlice: values may hold commas (gpus=0,1).
	cmd.Flags().StringArrayVar(&params, "param", nil, "event parameter as key=value; repeat for more")
	cmd.Flags().BoolVar(&o.Wait, "wait", false, "wait until the event ends; exit 1 unless it succeeded")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 0, "with --wait: give up waiting after this long (0: no limit)")
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

// Exit codes of `request --wait` (0 and 2 as everywhere).
const (
	exitRequestFailed     = 1
	exitRequestSlaExpired = 3
	exitRequestTimeout    = 4
)

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
	if res.Queued {
		fmt.Fprintf(e.stdout, "%s queued: the API server is unreachable; the agent publishes it when it returns\n", res.Event)
	} else {
		fmt.Fprintf(e.stdout, "%s created\n", res.Event)
	}
	if !o.Wait {
		return nil
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	externalUpgrade := strings.HasSuffix(o.Driver, "os-upgrade") && o.Params["mode"] == "external"
	last := ""
	for {
		v, err := daemon.EventViaSocket(ctx, e.cfg.SocketPath, res.Event)
		var gone *daemon.ErrGone
		if errors.As(err, &gone) {
			return &exitError{code: exitRequestFailed, err: errors.New(gone.Msg)}
		}
		if err == nil {
			st := v.Status
			line := string(st.ClaimStatus) + " " + st.CurrentStep + " " + st.Message
			if v.Queued {
				line = "queued"
			}
			if line != last {
				last = line
				fmt.Fprintf(e.stdout, "%s %s: %s", time.Now().Format("15:04:05"), res.Event, orPending(string(st.ClaimStatus), v.Queued))
				if st.CurrentStep != "" {
					fmt.Fprintf(e.stdout, " (step %s)", st.CurrentStep)
				}
				if st.Message != "" {
					fmt.Fprintf(e.stdout, ": %s", st.Message)
				}
				fmt.Fprintln(e.stdout)
			}
			switch st.ClaimStatus {
			case v1alpha1.LifecycleEventSucceeded:
				return nil
			case v1alpha1.LifecycleEventFailed:
				return &exitError{code: exitRequestFailed, err: fmt.Errorf("%s failed: %s", res.Event, st.Message)}
			case v1alpha1.LifecycleEventSlaExpired:
				return &exitError{code: exitRequestSlaExpired, err: fmt.Errorf("%s: sla expired: %s", res.Event, st.Message)}
			}
			// A pipeline's external OS upgrade: return once the node is
			// drained and the agent waits for the pipeline's reboot.
			if externalUpgrade && st.CurrentStep == "wait-reboot" {
				fmt.Fprintf(e.stdout, "%s: node drained; upgrade and reboot it, the agent verifies and uncordons after boot\n", res.Event)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return &exitError{code: exitRequestTimeout, err: fmt.Errorf("%s: still running after %s (it goes on)", res.Event, o.Timeout)}
			}
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func orPending(s string, queued bool) string {
	switch {
	case queued:
		return "queued"
	case s == "":
		return "Pending"
	}
	return s
}
