package hostops

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
)

const testBootID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// hostFiles writes a boot ID, an os-release and a kernel release into a
// temporary directory and returns Paths for them.
func hostFiles(t *testing.T) host.Paths {
	t.Helper()
	dir := t.TempDir()
	p := host.Paths{
		BootIDFile:        filepath.Join(dir, "boot_id"),
		OSReleaseFile:     filepath.Join(dir, "os-release"),
		KernelReleaseFile: filepath.Join(dir, "osrelease"),
		ProcStatFile:      filepath.Join(dir, "stat"),
	}
	writeFile(t, p.BootIDFile, testBootID+"\n")
	writeFile(t, p.ProcStatFile, "cpu  1 2 3 4\nbtime 1765000000\nprocesses 7\n")
	writeFile(t, p.OSReleaseFile, "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n")
	writeFile(t, p.KernelReleaseFile, "6.1.0-28-amd64\n")
	return p
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// logind starts a fake logind on a private dbus-daemon and a client of it.
func logind(t *testing.T) (*logindtest.Server, *host.Logind) {
	t.Helper()
	srv := logindtest.Start(t, logindtest.Options{})
	lg, err := host.New(host.Config{Address: srv.Address()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lg.Close() })
	return srv, lg
}

func TestRealReboot(t *testing.T) {
	tests := []struct {
		name    string
		busErr  string // D-Bus error name logind answers Reboot with
		reboots int
		retaken bool
	}{
		{name: "accepted after the delay lock and the block locks were released", reboots: 1},
		{name: "D-Bus error is returned and the delay lock re-taken", busErr: "org.freedesktop.login1.OperationInProgress", retaken: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			srv, lg := logind(t)
			// The agent's delay lock, held for its whole life: inhibitor 0.
			delay, err := lg.Inhibit(ctx, "shutdown", "lifecycle-agent", "journal the shutdown first", host.ModeDelay)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = delay.Release() }()
			var rebootsAtRelease = -1
			retaken := false
			r, err := NewReal(RealConfig{
				Logind: lg,
				Paths:  hostFiles(t),
				ReleaseLocks: func() error {
					err := delay.Release()
					// logind must see the delay lock gone before the reboot.
					if werr := srv.WaitReleased(ctx, 0); werr != nil {
						t.Error(werr)
					}
					rebootsAtRelease = len(srv.Reboots())
					return err
				},
				RetakeLocks: func(context.Context) error { retaken = true; return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			// A block lock of a critical step still held: inhibitor 1.
			if _, err := r.Inhibit(ctx, "shutdown:sleep", "os-upgrade running"); err != nil {
				t.Fatal(err)
			}
			if tt.busErr != "" {
				srv.SetError("Reboot", tt.busErr, "There's already a shutdown or sleep operation in progress")
			}

			err = r.Reboot(ctx)

			if tt.busErr == "" && err != nil {
				t.Fatalf("Reboot: %v", err)
			}
			if tt.busErr != "" {
				var be *host.BusError
				if !errors.As(err, &be) || be.Name != tt.busErr || !strings.Contains(err.Error(), "hostops: reboot: host: logind reboot: D-Bus error "+tt.busErr) {
					t.Fatalf("Reboot error = %v, want the D-Bus error %s", err, tt.busErr)
				}
			}
			if rebootsAtRelease != 0 {
				t.Errorf("logind had %d reboots when the delay lock was released; want it released first", rebootsAtRelease)
			}
			if got := srv.Reboots(); len(got) != tt.reboots || slices.Contains(got, true) {
				t.Errorf("logind reboots = %v, want %d non-interactive", got, tt.reboots)
			}
			if err := srv.WaitReleased(ctx, 1); err != nil {
				t.Errorf("the block lock was not released before the reboot: %v", err)
			}
			if retaken != tt.retaken {
				t.Errorf("RetakeLocks called = %t, want %t", retaken, tt.retaken)
			}
		})
	}
}

func TestRealInhibit(t *testing.T) {
	ctx := testCtx(t)
	srv, lg := logind(t)
	r, err := NewReal(RealConfig{Logind: lg, Paths: hostFiles(t)})
	if err != nil {
		t.Fatal(err)
	}
	release, err := r.Inhibit(ctx, "shutdown:sleep", "os-upgrade profile apt running (event ev-1)")
	if err != nil {
		t.Fatal(err)
	}
	locks, err := srv.WaitInhibitors(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	want := logindtest.Inhibitor{What: "shutdown:sleep", Who: DefaultWho, Why: "os-upgrade profile apt running (event ev-1)", Mode: "block"}
	got := locks[0]
	if got.What != want.What || got.Who != want.Who || got.Why != want.Why || got.Mode != want.Mode || got.Released {
		t.Fatalf("lock = %+v, want a held %+v", got, want)
	}
	release()
	release() // idempotent
	if err := srv.WaitReleased(ctx, 0); err != nil {
		t.Fatal(err)
	}

	t.Run("refused", func(t *testing.T) {
		srv.SetError("Inhibit", "org.freedesktop.DBus.Error.AccessDenied", "Permission denied")
		_, err := r.Inhibit(ctx, "shutdown:sleep", "x")
		var be *host.BusError
		if !errors.As(err, &be) || be.Name != "org.freedesktop.DBus.Error.AccessDenied" {
			t.Fatalf("Inhibit error = %v, want the D-Bus error", err)
		}
	})
}

func TestNewReal(t *testing.T) {
	_, lg := logind(t)
	tests := []struct {
		name    string
		cfg     RealConfig
		wantErr string
	}{
		{name: "no logind", cfg: RealConfig{Paths: hostFiles(t)}, wantErr: "RealConfig.Logind is required"},
		{name: "no boot ID", cfg: RealConfig{Logind: lg, Paths: host.Paths{BootIDFile: "/nonexistent/boot_id"}}, wantErr: "read boot ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewReal(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("NewReal error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestRealFacts(t *testing.T) {
	_, lg := logind(t)
	p := hostFiles(t)
	flag := filepath.Join(t.TempDir(), "reboot-required")
	r, err := NewReal(RealConfig{Logind: lg, Paths: p, RebootRequiredFile: flag})
	if err != nil {
		t.Fatal(err)
	}
	if r.BootID() != testBootID || r.Simulated() {
		t.Errorf("BootID, Simulated = %q, %t", r.BootID(), r.Simulated())
	}
	v, k, err := r.OSRelease()
	if err != nil || v != "12" || k != "6.1.0-28-amd64" {
		t.Errorf("OSRelease = %q, %q, %v", v, k, err)
	}
	if got := r.BootTime(); !got.Equal(time.Unix(1765000000, 0)) {
		t.Errorf("BootTime = %v, want %v", got, time.Unix(1765000000, 0))
	}
	// A clock stepped since the boot moves btime: read again.
	writeFile(t, p.ProcStatFile, "btime 1765000120\n")
	if got := r.BootTime(); !got.Equal(time.Unix(1765000120, 0)) {
		t.Errorf("BootTime after the clock stepped = %v, want %v", got, time.Unix(1765000120, 0))
	}
	// Never readable: the zero time (the readiness check then takes every
	// pod's Ready as it reads), and the agent still starts.
	p2 := hostFiles(t)
	p2.ProcStatFile = "/nonexistent/stat"
	if r2, err := NewReal(RealConfig{Logind: lg, Paths: p2}); err != nil {
		t.Errorf("without /proc/stat: NewReal %v; want it started", err)
	} else if bt := r2.BootTime(); !bt.IsZero() {
		t.Errorf("without /proc/stat: BootTime %v, want the zero time", bt)
	}
	// Unreadable: the last one read.
	writeFile(t, p.ProcStatFile, "cpu 1\n")
	if got := r.BootTime(); !got.Equal(time.Unix(1765000120, 0)) {
		t.Errorf("BootTime with no btime = %v, want the last read %v", got, time.Unix(1765000120, 0))
	}
	if r.RebootRequired() {
		t.Error("RebootRequired without the flag file")
	}
	writeFile(t, flag, "*** System restart required ***\n")
	if !r.RebootRequired() {
		t.Error("RebootRequired is false with the flag file")
	}
}

// script writes an executable shell script.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRealRun(t *testing.T) {
	_, lg := logind(t)
	r, err := NewReal(RealConfig{Logind: lg, Paths: hostFiles(t), BaseEnv: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		argv       []string
		env        []string
		timeout    time.Duration
		wantOut    string
		wantErr    string
		wantStatus int // for a *CommandError
	}{
		{name: "environment is BaseEnv and the caller's, nothing of the agent's",
			argv: []string{"/usr/bin/env"}, env: []string{"LIFECYCLE_EVENT=ev-1"},
			wantOut: "PATH=/usr/bin:/bin\nLIFECYCLE_EVENT=ev-1\n"},
		{name: "failure carries the exit status and stderr",
			argv:    []string{"/bin/sh", "-c", "echo 'image checksum mismatch' >&2; exit 3"},
			wantErr: "exit code 3; stderr: image checksum mismatch", wantStatus: 3},
		{name: "timeout is status -1",
			argv: []string{"/bin/sh", "-c", "exec sleep 5"}, timeout: 50 * time.Millisecond,
			wantErr: "timed out after 50ms", wantStatus: -1},
		{name: "a command that cannot start is no exit status",
			argv: []string{"/nonexistent/flash"}, wantErr: "start:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := r.Run(testCtx(t), tt.argv, tt.env, tt.timeout)
			if tt.wantErr == "" {
				if err != nil || out != tt.wantOut {
					t.Fatalf("Run = %q, %v; want %q", out, err, tt.wantOut)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Run error = %v, want %q", err, tt.wantErr)
			}
			var es drivers.ExitStatusError
			isStatus := errors.As(err, &es)
			if tt.wantStatus == 0 && isStatus {
				t.Errorf("error has an exit status %d; want none", es.ExitStatus())
			}
			if tt.wantStatus != 0 && (!isStatus || es.ExitStatus() != tt.wantStatus) {
				t.Errorf("error = %#v, want exit status %d", err, tt.wantStatus)
			}
		})
	}
}

// fakeSystemd writes systemd-run and systemctl stand-ins that log their
// arguments; systemctl is-active answers "active" activeFor times.
func fakeSystemd(t *testing.T, runExit, activeFor int) (dir string, runner *host.Runner) {
	t.Helper()
	dir = t.TempDir()
	log := filepath.Join(dir, "calls")
	run := script(t, dir, "systemd-run", `echo "systemd-run $*" >> `+log+`
[ `+strconv.Itoa(runExit)+` -eq 0 ] || echo "Finished with result: exit-code" >&2
exit `+strconv.Itoa(runExit)+"\n")
	ctl := script(t, dir, "systemctl", `echo "systemctl $*" >> `+log+`
if [ "$1" = is-active ]; then
  n=$(cat `+dir+`/active 2>/dev/null || echo 0)
  echo $((n+1)) > `+dir+`/active
  [ "$n" -lt `+strconv.Itoa(activeFor)+` ] && exit 0
  exit 3
fi
exit 0
`)
	return dir, host.NewRunner(host.RunnerConfig{SystemdRun: run, Systemctl: ctl})
}

func calls(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "calls"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func TestRealRunTransient(t *testing.T) {
	_, lg := logind(t)
	const unit = "lifecycle-os-upgrade-ev-1.service"
	runCall := "systemd-run --unit=" + unit + " --wait --collect --service-type=exec --description=lifecycle-agent: /usr/local/sbin/upgrade" +
		" --setenv=LIFECYCLE_PROFILE=apt --property=RuntimeMaxSec=1800 -- /usr/local/sbin/upgrade --yes"
	isActive := "systemctl is-active --quiet " + unit
	tests := []struct {
		name      string
		runExit   int
		activeFor int
		calls     []string
		wantErr   string
		status    int
	}{
		{name: "runs the unit bounded by the timeout", calls: []string{isActive, runCall}},
		{name: "waits for a still-active run of the same unit first", activeFor: 2,
			calls: []string{isActive, isActive, isActive, runCall}},
		{name: "failure carries systemd-run's exit status and output", runExit: 1,
			calls: []string{isActive, runCall}, wantErr: "Finished with result: exit-code", status: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, runner := fakeSystemd(t, tt.runExit, tt.activeFor)
			r, err := NewReal(RealConfig{Logind: lg, Paths: hostFiles(t), Runner: runner, UnitPollInterval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			err = r.RunTransient(testCtx(t), unit, []string{"/usr/local/sbin/upgrade", "--yes"}, []string{"LIFECYCLE_PROFILE=apt"}, 30*time.Minute)
			if tt.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tt.wantErr != "" {
				var es drivers.ExitStatusError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &es) || es.ExitStatus() != tt.status {
					t.Fatalf("RunTransient error = %v, want %q with exit status %d", err, tt.wantErr, tt.status)
				}
			}
			if got := calls(t, dir); !slices.Equal(got, tt.calls) {
				t.Errorf("calls =\n  %q\nwant\n  %q", got, tt.calls)
			}
		})
	}
}

func TestRealUnits(t *testing.T) {
	_, lg := logind(t)
	dir, _ := fakeSystemd(t, 0, 0)
	r, err := NewReal(RealConfig{Logind: lg, Paths: hostFiles(t), Systemctl: filepath.Join(dir, "systemctl")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := r.StopUnits(ctx, "nvidia-persistenced.service", "nvidia-fabricmanager.service"); err != nil {
		t.Fatal(err)
	}
	if err := r.StartUnits(ctx, "nvidia-fabricmanager.service"); err != nil {
		t.Fatal(err)
	}
	if err := r.StopUnits(ctx); err != nil { // nothing to do
		t.Fatal(err)
	}
	want := []string{
		"systemctl stop -- nvidia-persistenced.service nvidia-fabricmanager.service",
		"systemctl start -- nvidia-fabricmanager.service",
	}
	if got := calls(t, dir); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}
