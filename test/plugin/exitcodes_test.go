package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// The two binaries print the same exit code table in --help.
func TestOneExitCodeTable(t *testing.T) {
	var tables []string
	for _, bin := range []string{agentBin, pluginBin} {
		out, err := exec.Command(bin, "--help").Output()
		if err != nil {
			t.Fatalf("%s --help: %v", bin, err)
		}
		tables = append(tables, exitcode.FromHelp(string(out)))
	}
	if tables[0] == "" || tables[0] != tables[1] {
		t.Errorf("lifecycle-agent --help:\n%s\nkubectl lifecycle --help:\n%s", tables[0], tables[1])
	}
}

// agentlessNode is a Node with the drain transition published by hand and
// no agent: the test plays the agent and writes the event's end state.
func agentlessNode(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	if err := testenv.CreateNode(ctx, env.AdminConfig(), node, map[string]string{"test": "exit-codes"}); err != nil {
		t.Fatal(err)
	}
	lt := &v1alpha1.LifecycleTransition{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-drain"},
		Spec: v1alpha1.LifecycleTransitionSpec{Start: "DrainStarted", End: "DrainComplete", NodeName: &node,
			Driver: "lifecycle-agent.x-k8s.io/drain"},
	}
	if _, err := lc.Transitions.Create(ctx, lt, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// eventOn waits for the one event bound to node.
func eventOn(t *testing.T, node string) string {
	t.Helper()
	name := ""
	waitFor(t, "an event on "+node, 30*time.Second, func() bool {
		if evs := eventsOn(t, node); len(evs) == 1 {
			name = evs[0].Name
		}
		return name != ""
	})
	return name
}

// endEvent writes the end state an agent would.
func endEvent(t *testing.T, name string, cs v1alpha1.LifecycleEventClaimStatus, msg string) {
	t.Helper()
	for i := 0; ; i++ {
		ev := getEvent(t, name)
		now := metav1.Now()
		ev.Status.ClaimStatus, ev.Status.Message, ev.Status.CompletionTime = cs, msg, &now
		_, err := lc.Events.UpdateStatus(context.Background(), ev, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 5 {
			t.Fatalf("end %s: %v", name, err)
		}
	}
}

type runJSON struct {
	Event       string `json:"event"`
	Node        string `json:"node"`
	Driver      string `json:"driver"`
	Transition  string `json:"transition"`
	ClaimStatus string `json:"claimStatus"`
	Message     string `json:"message"`
	Result      string `json:"result"`
	ExitCode    *int   `json:"exitCode"`
	Error       string `json:"error"`
}

func decodeOne(t *testing.T, stdout string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("-o json: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("-o json printed more than one object:\n%s", stdout)
	}
}

// TestRunExitCodes: kubectl lifecycle run --wait -o json exits with each
// code of the table in the situation that yields it, and its one JSON
// object says the same.
func TestRunExitCodes(t *testing.T) {
	tests := []struct {
		name  string
		code  int
		args  []string
		act   func(t *testing.T, ev string) // what happens to the event
		stat  string                        // its claimStatus in the JSON
		error string                        // in stderr and the JSON's error
	}{
		{name: "succeeded", code: exitcode.OK, stat: "Succeeded",
			act: func(t *testing.T, ev string) { endEvent(t, ev, v1alpha1.LifecycleEventSucceeded, "drained") }},
		{name: "failed", code: exitcode.Failed, stat: "Failed", error: "failed: step evict failed: boom",
			act: func(t *testing.T, ev string) {
				endEvent(t, ev, v1alpha1.LifecycleEventFailed, "step evict failed: boom")
			}},
		{name: "sla-expired", code: exitcode.SlaExpired, stat: "SlaExpired", error: "SLA expired: SLA 1h expired",
			act: func(t *testing.T, ev string) { endEvent(t, ev, v1alpha1.LifecycleEventSlaExpired, "SLA 1h expired") }},
		{name: "timeout", code: exitcode.Timeout, stat: "Pending", args: []string{"--timeout", "3s"}, error: "timed out after 3s",
			act: func(*testing.T, string) {}},
		{name: "cancelled", code: exitcode.Cancelled, stat: "Pending", error: "was deleted before it ended (cancelled)",
			act: func(t *testing.T, ev string) {
				if err := lc.Events.Delete(context.Background(), ev, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%d %s", tt.code, tt.name), func(t *testing.T) {
			node := fmt.Sprintf("exit-code-%d", i)
			agentlessNode(t, node)
			done := make(chan result, 1)
			go func() {
				done <- plugin(t, 90*time.Second, append([]string{"run", "drain", node, "--wait", "-o", "json"}, tt.args...)...)
			}()
			ev := eventOn(t, node)
			tt.act(t, ev)
			var r result
			select {
			case r = <-done:
			case <-time.After(100 * time.Second):
				t.Fatal("run --wait did not return")
			}
			wantExit(t, r, tt.code, "run --wait -o json")
			var got runJSON
			decodeOne(t, r.stdout, &got)
			if got.Event != ev || got.Node != node || got.Driver != "drain" || got.Transition != node+"-drain" || got.ClaimStatus != tt.stat ||
				got.Result != exitcode.Name(tt.code) || got.ExitCode == nil || *got.ExitCode != tt.code || !strings.Contains(got.Error, tt.error) {
				t.Errorf("-o json: %+v; want event %s, claimStatus %s, result %s, exitCode %d, error with %q", got, ev, tt.stat, exitcode.Name(tt.code), tt.code, tt.error)
			}
			if tt.error != "" {
				wantContains(t, r.stderr, tt.error, "stderr")
			}
			// The progress went to stderr.
			wantContains(t, r.stderr, "lifecycleevent "+ev+" created", "stderr")
		})
	}

	t.Run("130 interrupted", func(t *testing.T) {
		node := "exit-code-130"
		agentlessNode(t, node)
		cmd := exec.Command(pluginBin, "drain", node, "-o", "json", "--kubeconfig", adminKC)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		ev := eventOn(t, node)
		time.Sleep(500 * time.Millisecond) // into its wait
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitcode.Interrupted {
			t.Fatalf("%v: want exit 130\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
		}
		var got runJSON
		decodeOne(t, stdout.String(), &got)
		if got.Event != ev || got.Result != "interrupted" || got.ExitCode == nil || *got.ExitCode != exitcode.Interrupted {
			t.Errorf("-o json: %+v", got)
		}
		if eventGone(ev) {
			t.Error("the interrupted plugin took the event with it")
		}
	})

	t.Run("2 usage", func(t *testing.T) {
		for _, args := range [][]string{{"run", "drain", "n1", "-o", "yaml"}, {"rollout", "drain", "n1", "-o", "wide"}, {"cancel", "ev", "-o", "yaml"}, {"version", "-o", "name"}} {
			r := plugin(t, 30*time.Second, args...)
			wantExit(t, r, exitcode.Usage, strings.Join(args, " "))
			wantContains(t, r.stderr, "error: -o "+args[len(args)-1]+": ", "stderr")
			if r.stdout != "" {
				t.Errorf("%v: stdout %q", args, r.stdout)
			}
		}
	})

	t.Run("6 unavailable", func(t *testing.T) {
		port, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		r := plugin(t, 30*time.Second, "run", "drain", "n1", "--wait", "-o", "json", "--server", fmt.Sprintf("https://127.0.0.1:%d", port))
		wantExit(t, r, exitcode.Unavailable, "run against no API server")
		if r.stdout != "" {
			t.Errorf("stdout %q: nothing was done, nothing to print", r.stdout)
		}
	})
}

// -o name and -o json of run without --wait, cancel and rollout.
func TestActOutput(t *testing.T) {
	node := "act-output-1"
	agentlessNode(t, node)

	r := plugin(t, 30*time.Second, "run", "drain", node, "-o", "name")
	wantExit(t, r, 0, "run -o name")
	ev := strings.TrimSpace(r.stdout)
	if r.stdout != ev+"\n" || !strings.HasPrefix(ev, node+"-drain-") {
		t.Fatalf("run -o name: stdout %q, want the bare event name", r.stdout)
	}

	r = plugin(t, 30*time.Second, "cancel", ev, "--wait", "-o", "json")
	wantExit(t, r, 0, "cancel --wait -o json")
	var c struct {
		Events []struct {
			Event       string `json:"event"`
			Node        string `json:"node"`
			ClaimStatus string `json:"claimStatus"`
			Cancelled   bool   `json:"cancelled"`
			Gone        bool   `json:"gone"`
		} `json:"events"`
		Result   string `json:"result"`
		ExitCode *int   `json:"exitCode"`
	}
	decodeOne(t, r.stdout, &c)
	if len(c.Events) != 1 || c.Events[0].Event != ev || c.Events[0].Node != node || c.Events[0].ClaimStatus != "Pending" ||
		!c.Events[0].Cancelled || !c.Events[0].Gone || c.Result != "succeeded" || c.ExitCode == nil || *c.ExitCode != 0 {
		t.Errorf("cancel -o json: %+v", c)
	}

	done := make(chan result, 1)
	go func() {
		done <- plugin(t, 90*time.Second, "rollout", "drain", node, "--wait", "--group", "act-output", "-o", "json")
	}()
	rev := eventOn(t, node)
	endEvent(t, rev, v1alpha1.LifecycleEventSucceeded, "drained")
	r = <-done
	wantExit(t, r, 0, "rollout --wait -o json")
	var ro struct {
		Rollout string `json:"rollout"`
		Driver  string `json:"driver"`
		Nodes   []struct {
			Node        string `json:"node"`
			Event       string `json:"event"`
			State       string `json:"state"`
			ClaimStatus string `json:"claimStatus"`
			Message     string `json:"message"`
		} `json:"nodes"`
		Done, Running, Waiting, Failed int
		Result                         string `json:"result"`
		ExitCode                       *int   `json:"exitCode"`
	}
	decodeOne(t, r.stdout, &ro)
	if ro.Rollout != "act-output" || ro.Driver != "drain" || len(ro.Nodes) != 1 || ro.Nodes[0].Event != rev || ro.Nodes[0].State != "done" ||
		ro.Nodes[0].ClaimStatus != "Succeeded" || ro.Done != 1 || ro.Failed != 0 || ro.Result != "succeeded" || ro.ExitCode == nil || *ro.ExitCode != 0 {
		t.Errorf("rollout -o json: %+v", ro)
	}
	r = plugin(t, 30*time.Second, "rollout", "drain", node, "--group", "act-output", "-o", "name")
	wantExit(t, r, 0, "rollout -o name (adopts the finished event)")
	if r.stdout != rev+"\n" {
		t.Errorf("rollout -o name: stdout %q, want %q", r.stdout, rev+"\n")
	}

	// The listing commands' -o name and -o json (cli-runtime's printers).
	for _, args := range [][]string{{"status", rev}, {"status", node}, {"history", node}, {"transitions", node}} {
		r = plugin(t, 30*time.Second, append(args, "-o", "name")...)
		wantExit(t, r, 0, strings.Join(args, " ")+" -o name")
		if !strings.HasPrefix(r.stdout, "lifecycle") || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("%v -o name: stdout %q, want one kind/name line", args, r.stdout)
		}
		r = plugin(t, 30*time.Second, append(args, "-o", "json")...)
		wantExit(t, r, 0, strings.Join(args, " ")+" -o json")
		var obj struct{ Kind string }
		if err := json.Unmarshal([]byte(r.stdout), &obj); err != nil || !strings.HasPrefix(obj.Kind, "Lifecycle") {
			t.Errorf("%v -o json: kind %q, %v", args, obj.Kind, err)
		}
	}

	r = plugin(t, 30*time.Second, "version", "-o", "json")
	wantExit(t, r, 0, "version -o json")
	var v struct{ Name, Version, Commit, GoVersion string }
	decodeOne(t, r.stdout, &v)
	if v.Name != "kubectl-lifecycle" || v.Version == "" || v.GoVersion == "" {
		t.Errorf("version -o json: %+v", v)
	}
}
