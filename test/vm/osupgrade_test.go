package vm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/vm"
)

// (g) The provisioning pipeline's path (issue 17): an OS upgrade in the
// guest, driven as a pipeline drives it — from a script on the node that
// asks the agent for the upgrade and follows the event across the reboot
// with `lifecycle-agent wait`.

const (
	transitionOSUpgrade = vm.NodeName + "-os-upgrade"
	// upgradedVersionID is what the test's "OS upgrade" package writes
	// into /etc/os-release.
	upgradedVersionID = "12.99"
	// upgradeRuns counts the runs of the profile's command (one line each).
	upgradeRuns = "/var/lib/vmtest-upgrade.runs"
	upgradeDeb  = "/root/pkgs/vmtest-os-upgrade.deb"
	// pipelineScript is the pipeline's step on the node: request the
	// upgrade once (the event's name kept on disk, as a pipeline keeps it
	// in its own state), then follow it; run again after the reboot, it
	// re-attaches to the same event. Its exit status is `wait`'s: the
	// documented table (0 Succeeded, 1 Failed, ...).
	pipelineScript = `#!/bin/sh
set -u
state=/var/lib/vmtest-pipeline.event
if [ ! -s "$state" ]; then
	lifecycle-agent request os-upgrade --param profile=vmtest --param targetVersionID="$1" -o name >"$state.new" || exit $?
	mv "$state.new" "$state"
fi
exec lifecycle-agent wait "$(cat "$state")" --timeout 10m
`
)

// osUpgradeConfig is the guest's config: a profile whose command installs
// a local package (shipped in by the test) the way a real profile runs
// apt-get: non-interactively, keeping changed conffiles. The package's
// postinst changes VERSION_ID and asks for a reboot.
var osUpgradeConfig = agentConfig + `osUpgrade:
  profiles:
    vmtest:
      command: [/bin/sh, -c, "echo ran >> ` + upgradeRuns + ` && DEBIAN_FRONTEND=noninteractive dpkg -i --force-confdef --force-confold ` + upgradeDeb + `"]
      timeout: 5m
      rebootPolicy: if-required
    vmtest-slow:
      # The first run stalls (long enough for a power cut in the middle);
      # a run after it goes straight on. The check: done when the target
      # version is there.
      command: [/bin/sh, -c, "echo ran >> ` + upgradeRuns + ` && sync && if [ ! -e ` + stallMark + ` ]; then touch ` + stallMark + ` && sync && sleep 600; fi && DEBIAN_FRONTEND=noninteractive dpkg -i --force-confdef --force-confold ` + upgradeDeb + `"]
      check: [/bin/sh, -c, ". /etc/os-release && [ \"$VERSION_ID\" = \"$LIFECYCLE_TARGET_VERSION_ID\" ]"]
      timeout: 15m
      rebootPolicy: if-required
`

// stallMark: the slow profile's first run has started (and stalls).
const stallMark = "/var/lib/vmtest-upgrade.stalled"

// buildUpgradeDeb builds, on the host, the package the profile installs:
// its postinst rewrites VERSION_ID in /etc/os-release (through the symlink
// to /usr/lib/os-release) and leaves /run/reboot-required, as a distribution
// upgrade does.
func buildUpgradeDeb(t *testing.T, dir string) string {
	t.Helper()
	root := filepath.Join(dir, "vmtest-os-upgrade")
	if err := os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755); err != nil {
		t.Fatal(err)
	}
	control := "Package: vmtest-os-upgrade\nVersion: 1.0\nArchitecture: all\nMaintainer: lifecycle-agent tests <tests@invalid>\n" +
		"Description: test OS upgrade for the lifecycle-agent VM tests\n"
	postinst := "#!/bin/sh\nset -e\nsed -i --follow-symlinks 's/^VERSION_ID=.*/VERSION_ID=\"" + upgradedVersionID + "\"/' /etc/os-release\n" +
		"echo vmtest-os-upgrade > /run/reboot-required\n"
	if err := os.WriteFile(filepath.Join(root, "DEBIAN", "control"), []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "DEBIAN", "postinst"), []byte(postinst), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "vmtest-os-upgrade.deb")
	if b, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, b)
	}
	return out
}

// upgradeNode is an agent node set up for the os-upgrade scenarios.
func upgradeNode(t *testing.T, opts vm.Options) *agentNode {
	t.Helper()
	vm.RequireHostTools(t)
	vm.FindDeb(t)
	return upgradeNodeOn(t, vm.StartCluster(t), opts)
}

// upgradeNodeOn is upgradeNode on a cluster already started.
func upgradeNodeOn(t *testing.T, c *vm.Cluster, opts vm.Options) *agentNode {
	t.Helper()
	a := startAgentNodeOn(t, c, opts, osUpgradeConfig)
	a.v.MustRun("mkdir -p /root/pkgs")
	a.v.CopyIn(buildUpgradeDeb(t, a.c.Dir), upgradeDeb)
	a.v.WriteFile("/root/pipeline.sh", []byte(pipelineScript), 0o755)
	a.c.WaitTransition(t, transitionOSUpgrade, 2*time.Minute)
	if got := strings.TrimSpace(a.v.MustRun(". /etc/os-release && echo $VERSION_ID")); got == upgradedVersionID {
		t.Fatalf("the guest already says VERSION_ID=%s before the upgrade", got)
	}
	return a
}

// runPipeline starts the pipeline script in the guest as its own unit (a
// pipeline's ssh session: the reboot ends it), waits for the reboot it
// leads to, runs the script again as the pipeline would after
// reconnecting, and returns the event's name, the script's output and
// its exit status.
func (a *agentNode) runPipeline(t *testing.T, target string) (event, out string, code int) {
	t.Helper()
	boots := a.v.Boots()
	bootBefore := a.v.BootID()
	a.v.MustRun("systemd-run --unit=vmtest-pipeline --collect /root/pipeline.sh " + target)
	vm.Eventually(t, time.Minute, "the pipeline's request made", func() (bool, string) {
		o, code := a.v.Run("cat /var/lib/vmtest-pipeline.event")
		event = strings.TrimSpace(o)
		return code == 0 && event != "", o
	})
	a.c.WatchEvent(t, event, 2*time.Minute, "claimed", func(e *v1alpha1.LifecycleEvent) bool {
		return e.Status.ClaimStatus != "" && e.Status.ClaimStatus != v1alpha1.LifecycleEventPending
	})
	if boot := a.v.WaitBoot(boots); boot == bootBefore {
		t.Fatalf("boot ID unchanged after the upgrade's reboot: %s", boot)
	}
	vm.WaitAgentActive(t, a.v, agentStartTimeout)
	start := time.Now()
	o, stderr, code, err := a.v.Try("/root/pipeline.sh " + target)
	if err != nil {
		t.Fatalf("the pipeline after the reboot: %v\n%s%s", err, o, stderr)
	}
	vm.Timings.Record("pipeline wait after the boot", time.Since(start))
	t.Logf("$ /root/pipeline.sh %s  (after the reboot) → exit %d\n%s%s", target, code, o, stderr)
	return event, o + stderr, code
}

// waitUpgradeComplete waits until the node is uncordoned (no cordoned-by
// annotation) with LifecycleTransition=False/OSUpgradeComplete.
func (a *agentNode) waitUpgradeComplete(t *testing.T) {
	t.Helper()
	vm.Eventually(t, time.Minute, "node uncordoned, LifecycleTransition=False/OSUpgradeComplete", func() (bool, string) {
		n := a.c.NodeObject(t)
		_, ann := n.Annotations[v1alpha1.AnnotationCordonedBy]
		ok := !n.Spec.Unschedulable && !ann && vm.ConditionIs(n, v1alpha1.NodeConditionLifecycleTransition, "False", "OSUpgradeComplete")
		return ok, fmt.Sprintf("unschedulable=%v annotation=%v condition=%+v", n.Spec.Unschedulable, ann, vm.NodeCondition(n, v1alpha1.NodeConditionLifecycleTransition))
	})
}

// pipelineEnds runs the pipeline for target (runPipeline) and checks that
// it exited code with the event ended in state; it returns the event and
// the boot ID after the upgrade's reboot.
func (a *agentNode) pipelineEnds(t *testing.T, target string, code int, state v1alpha1.LifecycleEventClaimStatus) (*v1alpha1.LifecycleEvent, string) {
	t.Helper()
	event, out, got := a.runPipeline(t, target)
	bootAfter := a.v.BootID()
	if got != code || !strings.Contains(out, string(state)) {
		t.Errorf("the pipeline exited %d, want %d with the event %s:\n%s", got, code, state, out)
	}
	ev := a.c.WaitEvent(t, event, transitionTimeout, "an end state", finished)
	if ev.Status.ClaimStatus != state {
		t.Fatalf("event %s ended %s, want %s", event, vm.DescribeEvent(ev), state)
	}
	return ev, bootAfter
}

// osUpgradeChecks are the assertions both outcomes share: the drain came
// before the upgrade, the command ran once, the node rebooted once, and
// the journal's record of the event agrees with status.steps.
func (a *agentNode) osUpgradeChecks(t *testing.T, ev *v1alpha1.LifecycleEvent, bootAfter string, wantRuns, wantBoots int) {
	t.Helper()
	up, empty := vm.Step(ev, "upgrade"), vm.Step(ev, "wait-empty")
	switch {
	case up == nil || empty == nil:
		t.Errorf("no upgrade or wait-empty step: %s", vm.DescribeEvent(ev))
	case up.StartTime == nil || empty.FinishTime == nil || up.StartTime.Before(empty.FinishTime):
		t.Errorf("the upgrade started before the drain ended: wait-empty %+v, upgrade %+v", empty, up)
	}
	if runs := strings.Count(a.v.MustRun("cat "+upgradeRuns), "ran"); runs != wantRuns {
		t.Errorf("the upgrade command ran %d times in all, want %d (once per event)", runs, wantRuns)
	}
	if got := a.v.BootID(); got != bootAfter {
		t.Errorf("the node rebooted more than once: boot %s after the upgrade, now %s", bootAfter, got)
	}
	if a.v.Boots() != wantBoots {
		t.Errorf("%d boots, want %d (the first, and one reboot per upgrade)", a.v.Boots(), wantBoots)
	}
	// The journal's history, read offline (the agent stopped), has the
	// same steps in the same end states.
	out, code := a.v.Run("systemctl stop " + vm.Unit + " && lifecycle-agent journal export; rc=$?; systemctl start " + vm.Unit + "; exit $rc")
	if code != 0 {
		t.Fatalf("lifecycle-agent journal export: exit %d\n%s", code, out)
	}
	var doc journal.ExportDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("journal export: %v\n%s", err, out)
	}
	var h *journal.HistoryRecord
	for i := range doc.History {
		if doc.History[i].Event.Name == ev.Name {
			h = &doc.History[i]
		}
	}
	if h == nil {
		t.Fatalf("the journal has no finished event %s: %d in history", ev.Name, len(doc.History))
	}
	last := map[string]journal.StepRecord{}
	for _, s := range h.Steps {
		last[s.Step] = s
	}
	for _, s := range ev.Status.Steps {
		j, ok := last[s.Name]
		want := map[v1alpha1.StepState]journal.StepState{v1alpha1.StepDone: journal.StepDone, v1alpha1.StepFailed: journal.StepFailed, v1alpha1.StepSkipped: journal.StepSkipped}[s.State]
		switch {
		case s.State == v1alpha1.StepPending && ok:
			t.Errorf("step %s: pending in the status, %s in the journal", s.Name, j.State)
		case s.State != v1alpha1.StepPending && (!ok || j.State != want):
			t.Errorf("step %s: %s in the status, journal %+v", s.Name, s.State, j)
		}
	}
}

// (g1) Profile mode, target reached: drained, upgraded once under the
// block inhibitor, rebooted once, verified after the boot, uncordoned,
// Succeeded; the pipeline's wait after the reboot exits 0. Then (g2).
func TestScenarioOSUpgradeProfile(t *testing.T) {
	defer vm.Scenario(t)()
	a := upgradeNode(t, vm.Options{})
	a.workload(t, "workload", map[string]string{"app": "workload"})
	ev, bootAfter := a.pipelineEnds(t, upgradedVersionID, 0, v1alpha1.LifecycleEventSucceeded)
	if d := ev.Status.Driver; d.Name != "lifecycle-agent.x-k8s.io/os-upgrade" || d.Start != "OSUpgradeStarted" || d.End != "OSUpgradeComplete" {
		t.Errorf("status.driver = %+v", d)
	}
	for _, name := range []string{"cordon", "evict", "wait-empty", "upgrade", "reboot", "verify", "wait-ready", "uncordon"} {
		if s := vm.Step(ev, name); s == nil || s.State != v1alpha1.StepDone {
			t.Errorf("step %s: %+v, want Done", name, s)
		}
	}
	if got := strings.TrimSpace(a.v.MustRun(". /etc/os-release && echo $VERSION_ID")); got != upgradedVersionID {
		t.Errorf("VERSION_ID after the upgrade: %s", got)
	}
	if gone, why := a.podGone("workload"); !gone {
		t.Errorf("the workload was not evicted: %s", why)
	}
	// Under the block inhibitor, as its own transient unit.
	if unitLog := a.v.MustRun("journalctl -b -1 --no-pager -o cat -u lifecycle-os-upgrade-" + ev.Name + ".service"); !strings.Contains(unitLog, "vmtest-os-upgrade") {
		t.Errorf("no transient unit lifecycle-os-upgrade-%s.service ran the profile's command in the boot before:\n%s", ev.Name, lastLines(unitLog, 20))
	}
	if agentLog := a.v.JournalBoot(vm.Unit, -1); !strings.Contains(agentLog, `what=shutdown:sleep mode=block`) {
		t.Errorf("the agent took no block inhibitor on shutdown:sleep for the upgrade:\n%s", lastLines(agentLog, 30))
	}
	a.waitUpgradeComplete(t)
	if a.rec.FirstSeen(vm.Cordoned).IsZero() {
		t.Errorf("the node was never seen cordoned:\n%s", a.rec.Describe())
	}
	a.osUpgradeChecks(t, ev, bootAfter, 1, 2)

	// (g2), on the same node: the target not reached.
	a.upgradeTargetMissed(t)
}

// (g2) Profile mode, target not reached: the package makes 12.99, the
// pipeline asks for 13.99. Failed, naming both; one reboot only (the
// verify step fails, it does not reboot again); the pipeline exits 1; and
// the node is uncordoned (docs/pipelines.md: the abort lifts the cordon
// the event made — the node runs the OS it booted, which is not the one
// asked for, and the pipeline that owns the upgrade decides what next).
// It runs after (g1) on the same node (a second pipeline run: the VM
// package's time).
func (a *agentNode) upgradeTargetMissed(t *testing.T) {
	t.Helper()
	a.v.MustRun("rm -f /var/lib/vmtest-pipeline.event")
	vm.WaitAgentActive(t, a.v, agentStartTimeout)
	const want = "13.99"
	ev, bootAfter := a.pipelineEnds(t, want, 1, v1alpha1.LifecycleEventFailed)
	if !strings.Contains(ev.Status.Message, want) || !strings.Contains(ev.Status.Message, upgradedVersionID) {
		t.Errorf("the message %q does not name the expected (%s) and the found (%s) VERSION_ID", ev.Status.Message, want, upgradedVersionID)
	}
	if s := vm.Step(ev, "verify"); s == nil || s.State != v1alpha1.StepFailed {
		t.Errorf("step verify: %+v, want Failed", s)
	}
	vm.Eventually(t, time.Minute, "node uncordoned after the failed upgrade", func() (bool, string) {
		n := a.c.NodeObject(t)
		_, ann := n.Annotations[v1alpha1.AnnotationCordonedBy]
		return !n.Spec.Unschedulable && !ann, fmt.Sprintf("unschedulable=%v annotation=%v", n.Spec.Unschedulable, ann)
	})
	// Nothing reboots the node again: stay a while and look.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	<-ctx.Done()
	cancel()
	a.osUpgradeChecks(t, ev, bootAfter, 2, 3)
}

// (g3) External mode, as a re-imaging tool drives it: the pipeline's
// request is made while the guest cannot reach the API server (queued in
// the journal, published when it returns); `request --wait` returns 0 once
// the node is drained (step wait-reboot); the pipeline upgrades and
// reboots the node itself; after the boot the agent, which did not start
// that reboot, sees the new boot, verifies the target and uncordons.
func TestScenarioOSUpgradeExternal(t *testing.T) {
	defer vm.Scenario(t)()
	c := vm.StartCluster(t)
	proxy, err := c.Env.NewCutProxy()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	a := upgradeNodeOn(t, c, vm.Options{APIForward: proxy.Addr()})
	a.workload(t, "workload", map[string]string{"app": "workload"})
	boots, bootBefore := a.v.Boots(), a.v.BootID()

	proxy.Cut()
	a.v.MustRun(`systemd-run --unit=vmtest-external --collect /bin/sh -c 'lifecycle-agent request os-upgrade --param mode=external --param targetVersionID=` +
		upgradedVersionID + ` --wait --timeout 10m >/var/lib/vmtest-external.out 2>&1; echo $? >/var/lib/vmtest-external.rc'`)
	var event string
	vm.Eventually(t, time.Minute, "the request queued while the API server is unreachable", func() (bool, string) {
		o, _ := a.v.Run("head -1 /var/lib/vmtest-external.out")
		event, _, _ = strings.Cut(strings.TrimSpace(o), " ")
		return strings.Contains(o, "queued"), o
	})
	if st := a.v.MustRun("lifecycle-agent status"); !regexp.MustCompile(`queued:\s+1 local request`).MatchString(st) {
		t.Errorf("status does not show the queued request:\n%s", st)
	}
	time.Sleep(5 * time.Second)
	proxy.Heal()
	vm.Eventually(t, 3*time.Minute, "request --wait returned at wait-reboot", func() (bool, string) {
		o, code := a.v.Run("cat /var/lib/vmtest-external.rc")
		return code == 0 && strings.TrimSpace(o) != "", o
	})
	out := a.v.MustRun("cat /var/lib/vmtest-external.out; echo rc=$(cat /var/lib/vmtest-external.rc)")
	t.Logf("the pipeline's request --wait:\n%s", out)
	if strings.Contains(out, "not running") {
		t.Errorf("request --wait said the (running) agent was not running while the request was queued:\n%s", out)
	}
	if !strings.Contains(out, "rc=0") || !strings.Contains(out, "node drained; upgrade and reboot it") {
		t.Fatalf("request --wait in external mode: want exit 0 at wait-reboot:\n%s", out)
	}
	ev := a.c.Event(t, event)
	if ev.Status.CurrentStep != "wait-reboot" || ev.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed {
		t.Fatalf("event %s when --wait returned: %s", event, vm.DescribeEvent(ev))
	}
	if gone, why := a.podGone("workload"); !gone {
		t.Errorf("request --wait returned before the drain: %s", why)
	}
	// The pipeline's own upgrade and reboot.
	a.v.MustRun("DEBIAN_FRONTEND=noninteractive dpkg -i --force-confdef --force-confold " + upgradeDeb + " >/dev/null && (sleep 1; systemctl reboot) >/dev/null 2>&1 &")
	bootAfter := a.v.WaitBoot(boots)
	if bootAfter == bootBefore {
		t.Fatalf("boot ID unchanged after the pipeline's reboot")
	}
	ev = a.c.WaitEvent(t, event, transitionTimeout, "an end state", finished)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("event %s ended %s", event, vm.DescribeEvent(ev))
	}
	for _, name := range []string{"cordon", "evict", "wait-empty", "wait-reboot", "verify", "wait-ready", "uncordon"} {
		if s := vm.Step(ev, name); s == nil || s.State != v1alpha1.StepDone {
			t.Errorf("step %s: %+v, want Done", name, s)
		}
	}
	if s := vm.Step(ev, "upgrade"); s != nil {
		t.Errorf("external mode ran an upgrade step: %+v", s)
	}
	if _, code := a.v.Run("test -e " + upgradeRuns); code == 0 {
		t.Errorf("external mode ran the profile's command")
	}
	a.waitUpgradeComplete(t)
	if got := a.v.BootID(); got != bootAfter || a.v.Boots() != 2 {
		t.Errorf("more than the pipeline's one reboot: boot %s after it, now %s, %d boots", bootAfter, got, a.v.Boots())
	}
}

// (g4) A power cut in the middle of the upgrade (QMP reset while the
// profile's unit runs): after the boot the replay does not run the
// command again blindly; the profile's check (VERSION_ID not yet the
// target) says the upgrade did not complete, so it runs again, reboots,
// verifies and succeeds. (Without a check the step fails and says why:
// internal/drivers TestOSUpgradeReplayAfterPowerLoss, test/e2e
// TestReplayUndecidableStepFails.)
func TestScenarioOSUpgradePowerCut(t *testing.T) {
	defer vm.Scenario(t)()
	a := upgradeNode(t, vm.Options{})
	bootFirst := a.v.BootID()
	event := strings.TrimSpace(a.v.MustRun("lifecycle-agent request os-upgrade --param profile=vmtest-slow --param targetVersionID=" + upgradedVersionID + " -o name"))
	vm.Eventually(t, 3*time.Minute, "the upgrade command running (stalled)", func() (bool, string) {
		o, code := a.v.Run("test -e " + stallMark + " && cat " + upgradeRuns)
		return code == 0 && strings.Count(o, "ran") == 1, o
	})
	if e := a.c.Event(t, event); e.Status.CurrentStep != "upgrade" {
		t.Fatalf("event %s at the power cut: %s", event, vm.DescribeEvent(e))
	}
	// Counted from before the power cut: on a loaded machine the guest's
	// ssh can come up after the replay's own reboot (make test at
	// 6ae9e68: the boot marker at 24.6 s, ssh at 1m0.4s), and a count
	// taken after HardReset then already held that reboot.
	boots := a.v.Boots()
	bootCut := a.v.HardReset()
	if bootCut == bootFirst {
		t.Fatalf("boot ID unchanged after the power cut")
	}
	ev := a.c.WaitEvent(t, event, transitionTimeout, "an end state", finished)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("event %s ended %s", event, vm.DescribeEvent(ev))
	}
	if a.v.Boots() != boots+2 {
		t.Errorf("%d boots from the power cut on, want 2 (the power cut's, then the upgrade's reboot)", a.v.Boots()-boots)
	}
	if runs := strings.Count(a.v.MustRun("cat "+upgradeRuns), "ran"); runs != 2 {
		t.Errorf("the upgrade command ran %d times, want 2 (cut off, then again because the check said not done)", runs)
	}
	log := a.v.JournalBoot(vm.Unit, -1)
	if !strings.Contains(log, "its check says the upgrade did not complete (exit 1): running it again") {
		t.Errorf("the agent's log of the boot after the power cut does not say what the check decided:\n%s", lastLines(log, 40))
	}
	if got := strings.TrimSpace(a.v.MustRun(". /etc/os-release && echo $VERSION_ID")); got != upgradedVersionID {
		t.Errorf("VERSION_ID after the upgrade: %s", got)
	}
	a.waitUpgradeComplete(t)
}
