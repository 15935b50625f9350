// Package clitest holds checks that both command-line tools
// (cmd/lifecycle-agent, cmd/kubectl-lifecycle) run on their own command
// trees in their tests.
package clitest

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// builtin are the drivers a help example may name with parameters.
var builtin = map[string]drivers.Driver{"drain": drivers.Drain{}, "uncordon": drivers.Uncordon{}, "reboot": drivers.Reboot{}}

var param = regexp.MustCompile(`--param ([A-Za-z0-9_]+)=(\S+)`)

// CheckHelpExamples fails t when an example in root's tree (--help) gives
// a built-in driver --param k=v that the driver's own validation refuses:
// a help example the agent would refuse teaches the wrong thing. It fails
// too when no example gives a parameter (the check would check nothing).
func CheckHelpExamples(t testing.TB, root *cobra.Command) {
	t.Helper()
	checked := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, line := range strings.Split(c.Example, "\n") {
			ps := param.FindAllStringSubmatch(line, -1)
			if len(ps) == 0 {
				continue
			}
			var d drivers.Driver
			for _, f := range strings.Fields(line) {
				if b, ok := builtin[f]; ok && d == nil {
					d = b
				}
			}
			if d == nil {
				t.Errorf("%s: example %q gives --param but names no built-in driver this check knows", c.CommandPath(), strings.TrimSpace(line))
				continue
			}
			m := map[string]string{}
			for _, p := range ps {
				m[p[1]] = p[2]
			}
			if _, err := d.Plan(m); err != nil {
				t.Errorf("%s: example %q: %v", c.CommandPath(), strings.TrimSpace(line), err)
			}
			checked++
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if checked == 0 {
		t.Errorf("%s: no help example gives --param: the check checks nothing", root.CommandPath())
	}
}
