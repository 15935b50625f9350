package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return failed(runVersion(cmd.Context(), e))
		},
	}
}

func runVersion(_ context.Context, e *env) error {
	_, err := fmt.Fprintln(e.stdout, versionString())
	return err
}

// versionString is the one line `version` and `--version` print:
// "lifecycle-agent 1.2.3 (commit abc1234, go1.26.8)".
func versionString() string {
	c := commit
	if c == "" {
		c = "unknown"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && s.Value != "" {
					c = s.Value
				}
			}
		}
	}
	return fmt.Sprintf("lifecycle-agent %s (commit %s, %s)", version, c, runtime.Version())
}
