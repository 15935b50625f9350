package main

import (
	"context"
	"fmt"
	"os"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"

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
			Use:                "check-file [--lock-timeout=D] PATH",
			Short:              "Run the in-process integrity check on a journal file (the agent runs it as a subprocess)",
			Hidden:             true,
			DisableFlagParsing: true,
			Run: func(cmd *cobra.Command, args []string) {
				if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
					_ = cmd.Help()
					return
				}
				// A bad data page can make bbolt's check panic: that is why this
				// runs in its own process, whose exit code the caller reads.
				os.Exit(journal.RunCheck(args, e.stdout, e.stderr))
			},
		},
	)
	return cmd
}

// journalOptions are the journal options the offline tools share with the
// agent: the integrity check runs in a subprocess of this same binary.
func journalOptions() journal.Options {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return journal.Options{CheckCommand: []string{exe, "journal", "check-file"}}
}

// runJournalVerify is `lifecycle-agent journal verify`.
func runJournalVerify(ctx context.Context, e *env) error {
	s, err := journal.Verify(ctx, e.cfg.JournalPath, journalOptions())
	if err != nil {
		return err
	}
	if s.Empty {
		fmt.Fprintf(e.stdout, "%s: ok: empty (0 bytes), a journal never written; the agent starts it afresh\n", s.Path)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: ok (schema %d, %d bytes): %d events, %d steps, %d outbox, %d owned, %d history\n",
		s.Path, s.SchemaVersion, s.SizeBytes, s.Events, s.Steps, s.Outbox, s.Owned, s.History)
	return nil
}

// runJournalExport is `lifecycle-agent journal export`.
func runJournalExport(ctx context.Context, e *env) error {
	return journal.Export(e.cfg.JournalPath, e.stdout)
}

// runJournalCompact is `lifecycle-agent journal compact`.
func runJournalCompact(ctx context.Context, e *env) error {
	r, err := journal.Compact(ctx, e.cfg.JournalPath, journalOptions())
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: compacted %d → %d bytes\n", r.Path, r.BeforeBytes, r.AfterBytes)
	return nil
}
