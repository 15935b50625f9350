package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
)

// Result formats (-o) of the commands that act: run and its shorthands,
// rollout, cancel; and version. The listing commands (status, history,
// transitions) print objects with cli-runtime's printers instead (print.go).
const (
	outJSON = "json"
	outName = "name"
)

// resultOutput is -o of a command that acts. Text (the default) prints
// progress on stdout, as ever. With -o json or -o name the progress lines
// go to stderr and stdout carries only the result: -o name the bare event
// names, -o json one object when the command ends (value), with "result"
// and "exitCode" from the one exit code table. Nothing is printed on
// stdout when the command fails before it acted (usage, unreachable).
type resultOutput struct {
	format  string
	formats []string // those the command takes besides text
	stdout  io.Writer
	// value is the -o json object for the exit code and message; set by
	// the command once it acted, nil before.
	value func(code int, msg string) any
}

// resultFormats is -o json|name of the commands that act.
func resultFormats() *resultOutput { return &resultOutput{formats: []string{outJSON, outName}} }

func (r *resultOutput) addFlag(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&r.format, "output", "o", "", "Output format: "+strings.Join(r.formats, " or ")+
		" (default: progress text). With -o, progress goes to stderr and stdout holds only the result")
}

// check refuses a format the command does not take, before any API call.
func (r *resultOutput) check(cmd *cobra.Command) error {
	if r.format == "" {
		return nil
	}
	for _, f := range r.formats {
		if r.format == f {
			return nil
		}
	}
	return usageErr("-o %s: %s prints progress text (the default) or -o %s", r.format, cmd.Name(), strings.Join(r.formats, " or -o "))
}

// name prints an event's bare name with -o name, for a pipeline to keep
// (as lifecycle-agent request -o name).
func (r *resultOutput) name(n string) {
	if r.format == outName {
		fmt.Fprintln(r.stdout, n)
	}
}

// resultE is runE for a command with a result: it checks -o, sends the
// progress to stderr while stdout holds the result, and prints the -o
// json object with the command's exit code.
func (o *options) resultE(res *resultOutput, f func(ctx context.Context, args []string) error) func(*cobra.Command, []string) error {
	inner := o.runE(f)
	return func(cmd *cobra.Command, args []string) error {
		if err := res.check(cmd); err != nil {
			return err
		}
		res.stdout = o.out
		if res.format != "" {
			o.out = o.errOut
			defer func() { o.out = res.stdout }()
		}
		err := inner(cmd, args)
		if res.format != outJSON || res.value == nil {
			return err
		}
		code, msg := exitOK, ""
		var ee *exitError
		if errors.As(err, &ee) {
			code, msg = ee.code, ee.msg
		}
		b, jerr := json.Marshal(res.value(code, msg))
		if jerr != nil {
			return fail(exitFailed, "-o json: %v", jerr)
		}
		fmt.Fprintln(res.stdout, string(b))
		return err
	}
}

// outcomeFields end every -o json object of a command that acts.
type outcomeFields struct {
	Result   string `json:"result"`          // the exit code's name (exitcode.Table)
	ExitCode int    `json:"exitCode"`        // the command's exit code
	Error    string `json:"error,omitempty"` // the stderr line, without "error: "
}

func outcomeOf(code int, msg string) outcomeFields {
	return outcomeFields{Result: exitcode.Name(code), ExitCode: code, Error: msg}
}

// runResult is run -o json (and drain, uncordon, reboot -o json).
type runResult struct {
	Event       string `json:"event"`
	Node        string `json:"node"`
	Driver      string `json:"driver"`
	Transition  string `json:"transition"`
	ClaimStatus string `json:"claimStatus"` // the last one seen: Pending without --wait
	Step        string `json:"step,omitempty"`
	Message     string `json:"message,omitempty"`
	outcomeFields
}

func newRunResult(ev *v1alpha1.LifecycleEvent, driver string, code int, msg string) runResult {
	return runResult{Event: ev.Name, Node: ev.Spec.BindingNode, Driver: driver, Transition: ev.Spec.TransitionName,
		ClaimStatus: claimStatus(ev), Step: ev.Status.CurrentStep, Message: ev.Status.Message, outcomeFields: outcomeOf(code, msg)}
}

// claimStatus is the event's claim status, Pending when unset.
func claimStatus(ev *v1alpha1.LifecycleEvent) string {
	if ev.Status.ClaimStatus == "" {
		return string(v1alpha1.LifecycleEventPending)
	}
	return string(ev.Status.ClaimStatus)
}

// rolloutResult is rollout -o json.
type rolloutResult struct {
	Rollout string              `json:"rollout"` // the group
	Driver  string              `json:"driver"`
	Nodes   []rolloutNodeResult `json:"nodes"`
	Done    int                 `json:"done"`
	Running int                 `json:"running"`
	Waiting int                 `json:"waiting"`
	Failed  int                 `json:"failed"`
	outcomeFields
}

type rolloutNodeResult struct {
	Node        string `json:"node"`
	Event       string `json:"event"`
	State       string `json:"state"`                 // done, running, waiting (not started), failed
	ClaimStatus string `json:"claimStatus,omitempty"` // the event's, once started
	Message     string `json:"message,omitempty"`
}

func newRolloutResult(group, short string, nodes []*rolloutNode, code int, msg string) rolloutResult {
	t := count(nodes)
	res := rolloutResult{Rollout: group, Driver: short, Nodes: []rolloutNodeResult{}, Done: t.done, Running: t.running,
		Waiting: t.waiting, Failed: t.failed, outcomeFields: outcomeOf(code, msg)}
	for _, n := range nodes {
		nr := rolloutNodeResult{Node: n.node, Event: n.event}
		switch {
		case n.succeeded():
			nr.State = "done"
		case n.failed():
			nr.State = "failed"
		case n.running():
			nr.State = "running"
		default:
			nr.State = "waiting"
		}
		if n.ev != nil {
			nr.ClaimStatus, nr.Message = claimStatus(n.ev), n.ev.Status.Message
		}
		if n.gone {
			nr.ClaimStatus = "Cancelled"
		}
		res.Nodes = append(res.Nodes, nr)
	}
	return res
}

// cancelResult is cancel -o json.
type cancelResult struct {
	Events []cancelledEvent `json:"events"`
	outcomeFields
}

type cancelledEvent struct {
	Event string `json:"event"`
	Node  string `json:"node"`
	// ClaimStatus is the last one seen: an event deleted before it ended
	// gets no end state.
	ClaimStatus string `json:"claimStatus"`
	// Cancelled: deleted before it ended (not an event already finished).
	Cancelled bool `json:"cancelled"`
	// Gone: with --wait, the event is gone (the agent let it go).
	Gone bool `json:"gone"`
}

// versionResult is version -o json; lifecycle-agent version -o json has
// the same fields.
type versionResult struct {
	Name      string `json:"name"`
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
}

func newVersionCmd(o *options) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o json]",
		Short: "Print the plugin's version",
		Long: `Print the plugin's version, or with -o json one object:
{"name":"kubectl-lifecycle","version":"1.2.3","commit":"abc1234","goVersion":"go1.26.8"}
(lifecycle-agent version -o json prints the same fields).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "":
				fmt.Fprintf(o.out, "kubectl-lifecycle %s\n", version)
			case outJSON:
				b, _ := json.Marshal(versionResult{Name: "kubectl-lifecycle", Version: version, Commit: vcsCommit(), GoVersion: runtime.Version()})
				fmt.Fprintln(o.out, string(b))
			default:
				return usageErr("-o %s: version prints text (the default) or -o json", output)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "Output format: json (default: one line of text)")
	return cmd
}

// vcsCommit is the VCS revision Go stamped into the binary, or "unknown".
func vcsCommit() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}
