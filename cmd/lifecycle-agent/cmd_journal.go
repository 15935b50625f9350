package main

import (
	"context"

	"github.com/spf13/cobra"
)

func newJournalCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "journal verify|export|compact",
		Short: "Inspect and maintain the local journal",
		Long: `Work on the bbolt journal (--journal, default from the configuration). Stop the
agent first for compact: the journal is locked while the agent runs.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("missing subcommand: verify, export or compact")
		},
	}
	sub := func(use, short string, run func(context.Context, *env) error) *cobra.Command {
		return &cobra.Command{
			Use:         use,
			Short:       short,
			Args:        noArgs,
			Annotations: needsConfig,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return failed(run(cmd.Context(), e))
			},
		}
	}
	cmd.AddCommand(
		sub("verify", "Check the journal's integrity and schema version", runJournalVerify),
		sub("export", "Print the journal as JSON on stdout", runJournalExport),
		sub("compact", "Rewrite the journal to reclaim space", runJournalCompact),
		&cobra.Command{
			Use:    "check-file PATH",
			Short:  "Run the in-process integrity check on a journal file (tests)",
			Hidden: true,
			Args:   exactArgs(1, "journal file path"),
			RunE: func(cmd *cobra.Command, args []string) error {
				return failed(runJournalCheckFile(cmd.Context(), e, args[0]))
			},
		},
	)
	return cmd
}

// runJournalVerify is `lifecycle-agent journal verify`.
func runJournalVerify(ctx context.Context, e *env) error {
	return notImplemented(issueJournal)
}

// runJournalExport is `lifecycle-agent journal export`.
func runJournalExport(ctx context.Context, e *env) error {
	return notImplemented(issueJournal)
}

// runJournalCompact is `lifecycle-agent journal compact`.
func runJournalCompact(ctx context.Context, e *env) error {
	return notImplemented(issueJournal)
}

// runJournalCheckFile is the hidden `lifecycle-agent journal check-file PATH`.
// It needs no configuration: it opens exactly the file it is given.
func runJournalCheckFile(ctx context.Context, e *env, path string) error {
	return notImplemented(issueJournal)
}
