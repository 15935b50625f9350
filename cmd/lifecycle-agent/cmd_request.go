package main

import (
	"context"
	"strings"
	"time"

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

// runRequest is `lifecycle-agent request`. The driver name and parameter
// values are not checked yet: the driver does that.
func runRequest(ctx context.Context, e *env, o requestOptions) error {
	return notImplemented(issueRequest)
}
