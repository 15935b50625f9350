package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
)

// annNeedsConfig marks commands that load the configuration before they run.
const annNeedsConfig = "lifecycle-agent.x-k8s.io/needs-config"

var needsConfig = map[string]string{annNeedsConfig: "true"}

// env is what every command function gets: the configuration (nil for
// commands that need none), the output streams and the logger.
type env struct {
	cfg    *config.Config
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
}

// exitError carries an exit code and how the message is printed.
type exitError struct {
	code  int
	err   error
	hint  bool // append "run 'lifecycle-agent <cmd> --help'"
	plain bool // print without the command name (config errors name their own source)
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is a bad command line: exit 2 with a --help hint.
func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...), hint: true}
}

// failed marks an error from a command function: exit 1, or 6 when the
// agent did not answer. Errors that already carry an exit code keep it.
func failed(err error) error {
	var (
		ee *exitError
		un *daemon.ErrUnavailable
	)
	switch {
	case err == nil || errors.As(err, &ee):
		return err
	case errors.As(err, &un) && !un.Permission:
		return &exitError{code: exitUnavailable, err: err}
	}
	return &exitError{code: exitFailure, err: explain(err)}
}

// execute runs the command line and returns the exit code. Every error is
// printed as one line on stderr:
//
//	lifecycle-agent: <command>: <message>[; run 'lifecycle-agent <command> --help']
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr, log: newLogger(stderr, slog.LevelInfo, config.LogFormatText)}
	root := newRootCmd(e)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	// Errors cobra returns itself (unknown command or flag, bad flag value)
	// are usage errors.
	ee := &exitError{code: exitUsage, err: err, hint: true}
	errors.As(err, &ee)
	if ee.code == exitFailure && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// SIGINT or SIGTERM stopped a command mid-way (run stops cleanly
		// and returns nil; wait says so itself): 130, as the plugin.
		ee = &exitError{code: exitInterrupted, err: errors.New("interrupted")}
		err = ee
	}

	var b strings.Builder
	b.WriteString(root.Name() + ": ")
	if name := strings.TrimPrefix(cmd.CommandPath(), root.Name()+" "); cmd != root && !ee.plain {
		b.WriteString(name + ": ")
	}
	b.WriteString(oneLine(err.Error()))
	if ee.hint {
		fmt.Fprintf(&b, "; run '%s --help'", cmd.CommandPath())
	}
	fmt.Fprintln(stderr, b.String())
	return ee.code
}

// oneLine folds a multi-line message into one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "lifecycle-agent",
		Short: "Node lifecycle driver host: drains, reboots, upgrades and resets nodes, step by step, from a journal",
		Long: `lifecycle-agent runs on every Kubernetes node, outside the kubelet. It claims the
LifecycleEvents bound to its node and carries out the transition step by step,
writing each step to a local journal before acting, so that a crash, a reboot
or an OS upgrade in the middle resumes safely.

Configuration: flags > ` + "`LIFECYCLE_AGENT_*`" + ` environment > ` + config.DefaultPath + ` > defaults.`,
		Version:           versionString(),
		SilenceUsage:      true,
		SilenceErrors:     true,
		DisableAutoGenTag: true, // reproducible man pages
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageErrorf("missing command")
		},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Annotations[annNeedsConfig] == "" {
				return nil
			}
			cfg, err := config.Load(config.Options{Flags: cmd.Flags()})
			if err != nil {
				return &exitError{code: exitUsage, err: err, plain: true}
			}
			e.cfg = cfg
			e.log = newLogger(e.stderr, cfg.SlogLevel(), cfg.LogFormat)
			return nil
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return usageErrorf("%s", err)
	})
	root.CompletionOptions.HiddenDefaultCmd = true
	config.AddFlags(root.PersistentFlags(), config.GlobalFlags)

	root.AddCommand(
		newRunCmd(e),
		newStatusCmd(e),
		newRequestCmd(e),
		newWaitCmd(e),
		newDoctorCmd(e),
		newJournalCmd(e),
		newManifestsCmd(e),
		newUnpublishCmd(e),
		newVersionCmd(e),
		newGenManCmd(e, root),
		newGPUCmd(e),
	)
	exitcode.AddToHelp(root)
	return root
}

// unknownCommand is the error for `lifecycle-agent frob`, with cobra's
// suggestion folded into the same line.
func unknownCommand(cmd *cobra.Command, arg string) error {
	msg := fmt.Sprintf("unknown command %q", arg)
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which SuggestionsFor does not apply
	}
	if s := cmd.SuggestionsFor(arg); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	}
	return usageErrorf("%s", msg)
}

// noArgs refuses positional arguments with a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageErrorf("unexpected argument %q", args[0])
	}
	return nil
}

// exactArgs wants n positional arguments, described by what.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < n:
			return usageErrorf("missing %s", what)
		case len(args) > n:
			return usageErrorf("unexpected argument %q", args[n])
		}
		return nil
	}
}

func newLogger(w io.Writer, level slog.Level, format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == config.LogFormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
