package main

import (
	"fmt"
	"strings"
)

// Exit codes: one table for every command (issue 16). A pipeline can tell
// "retry later" (6) from "give up" (1) and "look again later" (4). Stable:
// scripts depend on the numbers.
const (
	exitOK          = 0 // success; with --wait: the event Succeeded
	exitFailure     = 1 // the command ran and failed; with --wait: the event Failed
	exitUsage       = 2 // bad command line or configuration: nothing was done
	exitSlaExpired  = 3 // the event's SLA expired (SlaExpired)
	exitTimeout     = 4 // --timeout passed while the event was still running; it goes on
	exitCancelled   = 5 // the event was deleted before it ended (kubectl lifecycle cancel)
	exitUnavailable = 6 // the agent (or the API server it needs) did not answer: retry later
)

// exitCodes is the table printed in --help, the man page and
// docs/pipelines.md (a test keeps the doc in step).
var exitCodes = []struct {
	Code    int
	Name    string
	Meaning string
}{
	{exitOK, "succeeded", "success; with --wait or wait: the event Succeeded"},
	{exitFailure, "failed", "the command failed; with --wait or wait: the event Failed"},
	{exitUsage, "usage", "bad command line or configuration, unknown driver or parameter: nothing was done"},
	{exitSlaExpired, "sla-expired", "the event's SLA expired (SlaExpired)"},
	{exitTimeout, "timeout", "--timeout passed while the event was still running; it goes on"},
	{exitCancelled, "cancelled", "the event was deleted before it ended (cancelled)"},
	{exitUnavailable, "unavailable", "the agent or the API server did not answer: retry later"},
}

// exitCodeHelp is the table as --help prints it.
func exitCodeHelp() string {
	var b strings.Builder
	b.WriteString("Exit codes (every command):\n")
	for _, c := range exitCodes {
		fmt.Fprintf(&b, "  %d  %-12s %s\n", c.Code, c.Name, c.Meaning)
	}
	return strings.TrimRight(b.String(), "\n")
}

// exitCodeName is the table's name of code ("" if none).
func exitCodeName(code int) string {
	for _, c := range exitCodes {
		if c.Code == code {
			return c.Name
		}
	}
	return ""
}
