package host

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func newTestRunner(t *testing.T, edit func(*RunnerConfig)) *Runner {
	cfg := RunnerConfig{Logger: testLogger(t), WaitDelay: 300 * time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	return NewRunner(cfg)
}

// killPIDs kills, at cleanup, the processes whose pids a test command
// printed on its first stdout lines.
func killPIDs(t *testing.T, stdout []byte) {
	t.Helper()
	for _, f := range strings.Fields(string(stdout)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		}
	}
}

// gone reports whether pid no longer runs (absent, or a zombie nobody has
// reaped yet).
func gone(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(data), ')')
	return i > 0 && i+2 < len(data) && data[i+2] == 'Z'
}

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cmd        Cmd
		wantCode   int
		wantOut    string
		wantErrOut string
		wantErr    bool
		wantMsg    []string // substrings of the error message
	}{
		{
			name:       "success captures both streams",
			cmd:        Cmd{Path: "sh", Args: []string{"-c", "echo out; echo err >&2"}},
			wantOut:    "out\n",
			wantErrOut: "err\n",
		},
		{
			name:    "env and dir",
			cmd:     Cmd{Path: "sh", Args: []string{"-c", `echo "$FOO"; pwd`}, Env: []string{"FOO=bar"}, Dir: "/"},
			wantOut: "bar\n/\n",
		},
		{
			name:       "non-zero exit carries stderr",
			cmd:        Cmd{Path: "sh", Args: []string{"-c", "echo partial; echo boom >&2; exit 3"}},
			wantCode:   3,
			wantOut:    "partial\n",
			wantErrOut: "boom\n",
			wantErr:    true,
			wantMsg:    []string{`"sh -c echo partial; echo boom >&2; exit 3"`, "exit code 3", "stderr: boom"},
		},
		{
			name:     "stdout quoted when stderr is empty",
			cmd:      Cmd{Path: "sh", Args: []string{"-c", "echo only-out; exit 1"}},
			wantCode: 1,
			wantOut:  "only-out\n",
			wantErr:  true,
			wantMsg:  []string{"exit code 1", "stdout: only-out"},
		},
		{
			name:     "killed by signal",
			cmd:      Cmd{Path: "sh", Args: []string{"-c", "kill -KILL $$"}},
			wantCode: -1,
			wantErr:  true,
			wantMsg:  []string{"killed by signal killed"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := newTestRunner(t, nil).Run(testCtx(t), tc.cmd)
			if res.ExitCode != tc.wantCode || string(res.Stdout) != tc.wantOut || string(res.Stderr) != tc.wantErrOut {
				t.Fatalf("Result = {%d %q %q}, want {%d %q %q}", res.ExitCode, res.Stdout, res.Stderr, tc.wantCode, tc.wantOut, tc.wantErrOut)
			}
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
				return
			}
			var ee *ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("Run error = %v (%T), want *ExitError", err, err)
			}
			if ee.ExitCode != tc.wantCode || ee.Stderr != tc.wantErrOut || ee.Stdout != tc.wantOut || ee.TimedOut {
				t.Fatalf("ExitError = %+v", ee)
			}
			var xe *exec.ExitError
			if !errors.As(err, &xe) {
				t.Fatalf("error %v does not wrap *exec.ExitError", err)
			}
			for _, m := range tc.wantMsg {
				if !strings.Contains(err.Error(), m) {
					t.Fatalf("error %q lacks %q", err, m)
				}
			}
		})
	}
}

func TestRunTimeoutKillsProcessGroup(t *testing.T) {
	start := time.Now()
	// The background sleep shares the group and the stdout pipe.
	res, err := newTestRunner(t, nil).Run(testCtx(t), Cmd{
		Path: "sh", Args: []string{"-c", "sleep 30 & echo $!; wait"}, Timeout: time.Second,
	})
	killPIDs(t, res.Stdout)
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Fatalf("Run took %s", elapsed)
	}
	var ee *ExitError
	if !errors.As(err, &ee) || !ee.TimedOut || ee.Timeout != time.Second {
		t.Fatalf("Run error = %#v, want a timed-out ExitError", err)
	}
	if !errors.Is(err, ErrCommandTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v does not match ErrCommandTimeout and DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), "timed out after 1s") {
		t.Fatalf("message %q", err)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if perr != nil {
		t.Fatalf("no child pid in stdout %q", res.Stdout)
	}
	ctx := testCtx(t)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !gone(pid) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("background child %d of the timed-out command still runs", pid)
		}
	}
}

func TestRunWaitDelay(t *testing.T) {
	// The escaped child (own session, so outside the group that is
	// signalled) prints its pid, says it is ready and keeps stdout open.
	const escape = `setsid sh -c 'echo $$; touch "$0.ready"; exec sleep 20' "$0" &
while [ ! -e "$0.ready" ]; do sleep 0.01; done
`
	for _, tc := range []struct {
		name    string
		script  string
		cancel  bool // cancel the context once the escaped child is ready
		wantErr error
	}{
		{name: "cancelled command", script: escape + "sleep 30", cancel: true, wantErr: context.Canceled},
		{name: "successful command", script: escape + "exit 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tctx := testCtx(t)
			ctx, cancel := context.WithCancel(tctx)
			defer cancel()
			marker := filepath.Join(t.TempDir(), "child")
			if tc.cancel {
				go func() {
					tick := time.NewTicker(5 * time.Millisecond)
					defer tick.Stop()
					for {
						if _, err := os.Stat(marker + ".ready"); err == nil {
							cancel()
							return
						}
						select {
						case <-tick.C:
						case <-ctx.Done():
							return
						}
					}
				}()
			}
			start := time.Now()
			res, err := newTestRunner(t, nil).Run(ctx, Cmd{Path: "sh", Args: []string{"-c", tc.script, marker}, Timeout: time.Minute})
			killPIDs(t, res.Stdout)
			if elapsed := time.Since(start); elapsed > 15*time.Second {
				t.Fatalf("Run took %s: WaitDelay did not cut the pipes", elapsed)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Run error = %v, want %v", err, tc.wantErr)
			}
			if strings.TrimSpace(string(res.Stdout)) == "" {
				t.Fatal("escaped child printed nothing")
			}
		})
	}
}

func TestRunParentCancel(t *testing.T) {
	tctx := testCtx(t)
	ctx, cancel := context.WithCancel(tctx)
	started := t.TempDir() + "/started"
	done := make(chan error, 1)
	go func() {
		_, err := newTestRunner(t, nil).Run(ctx, Cmd{Path: "sh", Args: []string{"-c", `touch "$0"; exec sleep 30`, started}})
		done <- err
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(started); err == nil {
			break
		}
		select {
		case <-tick.C:
		case <-tctx.Done():
			t.Fatal("command never started")
		}
	}
	cancel()
	select {
	case err := <-done:
		var ee *ExitError
		if !errors.As(err, &ee) || ee.TimedOut || !errors.Is(err, context.Canceled) || errors.Is(err, ErrCommandTimeout) {
			t.Fatalf("Run error = %v, want a cancelled ExitError", err)
		}
		if !strings.Contains(err.Error(), "cancelled") {
			t.Fatalf("message %q does not say cancelled", err)
		}
	case <-tctx.Done():
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunStartFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		cmd  Cmd
		want error
	}{
		{name: "missing binary", cmd: Cmd{Path: "/nonexistent/bin"}, want: os.ErrNotExist},
		{name: "empty path", cmd: Cmd{}, want: ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := newTestRunner(t, nil).Run(testCtx(t), tc.cmd)
			var ee *ExitError
			if !errors.Is(err, tc.want) || errors.As(err, &ee) || res.ExitCode != -1 {
				t.Fatalf("Run = %+v, %v; want %v and no ExitError", res, err, tc.want)
			}
		})
	}
}

func TestRunTruncatesOutput(t *testing.T) {
	r := newTestRunner(t, func(c *RunnerConfig) { c.MaxOutput = 16 })
	res, err := r.Run(testCtx(t), Cmd{Path: "sh", Args: []string{"-c", "printf 'abcdefghij0123456789ABCDEFGHIJ' >&2; exit 1"}})
	var ee *ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("Run error = %v", err)
	}
	want := "abcdefgh\n…[14 bytes truncated]…\nCDEFGHIJ"
	if string(res.Stderr) != want || ee.Stderr != want {
		t.Fatalf("stderr = %q, want %q", res.Stderr, want)
	}
}

func TestCapBuffer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    int
		writes []string
		want   string
	}{
		{name: "fits", max: 10, writes: []string{"abc", "de"}, want: "abcde"},
		{name: "exactly full", max: 4, writes: []string{"ab", "cd"}, want: "abcd"},
		{name: "head and tail kept", max: 4, writes: []string{"abcdefgh"}, want: "ab\n…[4 bytes truncated]…\ngh"},
		{name: "many small writes", max: 4, writes: []string{"a", "b", "c", "d", "e", "f"}, want: "ab\n…[2 bytes truncated]…\nef"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newCapBuffer(tc.max)
			for _, w := range tc.writes {
				if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if got := string(b.Bytes()); got != tc.want {
				t.Fatalf("Bytes = %q, want %q", got, tc.want)
			}
		})
	}
}
