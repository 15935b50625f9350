package exitcode

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// The codes. Explicit numbers, never iota: they are an interface.
const (
	OK          = 0
	Failed      = 1
	Usage       = 2
	SlaExpired  = 3
	Timeout     = 4
	Cancelled   = 5
	Unavailable = 6
	Interrupted = 130
)

// Code is one row of the table.
type Code struct {
	Code    int
	Name    string // stable; -o json's "result"
	Meaning string
}

// Table is every code, in order.
var Table = []Code{
	{OK, "succeeded", "success; when waiting: the event (every rollout node) Succeeded"},
	{Failed, "failed", "the command failed; when waiting: the event (a rollout node) Failed"},
	{Usage, "usage", "bad command line or configuration, unknown driver or parameter: nothing was done"},
	{SlaExpired, "sla-expired", "the event's SLA expired (SlaExpired)"},
	{Timeout, "timeout", "--timeout passed while the event was still running; it goes on"},
	{Cancelled, "cancelled", "the event was deleted before it ended (cancelled)"},
	{Unavailable, "unavailable", "the agent or the API server did not answer: retry later"},
	{Interrupted, "interrupted", "SIGINT or SIGTERM while waiting; the event goes on"},
}

// helpTitle starts the table in --help.
const helpTitle = "Exit codes (the same for lifecycle-agent and kubectl lifecycle):"

// Help is the table as --help prints it.
func Help() string {
	var b strings.Builder
	b.WriteString(helpTitle + "\n")
	for _, c := range Table {
		fmt.Fprintf(&b, "  %-3d  %-12s %s\n", c.Code, c.Name, c.Meaning)
	}
	return strings.TrimRight(b.String(), "\n")
}

// FromHelp cuts the table out of a --help text ("" if it holds none): a
// test compares what the two binaries print.
func FromHelp(help string) string {
	i := strings.Index(help, helpTitle)
	if i < 0 {
		return ""
	}
	lines := strings.Split(help[i:], "\n")
	n := 1
	for n < len(lines) && strings.HasPrefix(lines[n], "  ") && len(strings.Fields(lines[n])) > 2 {
		n++
	}
	return strings.Join(lines[:n], "\n")
}

// Markdown is the table as the docs carry it.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| code | name | meaning |\n|---|---|---|\n")
	for _, c := range Table {
		fmt.Fprintf(&b, "| %d | `%s` | %s |\n", c.Code, c.Name, c.Meaning)
	}
	return b.String()
}

// Name is the table's name of code ("" if none).
func Name(code int) string {
	for _, c := range Table {
		if c.Code == code {
			return c.Name
		}
	}
	return ""
}

// AddToHelp appends the table to the long help of every command of root's
// tree, cobra's help and completion commands included, so that every
// --help and every man page shows it. Call it once the tree is built.
func AddToHelp(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	help := Help()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !strings.Contains(c.Long, help) {
			long := c.Long
			if long == "" {
				long = c.Short
			}
			c.Long = strings.TrimRight(long, "\n") + "\n\n" + help
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// CommandPaths lists every command of root's tree as the arguments that
// name it (nil for root itself), parents before children: for tests that
// run each command's --help.
func CommandPaths(root *cobra.Command) [][]string {
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		paths = append(paths, path)
		for _, s := range c.Commands() {
			walk(s, append(slices.Clone(path), s.Name()))
		}
	}
	walk(root, nil)
	return paths
}
