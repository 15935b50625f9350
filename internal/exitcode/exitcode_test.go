package exitcode

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The numbers are an interface: a change here breaks pipelines.
func TestTableIsStable(t *testing.T) {
	want := map[int]string{0: "succeeded", 1: "failed", 2: "usage", 3: "sla-expired", 4: "timeout", 5: "cancelled", 6: "unavailable", 130: "interrupted"}
	if len(Table) != len(want) {
		t.Fatalf("%d codes, want %d", len(Table), len(want))
	}
	for _, c := range Table {
		if want[c.Code] != c.Name || Name(c.Code) != c.Name {
			t.Errorf("code %d is %q, want %q", c.Code, c.Name, want[c.Code])
		}
	}
}

func TestAddToHelp(t *testing.T) {
	root := &cobra.Command{Use: "x", Short: "the root", Long: "The root.\n"}
	sub := &cobra.Command{Use: "sub", Short: "a sub", Run: func(*cobra.Command, []string) {}}
	sub.AddCommand(&cobra.Command{Use: "leaf", Short: "a leaf", Run: func(*cobra.Command, []string) {}})
	root.AddCommand(sub)
	AddToHelp(root)
	AddToHelp(root) // twice: the table once
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		n++
		if strings.Count(c.Long, Help()) != 1 {
			t.Errorf("%s: long help %q does not hold the table once", c.CommandPath(), c.Long)
		}
		if FromHelp(c.Long) != Help() {
			t.Errorf("%s: FromHelp = %q", c.CommandPath(), FromHelp(c.Long))
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if !strings.HasPrefix(sub.Long, "a sub\n\nExit codes") || !strings.HasPrefix(root.Long, "The root.\n\nExit codes") {
		t.Errorf("the table does not follow the help: %q, %q", sub.Long, root.Long)
	}
	if n < 5 { // root, sub, leaf, help, completion
		t.Errorf("walked %d commands, want help and completion too", n)
	}
}
