package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

type versionOptions struct {
	Output string // outText or outJSON
}

func newVersionCmd(e *env) *cobra.Command {
	var o versionOptions
	cmd := &cobra.Command{
		Use:   "version [-o text|json]",
		Short: "Print the version",
		Long: `Print the version, the commit and the Go version in one line, or with -o json
one object: {"name":"lifecycle-agent","version":"1.2.3","commit":"abc1234",
"goVersion":"go1.26.8"} (kubectl lifecycle version -o json prints the same
fields).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(o.Output, outText, outJSON); err != nil {
				return err
			}
			return failed(runVersion(cmd.Context(), e, o))
		},
	}
	addOutputFlag(cmd, &o.Output, outText, outJSON)
	return cmd
}

// versionInfo is version -o json.
type versionInfo struct {
	Name      string `json:"name"`
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
}

func runVersion(_ context.Context, e *env, o versionOptions) error {
	if o.Output == outJSON {
		b, err := json.Marshal(versionInfo{Name: "lifecycle-agent", Version: version, Commit: commitOf(), GoVersion: runtime.Version()})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(e.stdout, string(b))
		return err
	}
	_, err := fmt.Fprintln(e.stdout, versionString())
	return err
}

// commitOf is the commit set at build time, else the VCS revision Go
// stamped, else "unknown".
func commitOf() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// versionString is the one line `version` and `--version` print:
// "lifecycle-agent 1.2.3 (commit abc1234, go1.26.8)".
func versionString() string {
	return fmt.Sprintf("lifecycle-agent %s (commit %s, %s)", version, commitOf(), runtime.Version())
}
