package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	daemon "github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Output formats of request and wait (-o).
const (
	outText = "text"
	outName = "name"
	outJSON = "json"
)

// addOutputFlag adds -o/--output with the given formats.
func addOutputFlag(cmd *cobra.Command, p *string, formats ...string) {
	cmd.Flags().StringVarP(p, "output", "o", outText, "output format: "+strings.Join(formats, ", "))
}

// addOutputFlags adds -o/--output and --json, the older spelling of -o
// json, kept as an alias (status, doctor, gpu inventory).
func addOutputFlags(cmd *cobra.Command, p *string, formats ...string) {
	addOutputFlag(cmd, p, formats...)
	cmd.Flags().Bool("json", false, "same as -o json")
}

// outputOf is the format asked for: -o, with --json folded in; refused when
// not one of formats, or when --json contradicts -o.
func outputOf(cmd *cobra.Command, o string, formats ...string) (string, error) {
	if j, _ := cmd.Flags().GetBool("json"); j {
		if cmd.Flags().Changed("output") && o != outJSON {
			return "", usageErrorf("--json and --output %q: give one of them", o)
		}
		o = outJSON
	}
	return o, checkOutput(o, formats...)
}

// checkOutput refuses a format not in formats.
func checkOutput(o string, formats ...string) error {
	for _, f := range formats {
		if o == f {
			return nil
		}
	}
	return usageErrorf("--output %q: want %s", o, strings.Join(formats, ", "))
}

// followOptions say how `request --wait` and `wait` follow an event.
type followOptions struct {
	Timeout time.Duration // give up after this long (exit 4); 0: no limit
	// AgentTimeout: give up (exit 6) once the agent has not answered on
	// its socket, nor the journal told the outcome, for this long. It
	// covers an agent restarted by a package upgrade or starting after the
	// reboot the event asked for.
	AgentTimeout time.Duration
	Output       string // outText, outName or outJSON
	// ExternalUpgrade: an os-upgrade with mode=external ends the wait at
	// the step wait-reboot, where the pipeline takes over.
	ExternalUpgrade bool
	Poll            time.Duration // between reads; 0: 500ms
}

const defaultAgentTimeout = 2 * time.Minute

// progress is one line of -o json (newline-delimited JSON, one object per
// change; the last one carries result and exitCode).
type progress struct {
	Event       string `json:"event"`
	Queued      bool   `json:"queued,omitempty"`
	ClaimStatus string `json:"claimStatus,omitempty"`
	Step        string `json:"step,omitempty"`
	Message     string `json:"message,omitempty"`
	// Source of the state: api, agent (API server unreachable), journal
	// (the agent is not running: read from its journal).
	Source   string `json:"source,omitempty"`
	Result   string `json:"result,omitempty"` // exit code's name (exitCodes), on the last line
	ExitCode *int   `json:"exitCode,omitempty"`
}

// outcomeCode maps a claim status or journal outcome to its exit code;
// ok is false while the event runs.
func outcomeCode(s string) (code int, ok bool) {
	switch s {
	case string(v1alpha1.LifecycleEventSucceeded):
		return exitOK, true
	case string(v1alpha1.LifecycleEventFailed):
		return exitFailure, true
	case string(v1alpha1.LifecycleEventSlaExpired):
		return exitSlaExpired, true
	case journal.OutcomeCancelled.String():
		return exitCancelled, true
	}
	return 0, false
}

// endMessage is the one stderr line for an event that ended otherwise
// than Succeeded.
func endMessage(name string, code int, msg string) string {
	switch code {
	case exitFailure:
		return fmt.Sprintf("%s failed: %s", name, msg)
	case exitSlaExpired:
		return fmt.Sprintf("%s: sla expired: %s", name, msg)
	case exitCancelled:
		if msg == "" {
			msg = "deleted before it ended"
		}
		return fmt.Sprintf("%s was cancelled: %s", name, msg)
	}
	return fmt.Sprintf("%s: %s", name, msg)
}

// follower prints the progress of one event.
type follower struct {
	e    *env
	name string
	o    followOptions
	last string
}

func (f *follower) emit(p progress) {
	key := fmt.Sprint(p.Queued, p.ClaimStatus, p.Step, p.Message, p.Source)
	if key == f.last && p.ExitCode == nil {
		return
	}
	f.last = key
	switch f.o.Output {
	case outJSON:
		if _, done := outcomeCode(p.ClaimStatus); done && p.ExitCode == nil {
			// The end state goes out once, on the last line, with its
			// result and exit code (end).
			return
		}
		if p.ClaimStatus == "" && !p.Queued {
			// As the text says: not claimed yet (an empty status).
			p.ClaimStatus = orPending("", false)
		}
		b, _ := json.Marshal(p)
		fmt.Fprintln(f.e.stdout, string(b))
	case outText:
		if p.ExitCode != nil {
			return
		}
		fmt.Fprintf(f.e.stdout, "%s %s: %s", time.Now().Format("15:04:05"), f.name, orPending(p.ClaimStatus, p.Queued))
		if p.Step != "" {
			fmt.Fprintf(f.e.stdout, " (step %s)", p.Step)
		}
		if p.Message != "" {
			fmt.Fprintf(f.e.stdout, ": %s", p.Message)
		}
		switch p.Source {
		case "agent":
			fmt.Fprint(f.e.stdout, " [the API server does not answer: the agent's own view]")
		case "journal":
			fmt.Fprint(f.e.stdout, " [from the journal: the agent is not running]")
		}
		fmt.Fprintln(f.e.stdout)
	}
}

// end prints the last line (-o json) and returns the command's result.
func (f *follower) end(p progress, code int, msg string) error {
	p.Event = f.name
	p.Result, p.ExitCode = exitCodeName(code), &code
	f.emit(p)
	if code == exitOK {
		return nil
	}
	return &exitError{code: code, err: errors.New(msg)}
}

// follow waits for the event name to end, through the agent's control
// socket, or from the journal while the agent does not answer.
func follow(ctx context.Context, e *env, name string, o followOptions) error {
	if o.Poll <= 0 {
		o.Poll = 500 * time.Millisecond
	}
	if o.AgentTimeout <= 0 {
		o.AgentTimeout = defaultAgentTimeout
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	f := &follower{e: e, name: name, o: o}
	var (
		agentDownSince time.Time
		agentErr       error
	)
	for {
		v, err := daemon.EventViaSocket(ctx, e.cfg.SocketPath, name)
		var (
			gone *daemon.ErrGone
			un   *daemon.ErrUnavailable
		)
		switch {
		case err == nil:
			agentDownSince, agentErr = time.Time{}, nil
			p := progress{Event: name, Queued: v.Queued, ClaimStatus: string(v.Status.ClaimStatus),
				Step: v.Status.CurrentStep, Message: v.Status.Message, Source: v.Source}
			if v.Outcome != "" {
				p.ClaimStatus = v.Outcome
			}
			f.emit(p)
			if code, done := outcomeCode(p.ClaimStatus); done {
				return f.end(p, code, endMessage(name, code, p.Message))
			}
			if o.ExternalUpgrade && v.Status.CurrentStep == "wait-reboot" {
				if o.Output == outText {
					fmt.Fprintf(e.stdout, "%s: node drained; upgrade and reboot it, the agent verifies and uncordons after boot\n", name)
				}
				return f.end(p, exitOK, "")
			}
		case errors.As(err, &gone):
			return f.end(progress{}, exitCancelled, endMessage(name, exitCancelled, gone.Msg))
		case errors.As(err, &un) && un.Permission:
			return &exitError{code: exitFailure, err: err}
		case errors.As(err, &un) && un.AgentDown:
			if p, code, ok := outcomeFromJournal(e.cfg.JournalPath, name); ok {
				f.emit(p)
				return f.end(p, code, endMessage(name, code, p.Message)+" (from the journal: the agent is not running)")
			}
			if agentDownSince.IsZero() {
				agentDownSince = time.Now()
				if o.Output == outText {
					fmt.Fprintf(e.stdout, "%s %s: %s; waiting up to %s for the agent\n", time.Now().Format("15:04:05"), name, un.Msg, o.AgentTimeout)
				}
			}
			agentErr = err
			if time.Since(agentDownSince) >= o.AgentTimeout {
				return f.end(progress{}, exitUnavailable, fmt.Sprintf("%s: no answer from the agent for %s: %v", name, o.AgentTimeout, err))
			}
		case errors.As(err, &un):
			// The agent runs; the API server does not answer and the agent
			// does not hold the event: keep waiting.
			agentDownSince, agentErr = time.Time{}, err
		case ctx.Err() != nil:
		default:
			return err
		}
		select {
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return f.end(progress{}, exitInterrupted, fmt.Sprintf("%s: interrupted (it goes on); follow it again: lifecycle-agent wait %s", name, name))
			}
			if agentErr != nil {
				return f.end(progress{}, exitUnavailable, fmt.Sprintf("%s: unknown after %s: %v", name, o.Timeout, agentErr))
			}
			return f.end(progress{}, exitTimeout, fmt.Sprintf("%s: still running after %s (it goes on); follow it again: lifecycle-agent wait %s", name, o.Timeout, name))
		case <-time.After(o.Poll):
		}
	}
}

// outcomeFromJournal reads the event's end from the journal of an agent
// that is not running (the journal is locked while it runs).
func outcomeFromJournal(path, name string) (progress, int, bool) {
	var buf bytes.Buffer
	if err := journal.Export(path, &buf); err != nil {
		return progress{}, 0, false
	}
	var doc journal.ExportDoc
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		return progress{}, 0, false
	}
	for i := len(doc.History) - 1; i >= 0; i-- {
		h := doc.History[i]
		if h.Event.Name != name || h.Event.Driver == localRequestDriver {
			continue
		}
		p := progress{Event: name, ClaimStatus: h.Outcome.String(), Message: h.Message, Source: "journal"}
		code, ok := outcomeCode(p.ClaimStatus)
		return p, code, ok
	}
	return progress{}, 0, false
}

// localRequestDriver is the journal's driver name of a queued local request.
const localRequestDriver = "local-request"

func orPending(s string, queued bool) string {
	switch {
	case queued:
		return "queued"
	case s == "":
		return "Pending"
	}
	return s
}
