package drivers

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

func testProfiles() map[string]config.OSUpgradeProfile {
	return map[string]config.OSUpgradeProfile{
		"apt": {Command: []string{"/usr/local/sbin/upgrade-apt", "--yes"}, Timeout: 30 * time.Minute, RebootPolicy: config.RebootIfRequired},
		"dnf": {Command: []string{"/usr/local/sbin/upgrade-dnf"}, RebootPolicy: config.RebootAlways},
		"fw":  {Command: []string{"/usr/local/sbin/flash-config"}, RebootPolicy: config.RebootNever},
	}
}

func TestOSUpgradePlan(t *testing.T) {
	tests := []struct {
		name    string
		params  map[string]string
		steps   []string
		wantErr string
	}{
		{name: "profile, reboot if required",
			params: map[string]string{"profile": "apt", "targetVersionID": "13"},
			steps:  []string{"cordon", "evict", "wait-empty", "upgrade", "reboot", "verify", "wait-ready", "wait-workloads-ready", "uncordon"}},
		{name: "profile with rebootPolicy never: no reboot step",
			params: map[string]string{"mode": "profile", "profile": "fw", "waitForReady": "false"},
			steps:  []string{"cordon", "evict", "wait-empty", "upgrade", "verify", "uncordon"}},
		{name: "external mode waits for the pipeline's reboot",
			params: map[string]string{"mode": "external", "targetKernel": "6.12.0-1-amd64"},
			steps:  []string{"cordon", "evict", "wait-empty", "wait-reboot", "verify", "wait-ready", "wait-workloads-ready", "uncordon"}},
		{name: "unknown profile lists the configured ones",
			params:  map[string]string{"profile": "yum"},
			wantErr: `parameters.profile: unknown profile "yum"; configured profiles: apt, dnf, fw`},
		{name: "profile mode needs a profile",
			params:  map[string]string{"targetVersionID": "13"},
			wantErr: "parameters.profile is required with mode=profile; configured profiles: apt, dnf, fw"},
		{name: "external mode takes no profile",
			params:  map[string]string{"mode": "external", "profile": "apt"},
			wantErr: "parameters.profile applies only to mode=profile"},
		{name: "unknown mode",
			params:  map[string]string{"mode": "pxe"},
			wantErr: `parameters.mode: "pxe" is not profile or external`},
		{name: "empty target",
			params:  map[string]string{"profile": "apt", "targetVersionID": " "},
			wantErr: "parameters.targetVersionID is empty"},
		{name: "a command is never a parameter",
			params:  map[string]string{"profile": "apt", "command": "/bin/sh -c reboot"},
			wantErr: `unknown parameter "command"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			steps, err := OSUpgrade{Profiles: testProfiles()}.Plan(tt.params)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrBadParameter) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Plan error = %v, want ErrBadParameter containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if got := stepNames(steps); !slices.Equal(got, tt.steps) {
				t.Errorf("steps = %v, want %v", got, tt.steps)
			}
		})
	}
}

func TestOSUpgradeNoProfilesConfigured(t *testing.T) {
	_, err := OSUpgrade{}.Plan(map[string]string{"profile": "apt"})
	if !errors.Is(err, ErrBadParameter) || !strings.Contains(err.Error(), "configured profiles: none (osUpgrade.profiles is empty)") {
		t.Fatalf("Plan error = %v", err)
	}
}

func TestOSUpgradeRun(t *testing.T) {
	drainCalls := []string{"rt.Own cordon/node-a", "api.Cordon ev-1", "api.Drain", "api.PodsLeft"}
	upgradeCalls := []string{"host.Inhibit shutdown:sleep",
		"host.RunTransient lifecycle-os-upgrade-ev-1.service /usr/local/sbin/upgrade-apt --yes",
		"host.Release shutdown:sleep"}
	join := func(parts ...[]string) []string { return slices.Concat(parts...) }
	tests := []struct {
		name   string
		params map[string]string
		setup  func(rt *fakeRuntime)

		failedStep string
		wantErr    string
		calls      []string
		cordoned   bool
		progress   string
	}{
		{
			name:   "profile: upgrade, reboot required, verified after boot, uncordon ours",
			params: map[string]string{"profile": "apt", "targetVersionID": "13", "targetKernel": "6.12.0-1-amd64"},
			setup: func(rt *fakeRuntime) {
				rt.host.rebootRequired, rt.host.rebootChangesBoot = true, true
				rt.host.nextVersion, rt.host.nextKernel = "13", "6.12.0-1-amd64"
			},
			calls: join(drainCalls, upgradeCalls, []string{"host.RebootRequired", "host.Reboot", "host.OSRelease",
				"api.NodeReady", "api.Uncordon ev-1 force=false", "rt.Disown cordon/node-a"}),
			progress: `upgrade verified: VERSION_ID "13", kernel "6.12.0-1-amd64"`,
		},
		{
			name:   "profile: no reboot required, none done",
			params: map[string]string{"profile": "apt"},
			calls: join(drainCalls, upgradeCalls, []string{"host.RebootRequired",
				"api.NodeReady", "api.Uncordon ev-1 force=false", "rt.Disown cordon/node-a"}),
			progress: "profile apt: no reboot required",
		},
		{
			name:   "profile command fails: the error names the profile, the unit and the output",
			params: map[string]string{"profile": "apt"},
			setup: func(rt *fakeRuntime) {
				rt.host.transientErr = &exitErr{status: 100, stderr: "E: Unmet dependencies. Try 'apt --fix-broken install'"}
			},
			failedStep: "upgrade",
			wantErr:    "os-upgrade profile apt failed (journalctl -u lifecycle-os-upgrade-ev-1.service has its output): exit code 100; stderr: E: Unmet dependencies",
			calls:      join(drainCalls, upgradeCalls),
			cordoned:   true,
		},
		{
			name:       "block inhibitor refused: nothing runs",
			params:     map[string]string{"profile": "apt"},
			setup:      func(rt *fakeRuntime) { rt.host.inhibitErr = errors.New("logind: access denied") },
			failedStep: "upgrade",
			wantErr:    "take the block inhibitor before the upgrade: logind: access denied",
			calls:      join(drainCalls, []string{"host.Inhibit shutdown:sleep"}),
			cordoned:   true,
		},
		{
			name:   "version mismatch after the boot names expected and found",
			params: map[string]string{"profile": "dnf", "targetVersionID": "13", "targetKernel": "6.12.0-1-amd64"},
			setup: func(rt *fakeRuntime) {
				rt.host.rebootChangesBoot = true
				rt.host.nextKernel = "6.12.0-1-amd64" // the kernel moved, the release did not
			},
			failedStep: "verify",
			wantErr:    `the upgrade did not reach its target: /etc/os-release VERSION_ID is "12", expected "13" (parameters.targetVersionID)`,
			calls: join(drainCalls, []string{"host.Inhibit shutdown:sleep",
				"host.RunTransient lifecycle-os-upgrade-ev-1.service /usr/local/sbin/upgrade-dnf",
				"host.Release shutdown:sleep", "host.Reboot", "host.OSRelease"}),
			cordoned: true,
		},
		{
			name:       "kernel mismatch",
			params:     map[string]string{"profile": "fw", "targetKernel": "6.12.0-1-amd64"},
			failedStep: "verify",
			wantErr:    `the running kernel is "6.1.0", expected "6.12.0-1-amd64" (parameters.targetKernel)`,
			calls: join(drainCalls, []string{"host.Inhibit shutdown:sleep",
				"host.RunTransient lifecycle-os-upgrade-ev-1.service /usr/local/sbin/flash-config",
				"host.Release shutdown:sleep", "host.OSRelease"}),
			cordoned: true,
		},
		{
			name:   "external: the wait ends on the pipeline's reboot (new boot ID), then verify",
			params: map[string]string{"mode": "external", "targetVersionID": "13"},
			setup: func(rt *fakeRuntime) {
				rt.host.bootChangeAfter = 5 // the pipeline reboots while we wait
				rt.host.nextVersion = "13"
			},
			calls: join(drainCalls, []string{"host.OSRelease", "api.NodeReady",
				"api.Uncordon ev-1 force=false", "rt.Disown cordon/node-a"}),
			progress: "waiting for the provisioning pipeline to upgrade and reboot it (boot ID now boot-1)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newFake()
			if tt.setup != nil {
				tt.setup(rt)
			}
			steps, err := OSUpgrade{RebootConfig: fastReboot(), Profiles: testProfiles()}.Plan(tt.params)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			failed, err := runSteps(t, steps, rt)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("step %s failed: %v", failed, err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if failed != tt.failedStep {
				t.Errorf("failed step = %q, want %q", failed, tt.failedStep)
			}
			if got := rt.rec.list(); !slices.Equal(got, tt.calls) {
				t.Errorf("calls =\n  %q\nwant\n  %q", got, tt.calls)
			}
			if rt.host.held != 0 {
				t.Errorf("%d block locks still held", rt.host.held)
			}
			if rt.api.cordoned != tt.cordoned {
				t.Errorf("node cordoned = %t, want %t", rt.api.cordoned, tt.cordoned)
			}
			if tt.progress != "" && !rt.progressed(tt.progress) {
				t.Errorf("no progress message contains %q; got:\n%s", tt.progress, rt.allProgress())
			}
		})
	}
}

// TestOSUpgradeProfileCommand checks what the transient unit gets: the
// profile's argv from local config, its timeout, and the event's facts only
// as environment.
func TestOSUpgradeProfileCommand(t *testing.T) {
	rt := newFake()
	rt.event = "upgrade.node-a.2030"
	rt.host.version = "13"
	steps, err := OSUpgrade{RebootConfig: fastReboot(), Profiles: testProfiles()}.
		Plan(map[string]string{"profile": "apt", "targetVersionID": "13"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runSteps(t, steps, rt); err != nil {
		t.Fatal(err)
	}
	if len(rt.host.transients) != 1 {
		t.Fatalf("transient runs = %d, want 1", len(rt.host.transients))
	}
	got := rt.host.transients[0]
	if got.unit != "lifecycle-os-upgrade-upgrade-node-a-2030.service" {
		t.Errorf("unit = %q", got.unit)
	}
	if !slices.Equal(got.argv, []string{"/usr/local/sbin/upgrade-apt", "--yes"}) || got.timeout != 30*time.Minute {
		t.Errorf("argv, timeout = %q, %s", got.argv, got.timeout)
	}
	wantEnv := []string{"LIFECYCLE_EVENT=upgrade.node-a.2030", "LIFECYCLE_NODE=node-a", "LIFECYCLE_PROFILE=apt", "LIFECYCLE_TARGET_VERSION_ID=13"}
	if !slices.Equal(got.env, wantEnv) {
		t.Errorf("env = %q, want %q", got.env, wantEnv)
	}
}

// TestOSUpgradeExternalDoneOnReplay: in external mode the real agent is
// stopped by the pipeline's reboot while it waits; the replay after the
// boot finds the wait step done from the journaled intent's boot ID — also
// for an intent written by an older agent version before the reboot.
func TestOSUpgradeExternalDoneOnReplay(t *testing.T) {
	steps, err := OSUpgrade{}.Plan(map[string]string{"mode": "external"})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(steps, func(s Step) bool { return s.Name == "wait-reboot" })
	tests := []struct {
		name         string
		intentBootID string
		want         bool
	}{
		{name: "rebooted since the intent", intentBootID: "boot-0", want: true},
		{name: "agent restarted without a reboot", intentBootID: "boot-1", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done, err := steps[i].Done(context.Background(), newFake(), tt.intentBootID)
			if err != nil || done != tt.want {
				t.Errorf("Done = %t, %v; want %t", done, err, tt.want)
			}
		})
	}
}

// TestOSUpgradeExternalWaitBoundedByContext: without a reboot the wait
// lasts until the engine cancels the step at the event's deadline.
func TestOSUpgradeExternalWaitBoundedByContext(t *testing.T) {
	steps, err := OSUpgrade{RebootConfig: fastReboot()}.Plan(map[string]string{"mode": "external"})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(steps, func(s Step) bool { return s.Name == "wait-reboot" })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := steps[i].Run(ctx, newFake()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want the deadline", err)
	}
}

func TestTransientUnitName(t *testing.T) {
	tests := []struct {
		name, event, want string
	}{
		{name: "plain", event: "ev-1", want: "p-ev-1.service"},
		{name: "dots become dashes", event: "a.b.c", want: "p-a-b-c.service"},
		{name: "bounded to 255 bytes", event: strings.Repeat("x", 300), want: "p-" + strings.Repeat("x", 255-len(".service")-2) + ".service"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := transientUnitName("p-", tt.event); got != tt.want {
				t.Errorf("transientUnitName = %q, want %q", got, tt.want)
			}
		})
	}
}

// A cancelled (or failed) os-upgrade whose transient unit still runs keeps
// the node cordoned until the unit has ended, says so in status, and then
// undoes only its own cordon; a unit whose state cannot be read keeps the
// node cordoned.
func TestOSUpgradeAbortWaitsForTheUnit(t *testing.T) {
	old := unitPoll
	unitPoll = time.Millisecond
	t.Cleanup(func() { unitPoll = old })
	d := OSUpgrade{Profiles: map[string]config.OSUpgradeProfile{"apt": {Command: []string{"/usr/local/sbin/upgrade-apt"}}}}

	rt := newFake()
	if _, err := rt.api.Cordon(context.Background(), "ev-1"); err != nil {
		t.Fatal(err)
	}
	_ = rt.Own(Change{Kind: "cordon", Key: "node-a"})
	rt.host.activeFor = 3
	if err := d.Abort(context.Background(), rt); err != nil {
		t.Fatalf("Abort: %v", err)
	}
	calls := rt.rec.list()
	unit := "host.UnitActive lifecycle-os-upgrade-ev-1.service"
	if n := slices.Index(calls, "api.Uncordon ev-1 force=false"); n < 0 || slices.Index(calls[n:], unit) >= 0 || slices.Index(calls, unit) > n {
		t.Fatalf("calls %q: want the unit's checks, then the uncordon", calls)
	}
	if got := rt.rec.count(unit); got != 4 {
		t.Errorf("%d UnitActive checks, want 4 (3 active, then ended)", got)
	}
	if !strings.Contains(rt.allProgress(), "is still running and is never killed half-way; the node stays cordoned until it ends") {
		t.Errorf("status while waiting: %q", rt.allProgress())
	}
	if rt.api.cordoned {
		t.Error("the node stayed cordoned after the unit ended")
	}

	rt = newFake()
	rt.event = "ev-2"
	if _, err := rt.api.Cordon(context.Background(), "ev-2"); err != nil {
		t.Fatal(err)
	}
	rt.host.unitErr = errors.New("systemctl: Failed to connect to bus")
	if err := d.Abort(context.Background(), rt); err == nil || !strings.Contains(err.Error(), "so the node stays cordoned") {
		t.Fatalf("Abort with an unreadable unit: %v", err)
	}
	if !rt.api.cordoned {
		t.Error("the node was uncordoned although the upgrade unit's state is unknown")
	}
}

// TestOSUpgradeReplayAfterPowerLoss: an upgrade whose intent was journaled
// in an earlier boot was cut off by the node going down. The profile's
// check decides; without one, or when it cannot run, the step fails
// (ErrUndecidable) instead of running the upgrade again blindly. In the
// same boot (the agent restarted) the command runs again, as before.
func TestOSUpgradeReplayAfterPowerLoss(t *testing.T) {
	check := []string{"/usr/local/sbin/upgrade-done"}
	tests := []struct {
		name       string
		check      []string
		intentBoot string
		run        func(argv, env []string) (string, error)
		want       bool
		undecided  string // ErrUndecidable with this in its message
		progress   string
		ran        int // Run calls (the check)
	}{
		{name: "same boot: the agent restarted", check: check, intentBoot: "boot-1"},
		{name: "no intent boot recorded", check: check, intentBoot: ""},
		{
			name: "went down, no check", intentBoot: "boot-0",
			undecided: "the node went down while os-upgrade profile apt ran (boot boot-0, now boot-1); profile apt has no check (osUpgrade.profiles.apt.check), so the agent cannot tell whether the upgrade completed and does not run it again blindly",
		},
		{
			name: "went down, check says done", check: check, intentBoot: "boot-0", want: true, ran: 1,
			progress: "its check says the upgrade completed",
		},
		{
			name: "went down, check says not done", check: check, intentBoot: "boot-0", ran: 1,
			run:      func([]string, []string) (string, error) { return "", &exitErr{status: 1} },
			progress: "its check says the upgrade did not complete (exit 1): running it again",
		},
		{
			name: "went down, check cannot run", check: check, intentBoot: "boot-0", ran: 1,
			run: func([]string, []string) (string, error) {
				return "", errors.New("fork/exec /usr/local/sbin/upgrade-done: no such file or directory")
			},
			undecided: "its check /usr/local/sbin/upgrade-done could not be run: fork/exec",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := OSUpgrade{Profiles: map[string]config.OSUpgradeProfile{"apt": {Command: []string{"/usr/local/sbin/upgrade-apt"}, Check: tt.check}}}
			steps, err := d.Plan(map[string]string{"profile": "apt", "targetVersionID": "13"})
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(steps, func(s Step) bool { return s.Name == "upgrade" })
			rt := newFake()
			rt.host.run = tt.run
			done, err := steps[i].Done(context.Background(), rt, tt.intentBoot)
			switch {
			case tt.undecided != "":
				if !errors.Is(err, ErrUndecidable) || !strings.Contains(err.Error(), tt.undecided) {
					t.Errorf("Done = %t, %v; want ErrUndecidable saying %q", done, err, tt.undecided)
				}
			case err != nil || done != tt.want:
				t.Errorf("Done = %t, %v; want %t", done, err, tt.want)
			}
			if tt.progress != "" && !rt.progressed(tt.progress) {
				t.Errorf("progress %q not reported: %v", tt.progress, rt.progress)
			}
			if len(rt.host.runs) != tt.ran {
				t.Errorf("%d Run calls, want %d: %+v", len(rt.host.runs), tt.ran, rt.host.runs)
			}
			if tt.ran > 0 && !slices.Contains(rt.host.runs[0].env, "LIFECYCLE_TARGET_VERSION_ID=13") {
				t.Errorf("the check did not get the command's environment: %v", rt.host.runs[0].env)
			}
		})
	}
}

// TestAbortAgainKeepsAKeptCordon: a driver's abort with a kept cordon
// (readiness.onTimeout keepCordoned) run a second time, as the engine does
// when the agent died after the first and before the end state was
// journaled, leaves the cordon again: the kept record outlives the abort
// (the engine drops it with the event), the cordon's own record goes (the
// leftover undo would otherwise lift it).
func TestAbortAgainKeepsAKeptCordon(t *testing.T) {
	for name, d := range map[string]Abortable{
		"os-upgrade": OSUpgrade{Profiles: map[string]config.OSUpgradeProfile{"apt": {Command: []string{"/usr/local/sbin/upgrade-apt"}}}},
		"gpu-reset":  GPUReset{},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rt := newFake()
			if _, err := rt.api.Cordon(ctx, "ev-1"); err != nil {
				t.Fatal(err)
			}
			cordon := Change{Kind: "cordon", Key: rt.Node()}
			_ = rt.Own(cordon)
			_ = rt.Own(CordonKept(rt.Node()))
			for i := 1; i <= 2; i++ {
				if err := d.Abort(ctx, rt); err != nil {
					t.Fatalf("abort %d: %v", i, err)
				}
				if !rt.api.cordoned {
					t.Fatalf("abort %d uncordoned the node: want the kept cordon left for an admin", i)
				}
			}
			if rt.Owns(cordon) {
				t.Error("the cordon's record is still owned after the abort: the leftover undo would lift it")
			}
			if !rt.Owns(CordonKept(rt.Node())) {
				t.Error("the kept record is gone after the abort: an abort replayed after a crash would uncordon")
			}
		})
	}
}
