package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/exitcode"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// fakeAgent serves the control socket's HTTP API with canned answers, so
// that the real binary can be run against each way an event can end.
type fakeAgent struct {
	socket string
	// event answers GET /event?name=: HTTP status and body.
	event func(name string) (int, string)
	polls atomic.Int32
}

func startFakeAgent(t *testing.T, event func(name string) (int, string)) *fakeAgent {
	t.Helper()
	// A short directory: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "la-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeAgent{socket: filepath.Join(dir, "agent.sock"), event: event}
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/event", func(w http.ResponseWriter, r *http.Request) {
		f.polls.Add(1)
		code, body := f.event(r.URL.Query().Get("name"))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprint(w, body)
	})
	mux.HandleFunc("/request", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Driver string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Driver == "frobnicate" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"no such enabled driver: \"frobnicate\" (enabled: drain, uncordon, reboot)"}`)
			return
		}
		fmt.Fprintf(w, `{"event":"smoke-node-%s-1","queued":false}`, req.Driver)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return f
}

func eventAnswer(claimStatus, step, message string) func(string) (int, string) {
	return func(name string) (int, string) {
		return 200, fmt.Sprintf(`{"name":%q,"source":"api","status":{"claimStatus":%q,"currentStep":%q,"message":%q}}`, name, claimStatus, step, message)
	}
}

// journalWithHistory writes a journal whose history holds one finished
// event, as an agent leaves it when it stops.
func journalWithHistory(t *testing.T, name string, outcome journal.Outcome, msg string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.db")
	j, _, err := journal.Open(context.Background(), path, journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	uid := "uid-" + name
	if err := j.PutEvent(journal.EventRecord{UID: uid, Name: name, Driver: "lifecycle-agent.x-k8s.io/reboot", State: journal.EventClaimed}); err != nil {
		t.Fatal(err)
	}
	if err := j.FinishEvent(uid, outcome, msg); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestExitCodes runs the real binary once per exit code of the table, in
// the situation that yields it, and checks the code and the one line.
func TestExitCodes(t *testing.T) {
	const ev = "smoke-node-reboot-20261201-100000-000001"
	running := startFakeAgent(t, eventAnswer("Claimed", "reboot", "rebooting"))
	gone := startFakeAgent(t, func(name string) (int, string) {
		return 404, `{"error":"event ` + name + ` does not exist: cancelled before it ended, or never bound to this node"}`
	})
	noAgent := filepath.Join(t.TempDir(), "none.sock")
	tests := []struct {
		name   string
		code   int
		socket string
		event  func(string) (int, string)
		args   []string
		stdout string // regexp
		stderr string // regexp of the one line
	}{
		{name: "succeeded", code: exitOK, event: eventAnswer("Succeeded", "uncordon", "transition RebootStarted → RebootComplete complete"),
			args: []string{"wait", ev}, stdout: `(?m)^\d\d:\d\d:\d\d ` + ev + `: Succeeded \(step uncordon\): transition RebootStarted → RebootComplete complete$`},
		{name: "succeeded, deleted at once (eventRetention 0): the journal's outcome", code: exitOK,
			event: func(name string) (int, string) {
				return 200, `{"name":"` + name + `","gone":true,"outcome":"Succeeded","source":"journal","status":{"message":"done"}}`
			},
			args: []string{"wait", ev}, stdout: `Succeeded: done \[from the journal`},
		{name: "failed", code: exitFailure, event: eventAnswer("Failed", "drain", "step drain failed: eviction refused"),
			args: []string{"wait", ev}, stderr: `^lifecycle-agent: wait: ` + ev + ` failed: step drain failed: eviction refused$`},
		{name: "usage", code: exitUsage, socket: noAgent, args: []string{"wait"},
			stderr: `^lifecycle-agent: wait: missing event name, e\.g\. .*; run 'lifecycle-agent wait --help'$`},
		{name: "usage: bad output", code: exitUsage, socket: noAgent, args: []string{"request", "reboot", "-o", "yaml"},
			stderr: `^lifecycle-agent: request: --output "yaml": want text, name, json; run 'lifecycle-agent request --help'$`},
		{name: "usage: driver refused by the agent", code: exitUsage, event: eventAnswer("", "", ""), args: []string{"request", "frobnicate"},
			stderr: `^lifecycle-agent: request: no such enabled driver: "frobnicate" \(enabled: drain, uncordon, reboot\)$`},
		{name: "sla expired", code: exitSlaExpired, event: eventAnswer("SlaExpired", "wait-boot", "SLA 2h0m0s expired"),
			args: []string{"wait", ev}, stderr: `^lifecycle-agent: wait: ` + ev + `: sla expired: SLA 2h0m0s expired$`},
		{name: "timeout while running", code: exitTimeout, socket: running.socket, args: []string{"wait", ev, "--timeout", "1500ms"},
			stdout: `Claimed \(step reboot\): rebooting`,
			stderr: `^lifecycle-agent: wait: ` + ev + `: still running after 1\.5s \(it goes on\); follow it again: lifecycle-agent wait ` + ev + `$`},
		{name: "request --wait timeout", code: exitTimeout, socket: running.socket, args: []string{"request", "reboot", "--wait", "--timeout", "1s", "-o", "name"},
			stdout: `^smoke-node-reboot-1\n$`, stderr: `still running after 1s \(it goes on\)`},
		{name: "request --wait: the event Failed", code: exitFailure, event: eventAnswer("Failed", "drain", "step drain failed: eviction refused"),
			args: []string{"request", "drain", "--wait", "-o", "name"}, stdout: `^smoke-node-drain-1\n$`,
			stderr: `^lifecycle-agent: request: smoke-node-drain-1 failed: step drain failed: eviction refused$`},
		{name: "request --wait: sla expired", code: exitSlaExpired, event: eventAnswer("SlaExpired", "wait-boot", "SLA 2h0m0s expired"),
			args: []string{"request", "reboot", "--wait"}, stderr: `^lifecycle-agent: request: smoke-node-reboot-1: sla expired: SLA 2h0m0s expired$`},
		{name: "request --wait: cancelled", code: exitCancelled, socket: gone.socket, args: []string{"request", "reboot", "--wait"},
			stderr: `^lifecycle-agent: request: smoke-node-reboot-1 was cancelled: event smoke-node-reboot-1 does not exist`},
		{name: "cancelled: deleted before it ended", code: exitCancelled, socket: gone.socket, args: []string{"wait", ev},
			stderr: `^lifecycle-agent: wait: ` + ev + ` was cancelled: event ` + ev + ` does not exist: cancelled before it ended, or never bound to this node$`},
		{name: "cancelled: the journal's outcome", code: exitCancelled,
			event: func(name string) (int, string) {
				return 200, `{"name":"` + name + `","gone":true,"outcome":"Cancelled","source":"journal","status":{"message":"the event was deleted: cancelled at step evict"}}`
			},
			args: []string{"wait", ev}, stderr: `was cancelled: the event was deleted: cancelled at step evict$`},
		{name: "agent unavailable: status", code: exitUnavailable, socket: noAgent, args: []string{"status"},
			stderr: `^lifecycle-agent: status: the agent is not running: no control socket at ` + regexp.QuoteMeta(noAgent) + `; start it: systemctl start lifecycle-agent$`},
		{name: "agent unavailable: request", code: exitUnavailable, socket: noAgent, args: []string{"request", "reboot", "--wait"},
			stderr: `^lifecycle-agent: request: the agent is not running: no control socket at `},
		{name: "agent unavailable: wait", code: exitUnavailable, socket: noAgent, args: []string{"wait", ev, "--agent-timeout", "1s"},
			stdout: `the agent is not running: .*; waiting up to 1s for the agent`,
			stderr: `^lifecycle-agent: wait: ` + ev + `: no answer from the agent for 1s: the agent is not running: no control socket at `},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d %s", tt.code, tt.name), func(t *testing.T) {
			socket := tt.socket
			if tt.event != nil {
				socket = startFakeAgent(t, tt.event).socket
			}
			r := agent(t, []string{"LIFECYCLE_AGENT_SOCKET_PATH=" + socket, "LIFECYCLE_AGENT_JOURNAL_PATH=" + filepath.Join(t.TempDir(), "absent.db")}, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit %d, want %d (%s)\nstdout: %s\nstderr: %s", r.code, tt.code, exitCodeName(tt.code), r.stdout, r.stderr)
			}
			checkOneLine(t, r.stderr, tt.stderr)
			if tt.stdout != "" && !regexp.MustCompile(tt.stdout).MatchString(r.stdout) {
				t.Errorf("stdout %q does not match %q", r.stdout, tt.stdout)
			}
		})
	}
}

func checkOneLine(t *testing.T, stderr, want string) {
	t.Helper()
	if want == "" {
		if stderr != "" {
			t.Errorf("stderr not empty: %q", stderr)
		}
		return
	}
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("stderr is not one line: %q", stderr)
	}
	if !regexp.MustCompile(want).MatchString(strings.TrimSuffix(stderr, "\n")) {
		t.Errorf("stderr %q does not match %q", stderr, want)
	}
}

// While the agent is down (after the reboot it performed, before it is
// back), wait reads the outcome from the journal's history.
func TestWaitOfflineFromJournal(t *testing.T) {
	const ev = "smoke-node-reboot-20261201-100000-000002"
	tests := []struct {
		name    string
		outcome journal.Outcome
		code    int
		stderr  string
	}{
		{name: "succeeded", outcome: journal.OutcomeSucceeded, code: exitOK},
		{name: "failed", outcome: journal.OutcomeFailed, code: exitFailure,
			stderr: `^lifecycle-agent: wait: ` + ev + ` failed: boot ID unchanged \(from the journal: the agent is not running\)$`},
		{name: "sla expired", outcome: journal.OutcomeSlaExpired, code: exitSlaExpired, stderr: `: sla expired: boot ID unchanged \(from the journal`},
		{name: "cancelled", outcome: journal.OutcomeCancelled, code: exitCancelled, stderr: ` was cancelled: boot ID unchanged \(from the journal`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := journalWithHistory(t, ev, tt.outcome, "boot ID unchanged")
			r := agent(t, []string{"LIFECYCLE_AGENT_SOCKET_PATH=" + filepath.Join(t.TempDir(), "none.sock"), "LIFECYCLE_AGENT_JOURNAL_PATH=" + path},
				"wait", ev, "-o", "json", "--agent-timeout", "1m")
			if r.code != tt.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", r.code, tt.code, r.stdout, r.stderr)
			}
			checkOneLine(t, r.stderr, tt.stderr)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			var last progress
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
				t.Fatalf("last line of -o json: %v\n%s", err, r.stdout)
			}
			if last.Event != ev || last.ExitCode == nil || *last.ExitCode != tt.code || last.Result != exitCodeName(tt.code) ||
				last.Source != "journal" || last.ClaimStatus != tt.outcome.String() {
				t.Errorf("last JSON line %s: want event %s, exitCode %d, result %s, source journal, claimStatus %s",
					lines[len(lines)-1], ev, tt.code, exitCodeName(tt.code), tt.outcome)
			}
		})
	}
}

// request -o name prints the bare name; -o json one object per line.
func TestRequestOutput(t *testing.T) {
	f := startFakeAgent(t, eventAnswer("Succeeded", "wait-empty", "done"))
	env := []string{"LIFECYCLE_AGENT_SOCKET_PATH=" + f.socket}
	r := agent(t, env, "request", "drain", "-o", "name")
	if r.code != 0 || r.stdout != "smoke-node-drain-1\n" || r.stderr != "" {
		t.Errorf("-o name: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = agent(t, env, "request", "drain", "-o", "json", "--wait")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("-o json --wait: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// The end state once, on the last line, with its result.
	want := []string{
		`{"event":"smoke-node-drain-1","claimStatus":"Pending"}`,
		`{"event":"smoke-node-drain-1","claimStatus":"Succeeded","step":"wait-empty","message":"done","source":"api","result":"succeeded","exitCode":0}`,
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i+1, lines[i], want[i])
		}
	}
}

// Every command's --help, cobra's help and completion commands and the
// hidden ones included, ends with the one exit code table
// (internal/exitcode), and docs/pipelines.md carries it.
func TestExitCodesDocumented(t *testing.T) {
	paths := exitcode.CommandPaths(newRootCmd(&env{}))
	if len(paths) < 20 {
		t.Fatalf("walked %d commands: the tree is not all there", len(paths))
	}
	for _, p := range paths {
		var stdout, stderr bytes.Buffer
		code := execute(context.Background(), append(p, "--help"), &stdout, &stderr)
		if code != exitOK || exitcode.FromHelp(stdout.String()) != exitcode.Help() {
			t.Errorf("lifecycle-agent %s --help: exit %d; the exit code table is not in:\n%s%s", strings.Join(p, " "), code, stdout.String(), stderr.String())
		}
	}
	// The real binary too.
	if got := exitcode.FromHelp(agent(t, nil, "wait", "--help").stdout); got != exitcode.Help() {
		t.Errorf("lifecycle-agent wait --help prints the table\n%s\nwant\n%s", got, exitcode.Help())
	}
	doc, err := os.ReadFile("../../docs/pipelines.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), exitcode.Markdown()) {
		t.Errorf("docs/pipelines.md lacks the table\n%s", exitcode.Markdown())
	}
}

// Every code of the table has its row in TestExitCodes or
// TestExitInterrupted: the table and the tests stay in step.
func TestEveryExitCodeTested(t *testing.T) {
	src, err := os.ReadFile("exitcodes_test.go")
	if err != nil {
		t.Fatal(err)
	}
	names := map[int]string{exitOK: "exitOK", exitFailure: "exitFailure", exitUsage: "exitUsage", exitSlaExpired: "exitSlaExpired",
		exitTimeout: "exitTimeout", exitCancelled: "exitCancelled", exitUnavailable: "exitUnavailable", exitInterrupted: "exitInterrupted"}
	for _, c := range exitcode.Table {
		n, ok := names[c.Code]
		if !ok || !strings.Contains(string(src), "code: "+n+",") {
			t.Errorf("exit %d (%s): no test row with code: %s", c.Code, c.Name, n)
		}
	}
}

// SIGINT (Ctrl-C) or SIGTERM while wait or request --wait follows an event
// exits 130, interrupted, as kubectl lifecycle does; the event goes on.
func TestExitInterrupted(t *testing.T) {
	const ev = "smoke-node-reboot-20261201-100000-000003"
	running := startFakeAgent(t, eventAnswer("Claimed", "reboot", "rebooting"))
	tests := []struct {
		name   string
		code   int
		sig    os.Signal
		args   []string
		stderr string
		json   bool
	}{
		{name: "wait, SIGINT", code: exitInterrupted, sig: os.Interrupt, args: []string{"wait", ev},
			stderr: `^lifecycle-agent: wait: ` + ev + `: interrupted \(it goes on\); follow it again: lifecycle-agent wait ` + ev + `$`},
		{name: "request --wait -o json, SIGTERM", code: exitInterrupted, sig: syscall.SIGTERM, args: []string{"request", "reboot", "--wait", "-o", "json"},
			stderr: `^lifecycle-agent: request: smoke-node-reboot-1: interrupted \(it goes on\)`, json: true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d %s", tt.code, tt.name), func(t *testing.T) {
			cmd := exec.Command(binary, tt.args...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "LIFECYCLE_AGENT_CONFIG=" + configFile(t, ""),
				"LIFECYCLE_AGENT_NODE_NAME=smoke-node", "LIFECYCLE_AGENT_SOCKET_PATH=" + running.socket}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Signal once it follows the event: its first progress line.
			sc := bufio.NewScanner(out)
			var lines []string
			for sc.Scan() {
				lines = append(lines, sc.Text())
				if strings.Contains(sc.Text(), "Claimed") {
					break
				}
			}
			if err := cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tt.code {
				t.Fatalf("%v: want exit %d\nstdout: %s\nstderr: %s", err, tt.code, strings.Join(lines, "\n"), stderr.String())
			}
			checkOneLine(t, stderr.String(), tt.stderr)
			if tt.json {
				var last progress
				if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || last.ExitCode == nil || *last.ExitCode != tt.code || last.Result != "interrupted" {
					t.Errorf("last JSON line %q: want result interrupted, exitCode %d (%v)", lines[len(lines)-1], tt.code, err)
				}
			}
		})
	}
}

// A second `run` refuses to start while an agent answers on the socket,
// names the process, and leaves the socket alone.
func TestRunRefusesABusySocket(t *testing.T) {
	f := startFakeAgent(t, eventAnswer("", "", ""))
	dir := t.TempDir()
	r := agent(t, nil, "run", "--socket", f.socket, "--journal", filepath.Join(dir, "journal.db"), "--kubeconfig", filepath.Join(dir, "kubeconfig"))
	if r.code != exitFailure {
		t.Errorf("exit %d, want 1\nstderr: %s", r.code, r.stderr)
	}
	checkOneLine(t, r.stderr, `^lifecycle-agent: run: control socket in use: pid `+fmt.Sprint(os.Getpid())+` \(.+\) already serves `+
		regexp.QuoteMeta(f.socket)+`; stop it first \(systemctl stop lifecycle-agent\), or give this agent its own --socket$`)
	if fi, err := os.Lstat(f.socket); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("the other process's socket is gone: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "journal.db")); err == nil {
		t.Error("the refused run created a journal")
	}
	// The fake agent still answers.
	if r := agent(t, []string{"LIFECYCLE_AGENT_SOCKET_PATH=" + f.socket}, "request", "drain", "-o", "name"); r.code != 0 {
		t.Errorf("the first agent no longer answers: exit %d %s", r.code, r.stderr)
	}
}
