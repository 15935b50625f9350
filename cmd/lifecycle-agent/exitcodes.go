package main

import (
	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
)

// Exit codes: one table for every command of lifecycle-agent and of
// kubectl-lifecycle (internal/exitcode, issues 16 and 43). A pipeline can
// tell "retry later" (6) from "give up" (1) and "look again later" (4).
// Stable: scripts depend on the numbers.
const (
	exitOK          = exitcode.OK          // success; with --wait: the event Succeeded
	exitFailure     = exitcode.Failed      // the command ran and failed; with --wait: the event Failed
	exitUsage       = exitcode.Usage       // bad command line or configuration: nothing was done
	exitSlaExpired  = exitcode.SlaExpired  // the event's SLA expired (SlaExpired)
	exitTimeout     = exitcode.Timeout     // --timeout passed while the event was still running; it goes on
	exitCancelled   = exitcode.Cancelled   // the event was deleted before it ended (kubectl lifecycle cancel)
	exitUnavailable = exitcode.Unavailable // the agent (or the API server it needs) did not answer: retry later
	exitInterrupted = exitcode.Interrupted // SIGINT or SIGTERM while waiting (not run: a clean stop is 0)
)

// exitCodeName is the table's name of code ("" if none).
func exitCodeName(code int) string { return exitcode.Name(code) }
