package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

func newGenManCmd(e *env, root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "gen-man DIR",
		Short:  "Write man pages into DIR (for packaging)",
		Long:   "Write lifecycle-agent.8 and one page per command into DIR. The date comes from SOURCE_DATE_EPOCH when set.",
		Hidden: true,
		Args:   exactArgs(1, "output directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return failed(runGenMan(cmd.Context(), e, root, args[0]))
		},
	}
}

func runGenMan(_ context.Context, e *env, root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	header := &doc.GenManHeader{
		Title:   "LIFECYCLE-AGENT",
		Section: "8",
		Source:  "lifecycle-agent " + version,
		Manual:  "lifecycle-agent manual",
	}
	if err := doc.GenManTree(root, header, dir); err != nil {
		return fmt.Errorf("write man pages to %s: %w", dir, err)
	}
	return nil
}
