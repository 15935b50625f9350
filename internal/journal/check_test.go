package journal

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// TestCommandCheckerProtocol pins how the subprocess's exit is read. Only a
// confirmed result may lead to a file being moved aside or refused; anything
// else must be an error that wraps no sentinel.
func TestCommandCheckerProtocol(t *testing.T) {
	const start = "echo 'journal-check: start'; "
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		wantErr error // nil with wantOK false: an error wrapping no sentinel
		wantOK  bool
	}{
		{name: "clean", script: start + "echo 'journal-check: ok'", wantOK: true},
		{name: "exit 0 without confirming", script: "exit 0"},
		{name: "corrupt", script: start + "echo 'bad page' >&2; exit 10", wantErr: ErrCorrupt},
		{name: "locked", script: start + "exit 11", wantErr: ErrLocked},
		{name: "schema too new", script: start + "exit 12", wantErr: ErrSchemaTooNew},
		{name: "crash while checking", script: start + "echo 'panic: page 6: expected leaf' >&2; exit 2", wantErr: ErrCorrupt},
		{name: "fault while checking", script: start + "kill -BUS $$", wantErr: ErrCorrupt},
		{name: "exit 2 before checking (usage)", script: "echo 'unknown flag' >&2; exit 2"},
		{name: "killed while checking", script: start + "kill -KILL $$"},
		{name: "check failed", script: start + "exit 13"},
		{name: "usage", script: "exit 14"},
		{name: "unknown exit code", script: start + "exit 1"},
		{name: "timeout", script: start + "exec sleep 10", timeout: 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timeout := tt.timeout
			if timeout == 0 {
				timeout = 10 * time.Second
			}
			check := CommandChecker([]string{"/bin/sh", "-c", tt.script, "sh"}, time.Second, timeout)
			err := check(context.Background(), "/var/lib/lifecycle-agent/journal.db")
			switch {
			case tt.wantOK:
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			case tt.wantErr != nil:
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			default:
				if err == nil {
					t.Fatal("err = nil, want an error")
				}
				for _, s := range []error{ErrCorrupt, ErrLocked, ErrSchemaTooNew} {
					if errors.Is(err, s) {
						t.Fatalf("err = %v wraps %v", err, s)
					}
				}
			}
			wantErrContains(t, err, "/var/lib/lifecycle-agent/journal.db")
		})
	}
}

func TestCommandCheckerArguments(t *testing.T) {
	check := CommandChecker([]string{"/bin/sh", "-c", `echo "journal-check: start"; echo "args: $*" >&2; exit 10`, "sh", "journal", "check-file"}, 1500*time.Millisecond, 10*time.Second)
	err := check(context.Background(), "/tmp/j.db")
	wantErrContains(t, err, "args: journal check-file --lock-timeout=1.5s /tmp/j.db")
}

func TestRunCheck(t *testing.T) {
	path := journalPath(t)
	fillJournal(t, path, 1)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "healthy", args: []string{path}, wantCode: ExitCheckOK, wantStdout: "journal-check: ok " + path},
		{name: "with lock timeout", args: []string{"--lock-timeout=2s", path}, wantCode: ExitCheckOK},
		{name: "missing file", args: []string{path + ".missing"}, wantCode: ExitCheckFailed, wantStderr: "no such file"},
		{name: "no path", args: nil, wantCode: ExitCheckUsage, wantStderr: "missing PATH"},
		{name: "bad flag", args: []string{"--lock-timeout=soon", path}, wantCode: ExitCheckUsage, wantStderr: "bad --lock-timeout"},
		{name: "two paths", args: []string{path, path}, wantCode: ExitCheckUsage, wantStderr: "unexpected argument"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := RunCheck(tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) || !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stdout %q, stderr %q; want %q, %q", stdout.String(), stderr.String(), tt.wantStdout, tt.wantStderr)
			}
		})
	}
}

func TestInProcessChecker(t *testing.T) {
	path := journalPath(t)
	fillJournal(t, path, 2)
	opts := testOptions(t)
	opts.CheckCommand = nil
	opts.Checker = InProcessChecker(time.Second)
	j, rep := openJournal(t, path, opts)
	if rep.Corruption != nil || rep.Created {
		t.Fatalf("report = %+v", rep)
	}
	if evs, _ := j.Events(); len(evs) != 2 {
		t.Errorf("Events() = %d, want 2", len(evs))
	}
	_ = j.Close()

	// A garbage file is refused by bbolt's open, which is safe in process.
	garbage := journalPath(t)
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("junk"), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	_, rep = openJournal(t, garbage, opts)
	if rep.Corruption == nil || rep.Corruption.MovedTo != garbage+corruptSuffix {
		t.Errorf("report = %+v, want the garbage moved aside", rep)
	}
}
