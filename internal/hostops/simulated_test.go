package hostops

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

func newSim(t *testing.T, dir string, logs *bytes.Buffer) *Simulated {
	t.Helper()
	return newSimAt(t, dir, hostFiles(t), logs)
}

// newSimAt is newSim reading the real host's facts from paths.
func newSimAt(t *testing.T, dir string, paths host.Paths, logs *bytes.Buffer) *Simulated {
	t.Helper()
	cfg := SimulatedConfig{StateDir: dir, Paths: paths,
		Clock: testingclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	if logs != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}
	s, err := NewSimulated(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSimulatedRebootChangesBootIDAcrossRestarts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	ctx := testCtx(t)
	s := newSim(t, dir, nil)
	first := s.BootID()
	if len(first) != 36 || first == testBootID {
		t.Fatalf("first simulated boot ID = %q, want a new UUID", first)
	}
	if again := newSim(t, dir, nil).BootID(); again != first {
		t.Fatalf("a restarted agent sees boot ID %q, want the same %q", again, first)
	}
	writeFile(t, filepath.Join(dir, SimulatedRebootRequiredFile), "")
	if !s.RebootRequired() {
		t.Fatal("RebootRequired is false with the flag file")
	}

	if err := s.Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	second := s.BootID()
	if second == first || len(second) != 36 {
		t.Fatalf("boot ID after the simulated reboot = %q (before %q)", second, first)
	}
	// Nothing restarted: the boot time stays the real host's, so the pods'
	// statuses from before the simulated reboot still count (readiness).
	if got := s.BootTime(); !got.Equal(time.Unix(1765000000, 0)) {
		t.Errorf("BootTime after the simulated reboot = %v, want the host's %v", got, time.Unix(1765000000, 0))
	}
	if s.RebootRequired() {
		t.Error("the reboot did not clear the reboot-required flag")
	}
	// The agent restarts after the "reboot": the new boot ID survives.
	if got := newSim(t, dir, nil).BootID(); got != second {
		t.Errorf("after a restart the boot ID is %q, want %q", got, second)
	}
	// A reboot by someone else: a new UUID written from outside.
	const outside = "11111111-2222-4333-8444-555555555555"
	writeFile(t, filepath.Join(dir, SimulatedBootIDFile), outside+"\n")
	if got := s.BootID(); got != outside {
		t.Errorf("after an outside reboot the boot ID is %q, want %q", got, outside)
	}
}

// A real reboot of the machine (an admin's, a power cut) is a new boot for
// the simulated host too: without it, a shutdown journaled before it stayed
// "under way" in the same simulated boot and its cordon was never lifted.
func TestSimulatedNewBootAfterARealReboot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	paths := hostFiles(t)
	open := func(logs *bytes.Buffer) *Simulated { t.Helper(); return newSimAt(t, dir, paths, logs) }
	first := open(nil).BootID()
	if got := open(nil).BootID(); got != first {
		t.Fatalf("an agent restarted in the same real boot sees %q, want %q", got, first)
	}
	// The machine reboots: a new real boot ID.
	writeFile(t, paths.BootIDFile, "99999999-8888-4777-8666-555555555555\n")
	var logs bytes.Buffer
	second := open(&logs).BootID()
	if second == first || len(second) != 36 {
		t.Fatalf("after a real reboot the simulated boot ID is %q (before %q), want a new one", second, first)
	}
	if !strings.Contains(logs.String(), "the machine rebooted since the simulated boot began") {
		t.Errorf("no log line for the new simulated boot:\n%s", logs.String())
	}
	if got := open(nil).BootID(); got != second {
		t.Errorf("restarted again in that real boot: %q, want %q", got, second)
	}
	// The real boot ID unreadable: said, and the simulated boot kept.
	if err := os.Remove(paths.BootIDFile); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	if got := open(&logs).BootID(); got != second || !strings.Contains(logs.String(), "the real boot ID cannot be read") {
		t.Errorf("real boot ID unreadable: simulated %q (want %q), log:\n%s", got, second, logs.String())
	}
}

// After an upgrade from an agent that did not record the real boot ID: a
// simulated boot ID file older than the machine's boot dates from an
// earlier boot (a new simulated boot); a newer one is this boot's (kept).
// A recorded real boot ID that cannot be read is only a hint: the agent
// says so and starts.
func TestSimulatedHostBootRecordMissingOrBad(t *testing.T) {
	paths := hostFiles(t) // btime 1765000000
	const kept = "11111111-2222-4333-8444-555555555555"
	for _, tc := range []struct {
		name     string
		mtime    time.Time // of the simulated boot ID file
		hostFile string    // its content; "" absent
		newBoot  bool
		log      string
	}{
		{name: "upgrade, written before this boot", mtime: time.Unix(1764000000, 0), newBoot: true, log: "the machine rebooted since the simulated boot began"},
		{name: "upgrade, written in this boot", mtime: time.Unix(1766000000, 0)},
		{name: "record not a boot ID", mtime: time.Unix(1766000000, 0), hostFile: "garbage\n", log: "the recorded real boot ID cannot be read; recording it again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			idFile := filepath.Join(dir, SimulatedBootIDFile)
			writeFile(t, idFile, kept+"\n")
			if err := os.Chtimes(idFile, tc.mtime, tc.mtime); err != nil {
				t.Fatal(err)
			}
			if tc.hostFile != "" {
				writeFile(t, filepath.Join(dir, SimulatedHostBootIDFile), tc.hostFile)
			}
			var logs bytes.Buffer
			s, err := NewSimulated(SimulatedConfig{StateDir: dir, Paths: paths, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatalf("NewSimulated: %v", err)
			}
			if got := s.BootID(); (got != kept) != tc.newBoot {
				t.Errorf("simulated boot ID %q (was %q), want a new one: %v", got, kept, tc.newBoot)
			}
			if tc.log != "" && !strings.Contains(logs.String(), tc.log) {
				t.Errorf("log has no %q:\n%s", tc.log, logs.String())
			}
			if b, err := os.ReadFile(filepath.Join(dir, SimulatedHostBootIDFile)); err != nil || strings.TrimSpace(string(b)) != testBootID {
				t.Errorf("real boot ID recorded: %q, %v; want %q", b, err, testBootID)
			}
		})
	}
}

func TestNewSimulatedRefusesABadBootID(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, SimulatedBootIDFile), "not-a-uuid\n")
	if _, err := NewSimulated(SimulatedConfig{StateDir: dir}); err == nil || !strings.Contains(err.Error(), "invalid boot ID") {
		t.Fatalf("NewSimulated error = %v, want invalid boot ID", err)
	}
	if _, err := NewSimulated(SimulatedConfig{}); err == nil {
		t.Fatal("NewSimulated without StateDir succeeded")
	}
}

func TestSimulatedOSRelease(t *testing.T) {
	tests := []struct {
		name        string
		file        string // simulated-os-release; "" leaves it absent
		wantVersion string
		wantKernel  string
	}{
		{name: "absent: the host's facts", wantVersion: "12", wantKernel: "6.1.0-28-amd64"},
		{name: "version and kernel simulated", file: "ID=debian\nVERSION_ID=\"13\"\nKERNEL_RELEASE=6.12.0-1-amd64\n",
			wantVersion: "13", wantKernel: "6.12.0-1-amd64"},
		{name: "version only: the host's kernel", file: "VERSION_ID=13\n", wantVersion: "13", wantKernel: "6.1.0-28-amd64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.file != "" {
				writeFile(t, filepath.Join(dir, SimulatedOSReleaseFile), tt.file)
			}
			v, k, err := newSim(t, dir, nil).OSRelease()
			if err != nil || v != tt.wantVersion || k != tt.wantKernel {
				t.Errorf("OSRelease = %q, %q, %v; want %q, %q", v, k, err, tt.wantVersion, tt.wantKernel)
			}
		})
	}
}

// TestSimulatedPerformsNothing: commands are recorded and logged, not run;
// locks are not taken.
func TestSimulatedPerformsNothing(t *testing.T) {
	var logs bytes.Buffer
	dir := t.TempDir()
	s := newSim(t, dir, &logs)
	ctx := testCtx(t)
	marker := filepath.Join(dir, "ran")
	if !s.Simulated() {
		t.Fatal("Simulated() is false")
	}
	if err := s.RunTransient(ctx, "lifecycle-os-upgrade-ev-1.service", []string{"/usr/bin/touch", marker}, []string{"LIFECYCLE_PROFILE=apt"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	out, err := s.Run(ctx, []string{"/usr/bin/touch", marker}, []string{"LIFECYCLE_EVENT=ev-1"}, time.Minute)
	if err != nil || out != "" {
		t.Fatalf("Run = %q, %v", out, err)
	}
	if _, err := s.Run(ctx, nil, nil, time.Minute); err == nil {
		t.Error("Run of an empty command succeeded")
	}
	release, err := s.Inhibit(ctx, "shutdown:sleep", "os-upgrade")
	if err != nil {
		t.Fatal(err)
	}
	release()
	release()
	if err := s.StopUnits(ctx, "nvidia-persistenced.service"); err != nil {
		t.Fatal(err)
	}
	if err := s.StartUnits(ctx, "nvidia-persistenced.service"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a simulated command ran")
	}
	var verbs []string
	for _, a := range s.Actions() {
		verbs = append(verbs, a.Verb)
	}
	want := []string{"run-transient", "run", "inhibit", "release", "stop-units", "start-units"}
	if !slices.Equal(verbs, want) {
		t.Errorf("actions = %v, want %v", verbs, want)
	}
	if a := s.Actions()[0]; a.Unit != "lifecycle-os-upgrade-ev-1.service" || a.Args[0] != "/usr/bin/touch" || a.Env[0] != "LIFECYCLE_PROFILE=apt" {
		t.Errorf("transient action = %+v", a)
	}
	for _, line := range []string{"simulated transient unit (nothing run)", "simulated command (nothing run)",
		"simulated block lock (none taken)", "simulated systemctl stop (nothing stopped)", "mode=simulate"} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("logs lack %q:\n%s", line, logs.String())
		}
	}
}

func TestSimulatedActionsBounded(t *testing.T) {
	s, err := NewSimulated(SimulatedConfig{StateDir: t.TempDir(), MaxActions: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"a", "b", "c"} {
		_ = s.StopUnits(context.Background(), u)
	}
	got := s.Actions()
	if len(got) != 2 || got[0].Args[0] != "b" || got[1].Args[0] != "c" {
		t.Errorf("actions = %+v, want the last two", got)
	}
}
