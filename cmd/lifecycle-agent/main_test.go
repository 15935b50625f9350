package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// binary is the real lifecycle-agent, built once by TestMain.
var binary string

const (
	smokeVersion = "1.2.3-smoke"
	smokeCommit  = "abc1234"
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lifecycle-agent-smoke-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "lifecycle-agent")
	build := exec.Command("go", "build", "-tags", "kustomize_disable_go_plugin_support",
		"-ldflags", "-X main.version="+smokeVersion+" -X main.commit="+smokeCommit,
		"-o", binary, ".")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build lifecycle-agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

// agent runs the binary with a clean environment: no LIFECYCLE_AGENT_*
// variables but LIFECYCLE_AGENT_CONFIG, pointing at a valid empty config, so
// that the host's /etc/lifecycle-agent/config.yaml never matters.
func agent(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + t.TempDir(),
		"LIFECYCLE_AGENT_CONFIG=" + configFile(t, ""),
		"LIFECYCLE_AGENT_NODE_NAME=smoke-node",
	}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	code := 0
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func configFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSmoke(t *testing.T) {
	badConfig := configFile(t, "host:\n  mdoe: simulate\n")
	writable := configFile(t, "logLevel: debug\n")
	if err := os.Chmod(writable, 0o666); err != nil {
		t.Fatal(err)
	}
	manDir := filepath.Join(t.TempDir(), "man8")
	runDir := t.TempDir()
	garbage := filepath.Join(runDir, "garbage.db")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("not a journal "), 5000), 0o600); err != nil {
		t.Fatal(err)
	}
	// A 0-byte journal (a crash or a full disk between bbolt's create and
	// its first write): not corrupt, the agent starts it afresh.
	empty := filepath.Join(runDir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	versionLine := regexp.QuoteMeta("lifecycle-agent "+smokeVersion+" (commit "+smokeCommit+", ") + `go[0-9.]+.*\)` + "\n$"

	tests := []struct {
		name   string
		args   []string
		env    []string
		code   int
		stdout string // regexp; "" = must be empty
		stderr string // exact, after replacing FILE; "" = must be empty
		files  []string
	}{
		{name: "--version", args: []string{"--version"}, stdout: "^" + versionLine},
		{name: "version", args: []string{"version"}, stdout: "^" + versionLine},
		{name: "manifests", args: []string{"manifests"}, stdout: `(?s)^---\n# Source: deploy/.*apiVersion:`},

		// Usage errors: exit 2, one line, with a --help hint.
		{
			name: "no command", args: nil, code: 2,
			stderr: "lifecycle-agent: missing command; run 'lifecycle-agent --help'",
		},
		{
			name: "unknown command", args: []string{"frobnicate"}, code: 2,
			stderr: `lifecycle-agent: unknown command "frobnicate"; run 'lifecycle-agent --help'`,
		},
		{
			name: "misspelt command", args: []string{"verison"}, code: 2,
			stderr: `lifecycle-agent: unknown command "verison" (did you mean "version"?); run 'lifecycle-agent --help'`,
		},
		{
			name: "unknown flag", args: []string{"status", "--bogus"}, code: 2,
			stderr: "lifecycle-agent: status: unknown flag: --bogus; run 'lifecycle-agent status --help'",
		},
		{
			name: "unknown root flag", args: []string{"--bogus", "version"}, code: 2,
			stderr: "lifecycle-agent: unknown flag: --bogus; run 'lifecycle-agent --help'",
		},
		{
			name: "bad flag value", args: []string{"run", "--event-retention", "banana"}, code: 2,
			stderr: `lifecycle-agent: run: invalid argument "banana" for "--event-retention" flag: time: invalid duration "banana"; run 'lifecycle-agent run --help'`,
		},
		{
			name: "request without driver", args: []string{"request"}, code: 2,
			stderr: "lifecycle-agent: request: missing driver name, e.g. 'lifecycle-agent request reboot'; run 'lifecycle-agent request --help'",
		},
		{
			name: "request with two drivers", args: []string{"request", "drain", "reboot"}, code: 2,
			stderr: `lifecycle-agent: request: unexpected argument "reboot"; run 'lifecycle-agent request --help'`,
		},
		{
			name: "request bad param", args: []string{"request", "drain", "--param", "force"}, code: 2,
			stderr: `lifecycle-agent: request: --param "force": want key=value; run 'lifecycle-agent request --help'`,
		},
		{
			name: "request param twice", args: []string{"request", "drain", "--param", "a=1", "--param", "a=2"}, code: 2,
			stderr: `lifecycle-agent: request: --param a given twice; run 'lifecycle-agent request --help'`,
		},
		{
			name: "request timeout without wait", args: []string{"request", "reboot", "--timeout", "5m"}, code: 2,
			stderr: `lifecycle-agent: request: --timeout needs --wait; run 'lifecycle-agent request --help'`,
		},
		{
			name: "status with an argument", args: []string{"status", "now"}, code: 2,
			stderr: `lifecycle-agent: status: unexpected argument "now"; run 'lifecycle-agent status --help'`,
		},
		{
			name: "journal without subcommand", args: []string{"journal"}, code: 2,
			stderr: "lifecycle-agent: journal: missing subcommand: verify, export or compact; run 'lifecycle-agent journal --help'",
		},
		{
			name: "journal unknown subcommand", args: []string{"journal", "verfy"}, code: 2,
			stderr: `lifecycle-agent: journal: unknown command "verfy" (did you mean "verify"?); run 'lifecycle-agent journal --help'`,
		},

		// Config errors: exit 2, one line naming the key and the file.
		{
			name: "config with an unknown key", args: []string{"--config", badConfig, "status"}, code: 2,
			stderr: `lifecycle-agent: config: ` + badConfig + `:2: unknown key "host.mdoe" (did you mean "host.mode"?)`,
		},
		{
			name: "config from env with an unknown key", args: []string{"doctor"}, code: 2,
			env:    []string{"LIFECYCLE_AGENT_CONFIG=" + badConfig},
			stderr: `lifecycle-agent: config: ` + badConfig + `:2: unknown key "host.mdoe" (did you mean "host.mode"?)`,
		},
		{
			name: "writable config", args: []string{"--config", writable, "run"}, code: 2,
			stderr: `lifecycle-agent: config: ` + writable + `: file is group- or world-writable (mode 0666); run chmod 600 ` + writable,
		},
		{
			name: "missing explicit config", args: []string{"--config", "/nonexistent/config.yaml", "journal", "verify"}, code: 2,
			stderr: `lifecycle-agent: config: /nonexistent/config.yaml: cannot read config file: no such file or directory`,
		},
		{
			name: "bad value from a flag", args: []string{"run", "--host-mode", "banana"}, code: 2,
			stderr: `lifecycle-agent: config: flag --host-mode: key host.mode: invalid value "banana"; want real or simulate`,
		},
		{
			name: "bad value from env", args: []string{"status"}, code: 2,
			env:    []string{"LIFECYCLE_AGENT_METRICS_ADDRESS=0.0.0.0:9810"},
			stderr: `lifecycle-agent: config: env LIFECYCLE_AGENT_METRICS_ADDRESS: key metricsAddress: address "0.0.0.0:9810" is not loopback: metrics listen on 127.0.0.1 or [::1] only`,
		},
		{
			name: "commands without config ignore a broken one", args: []string{"--config", badConfig, "version"},
			stdout: "^" + versionLine,
		},

		// Runtime failures: exit 1 with one line.
		{
			name: "run with a missing kubeconfig", args: []string{"run", "--log-level", "error", "--journal", runDir + "/journal.db", "--kubeconfig", runDir + "/missing"}, code: 1,
			stderr: "lifecycle-agent: run: apiclient: kubeconfig " + runDir + "/missing: stat " + runDir + "/missing: no such file or directory",
		},
		{
			name: "journal verify of a missing file", args: []string{"journal", "verify", "--journal", runDir + "/absent.db"}, code: 1,
			stderr: "lifecycle-agent: journal verify: no journal at " + runDir + "/absent.db (the agent creates it at its first start; is --journal right?)",
		},
		{
			name: "journal verify of an empty file", args: []string{"journal", "verify", "--journal", empty},
			stdout: "^" + regexp.QuoteMeta(empty+": ok: empty (0 bytes), a journal never written; the agent starts it afresh") + "\n$",
		},
		{
			name: "journal export of an empty file", args: []string{"journal", "export", "--journal", empty},
			stdout: `(?s)^\{\n  "path": "` + regexp.QuoteMeta(empty) + `",\n  "schemaVersion": 0,\n  "events": \[\],.*"history": \[\]\n\}\n$`,
		},
		{
			name: "journal compact of an empty file", args: []string{"journal", "compact", "--journal", empty},
			stdout: "^" + regexp.QuoteMeta(empty+": compacted 0 → 0 bytes") + "\n$",
		},
		{
			name: "journal verify of garbage", args: []string{"journal", "verify", "--journal", garbage}, code: 1,
			stderr: "lifecycle-agent: journal verify: the journal is corrupt: " + garbage + ": invalid database; the agent moves it aside (journal.db.corrupt-<time>) and starts afresh at its next start, see docs/troubleshooting.md",
		},

		// One output flag style: -o, with --json its alias.
		{
			name: "doctor -o yaml", args: []string{"doctor", "-o", "yaml"}, code: 2,
			stderr: `lifecycle-agent: doctor: --output "yaml": want text, json; run 'lifecycle-agent doctor --help'`,
		},
		{
			name: "status --json -o text", args: []string{"status", "--json", "-o", "text", "--socket", runDir + "/none.sock"}, code: 2,
			stderr: `lifecycle-agent: status: --json and --output "text": give one of them; run 'lifecycle-agent status --help'`,
		},
		{
			name: "status -o json without an agent", args: []string{"status", "-o", "json", "--socket", runDir + "/none.sock"}, code: 6,
			stderr: `lifecycle-agent: status: the agent is not running: no control socket at ` + runDir + `/none.sock; start it: systemctl start lifecycle-agent`,
		},

		// The agent does not answer: exit 6, retry later.
		{
			name: "status without an agent", args: []string{"status", "--json", "--socket", runDir + "/none.sock"}, code: 6,
			stderr: `lifecycle-agent: status: the agent is not running: no control socket at ` + runDir + `/none.sock; start it: systemctl start lifecycle-agent`,
		},
		{
			name: "request without an agent", args: []string{"request", "gpu-reset", "--param", "gpus=0,1", "--wait", "--timeout", "1m", "--socket", runDir + "/none.sock"}, code: 6,
			stderr: `lifecycle-agent: request: the agent is not running: no control socket at ` + runDir + `/none.sock; start it: systemctl start lifecycle-agent`,
		},

		// Hidden helpers for packaging.
		{
			name: "gen-man", args: []string{"gen-man", manDir},
			files: []string{"lifecycle-agent.8", "lifecycle-agent-run.8", "lifecycle-agent-journal-verify.8"},
		},
		{name: "completion", args: []string{"completion", "bash"}, stdout: `bash completion`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := agent(t, tt.env, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, tt.code, r.stdout, r.stderr)
			}
			if tt.stdout == "" && r.stdout != "" {
				t.Errorf("stdout not empty: %q", r.stdout)
			}
			if tt.stdout != "" && !regexp.MustCompile(tt.stdout).MatchString(r.stdout) {
				t.Errorf("stdout %q does not match %q", r.stdout, tt.stdout)
			}
			want := ""
			if tt.stderr != "" {
				want = tt.stderr + "\n" // exactly one line
			}
			if r.stderr != want {
				t.Errorf("stderr:\n got %q\nwant %q", r.stderr, want)
			}
			for _, f := range tt.files {
				if fi, err := os.Stat(filepath.Join(manDir, f)); err != nil || fi.Size() == 0 {
					t.Errorf("man page %s: %v", f, err)
				}
			}
		})
	}
}

// TestHelp: every command, hidden ones included, has --help, exit 0.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{
		{}, {"run"}, {"status"}, {"request"}, {"wait"}, {"doctor"}, {"journal"}, {"journal", "verify"},
		{"journal", "export"}, {"journal", "compact"}, {"journal", "check-file"},
		{"manifests"}, {"version"}, {"gen-man"}, {"completion"},
	} {
		name := strings.Join(append([]string{"lifecycle-agent"}, args...), " ")
		t.Run(name, func(t *testing.T) {
			r := agent(t, nil, append(args, "--help")...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
			}
			if !strings.Contains(r.stdout, "Usage:\n  "+name) {
				t.Errorf("help does not show usage of %q:\n%s", name, r.stdout)
			}
		})
	}
}
