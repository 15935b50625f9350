package host

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTransientArgv(t *testing.T) {
	for _, tc := range []struct {
		name     string
		unit     TransientUnit
		want     []string
		wantUnit string
		wantErr  error
	}{
		{
			name:     "minimal",
			unit:     TransientUnit{Name: "lifecycle-upgrade-abc", Cmd: Cmd{Path: "/usr/bin/apt-get", Args: []string{"-y", "dist-upgrade"}}},
			want:     []string{"--unit=lifecycle-upgrade-abc.service", "--wait", "--collect", "--service-type=exec", "--", "/usr/bin/apt-get", "-y", "dist-upgrade"},
			wantUnit: "lifecycle-upgrade-abc.service",
		},
		{
			name: "everything",
			unit: TransientUnit{
				Name:        "lifecycle-upgrade-abc.service",
				Description: "OS upgrade for event abc",
				Cmd:         Cmd{Path: "/usr/local/sbin/upgrade", Env: []string{"DEBIAN_FRONTEND=noninteractive"}, Dir: "/var/tmp"},
				RuntimeMax:  90*time.Minute + 500*time.Millisecond,
				Properties:  []string{"KillMode=mixed"},
			},
			want: []string{
				"--unit=lifecycle-upgrade-abc.service", "--wait", "--collect", "--service-type=exec",
				"--description=OS upgrade for event abc", "--working-directory=/var/tmp",
				"--setenv=DEBIAN_FRONTEND=noninteractive", "--property=RuntimeMaxSec=5401", "--property=KillMode=mixed",
				"--", "/usr/local/sbin/upgrade",
			},
			wantUnit: "lifecycle-upgrade-abc.service",
		},
		{name: "empty name", unit: TransientUnit{Cmd: Cmd{Path: "/bin/true"}}, wantErr: ErrInvalidUnitName},
		{name: "not a service", unit: TransientUnit{Name: "x.timer", Cmd: Cmd{Path: "/bin/true"}}, wantErr: ErrInvalidUnitName},
		{name: "bad character", unit: TransientUnit{Name: "a b", Cmd: Cmd{Path: "/bin/true"}}, wantErr: ErrInvalidUnitName},
		{name: "too long", unit: TransientUnit{Name: strings.Repeat("a", 250), Cmd: Cmd{Path: "/bin/true"}}, wantErr: ErrInvalidUnitName},
		{name: "no command", unit: TransientUnit{Name: "x"}, wantErr: ErrInvalidArgument},
		{name: "bad env", unit: TransientUnit{Name: "x", Cmd: Cmd{Path: "/bin/true", Env: []string{"NOEQUALS"}}}, wantErr: ErrInvalidArgument},
		{name: "bad property", unit: TransientUnit{Name: "x", Cmd: Cmd{Path: "/bin/true"}, Properties: []string{"KillMode"}}, wantErr: ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, unit, err := transientArgv(tc.unit)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr != nil {
				return
			}
			if unit != tc.wantUnit || !slices.Equal(got, tc.want) {
				t.Fatalf("transientArgv = %q, %q\nwant %q, %q", unit, got, tc.wantUnit, tc.want)
			}
		})
	}
}

// fakeTool writes an executable shell script standing in for a systemd tool.
func fakeTool(t *testing.T, name, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunTransient(t *testing.T) {
	// Prints its arguments one per line, then fails as the unit would.
	systemdRun := fakeTool(t, "systemd-run", `for a in "$@"; do printf '%s\n' "$a"; done
[ -n "$FAKE_FAIL" ] && { echo "Finished with result: exit-code" >&2; exit 4; }
exit 0
`)
	for _, tc := range []struct {
		name     string
		fail     bool
		wantCode int
	}{
		{name: "unit succeeds"},
		{name: "unit fails", fail: true, wantCode: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.fail {
				t.Setenv("FAKE_FAIL", "1")
			}
			r := newTestRunner(t, func(c *RunnerConfig) { c.SystemdRun = systemdRun })
			unit, res, err := r.RunTransient(testCtx(t), TransientUnit{Name: "lifecycle-exec-1", Cmd: Cmd{Path: "/bin/echo", Args: []string{"hi"}}})
			if unit != "lifecycle-exec-1.service" {
				t.Fatalf("unit = %q", unit)
			}
			wantArgs := "--unit=lifecycle-exec-1.service\n--wait\n--collect\n--service-type=exec\n--\n/bin/echo\nhi\n"
			if string(res.Stdout) != wantArgs {
				t.Fatalf("systemd-run got\n%s\nwant\n%s", res.Stdout, wantArgs)
			}
			if res.ExitCode != tc.wantCode {
				t.Fatalf("exit code %d, want %d", res.ExitCode, tc.wantCode)
			}
			var ee *ExitError
			if tc.fail != errors.As(err, &ee) {
				t.Fatalf("RunTransient error = %v, want failure %v", err, tc.fail)
			}
			if tc.fail && (!strings.Contains(err.Error(), "lifecycle-exec-1.service") || !strings.Contains(err.Error(), "exit-code")) {
				t.Fatalf("error %q does not name the unit and result", err)
			}
		})
	}
}

func TestUnitActive(t *testing.T) {
	systemctl := fakeTool(t, "systemctl", `[ "$1 $2" = "is-active --quiet" ] || exit 99
case "$3" in
  running.service) exit 0 ;;
  broken.service) echo "Failed to connect to bus" >&2; exit 1 ;;
  unknown.service) exit 4 ;;
  *) exit 3 ;;
esac
`)
	r := newTestRunner(t, func(c *RunnerConfig) { c.Systemctl = systemctl })
	for _, tc := range []struct {
		name    string
		unit    string
		want    bool
		wantErr bool
	}{
		{name: "active", unit: "running.service", want: true},
		{name: "inactive", unit: "finished.service"},
		{name: "collected", unit: "unknown.service"},
		{name: "systemctl failure is an error", unit: "broken.service", wantErr: true},
		{name: "invalid name", unit: "a b", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.UnitActive(testCtx(t), tc.unit)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Fatalf("UnitActive(%q) = %v, %v; want %v (error %v)", tc.unit, got, err, tc.want, tc.wantErr)
			}
		})
	}
}
