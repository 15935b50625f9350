package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
)

func run(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = execute(context.Background(), args, &out, &errOut, clocktesting.NewFakeClock(time.Now()))
	return code, out.String(), errOut.String()
}

// Every command's --help, cobra's help and completion included, ends with
// the one exit code table (lifecycle-agent's), and docs/plugin.md has it.
func TestExitCodesDocumented(t *testing.T) {
	paths := exitcode.CommandPaths(newRootCmd(&options{}))
	if len(paths) < 15 {
		t.Fatalf("walked %d commands: the tree is not all there", len(paths))
	}
	for _, p := range paths {
		code, out, errOut := run(append(p, "--help")...)
		if code != exitOK || exitcode.FromHelp(out) != exitcode.Help() {
			t.Errorf("kubectl lifecycle %s --help: exit %d; the exit code table is not in:\n%s%s", strings.Join(p, " "), code, out, errOut)
		}
	}
	doc, err := os.ReadFile("../../docs/plugin.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), exitcode.Markdown()) {
		t.Errorf("docs/plugin.md lacks the table\n%s", exitcode.Markdown())
	}
}

// -o is refused before any API call, exit 2 naming the value, where a
// command has no such output; every -o a command advertises is taken.
func TestOutputFormats(t *testing.T) {
	kc := []string{"--kubeconfig", "/nonexistent/kubeconfig"}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "drain", "n1", "-o", "yaml"}, "-o yaml: run prints progress text (the default) or -o json or -o name"},
		{[]string{"drain", "n1", "-o", "wide"}, "-o wide: drain prints"},
		{[]string{"rollout", "drain", "n1", "-o", "yaml"}, "-o yaml: rollout prints"},
		{[]string{"cancel", "ev-1", "-o", "jsonpath={.x}"}, "-o jsonpath={.x}: cancel prints"},
		{[]string{"version", "-o", "name"}, "-o name: version prints text (the default) or -o json"},
	} {
		code, out, errOut := run(append(tt.args, kc...)...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, "error: "+tt.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", tt.args, code, out, errOut, tt.want)
		}
	}
	// The formats each command advertises in its -o help: none refused
	// as a usage error (they get as far as the missing kubeconfig, 1).
	for _, args := range [][]string{{"run", "drain", "n1"}, {"reboot", "n1"}, {"rollout", "drain", "n1"}, {"cancel", "ev-1"}} {
		for _, f := range []string{"json", "name"} {
			if code, _, errOut := run(append(append(args, "-o", f), kc...)...); code != exitFailed || !strings.Contains(errOut, "kubeconfig") {
				t.Errorf("%v -o %s: exit %d, %s; want 1 for the missing kubeconfig", args, f, code, errOut)
			}
		}
	}
	code, out, errOut := run("version", "-o", "json")
	var v versionResult
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Name != "kubectl-lifecycle" || v.Version != version || v.GoVersion == "" {
		t.Errorf("version -o json: exit %d, %v, %+v, stderr %q", code, err, v, errOut)
	}
}
