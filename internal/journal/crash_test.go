package journal

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	gofail "go.etcd.io/gofail/runtime"
)

// crashChild runs the engine's write sequence for one event on a new journal
// at path; with a failpoint set to panic (GOFAIL_FAILPOINTS) it dies at that
// boundary. It returns 0 only if it ran to the end.
func crashChild(path string) int {
	fail := func(err error) int {
		os.Stderr.WriteString("crash child: " + err.Error() + "\n")
		return 3
	}
	j, _, err := Open(context.Background(), path, Options{})
	if err != nil {
		return fail(err)
	}
	uid := "uid-crash"
	if err := j.PutEvent(testEvent(uid)); err != nil {
		return fail(err)
	}
	if _, err := j.AddOwned(Change{Kind: ChangeCordon, Node: "node-a", EventUID: uid}); err != nil {
		return fail(err)
	}
	if _, err := j.AppendStep(uid, StepRecord{Step: "cordon", Phase: PhaseIntent, State: StepRunning, Attempt: 1}); err != nil {
		return fail(err)
	}
	if _, err := j.OutboxPush(OutboxEntry{UID: uid, Kind: OutboxEventStatus, Payload: json.RawMessage(`{"step":"cordon"}`)}); err != nil {
		return fail(err)
	}
	if _, err := j.AppendStep(uid, StepRecord{Step: "cordon", Phase: PhaseDone, State: StepDone, Attempt: 1}); err != nil {
		return fail(err)
	}
	if err := j.FinishEvent(uid, OutcomeSucceeded, ""); err != nil {
		return fail(err)
	}
	return 0
}

// envRequireFailpoints makes TestCrashBoundaries fail when the failpoints
// are not compiled in.
const envRequireFailpoints = "LIFECYCLE_AGENT_REQUIRE_FAILPOINTS"

// journalState counts what a restarted agent finds.
type journalState struct{ events, owned, steps, outbox, history int }

// TestCrashBoundaries kills a process at each failpoint and asserts what the
// next open finds: a "before" point loses exactly that write, an "after"
// point keeps it. It needs failpoints compiled in: test/crash's
// TestJournalCrashBoundaries (in make test) builds this package's tests
// with them and runs it, with envRequireFailpoints set so that it fails
// rather than skips. A plain go test of this package skips it, saying so.
func TestCrashBoundaries(t *testing.T) {
	tests := []struct {
		failpoint string
		want      journalState
	}{
		{failpoint: "journalBeforeEventCommit", want: journalState{}},
		{failpoint: "journalAfterEventCommit", want: journalState{events: 1}},
		{failpoint: "journalBeforeOwnedCommit", want: journalState{events: 1}},
		{failpoint: "journalAfterOwnedCommit", want: journalState{events: 1, owned: 1}},
		{failpoint: "journalBeforeStepIntentCommit", want: journalState{events: 1, owned: 1}},
		{failpoint: "journalAfterStepIntentCommit", want: journalState{events: 1, owned: 1, steps: 1}},
		{failpoint: "journalBeforeOutboxCommit", want: journalState{events: 1, owned: 1, steps: 1}},
		{failpoint: "journalAfterOutboxCommit", want: journalState{events: 1, owned: 1, steps: 1, outbox: 1}},
		{failpoint: "journalBeforeStepDoneCommit", want: journalState{events: 1, owned: 1, steps: 1, outbox: 1}},
		{failpoint: "journalAfterStepDoneCommit", want: journalState{events: 1, owned: 1, steps: 2, outbox: 1}},
		{failpoint: "journalBeforeFinishCommit", want: journalState{events: 1, owned: 1, steps: 2, outbox: 1}},
		{failpoint: "journalAfterFinishCommit", want: journalState{owned: 1, outbox: 1, history: 1}},
	}
	compiled := gofail.List()
	for _, tt := range tests {
		t.Run(tt.failpoint, func(t *testing.T) {
			if !slices.Contains(compiled, tt.failpoint) {
				if os.Getenv(envRequireFailpoints) == "1" {
					t.Fatalf("%s=1 but failpoint %s is not compiled in", envRequireFailpoints, tt.failpoint)
				}
				t.Skip("SKIP: failpoints are not compiled in this build; test/crash TestJournalCrashBoundaries runs this test with them (make test)")
			}
			path := journalPath(t)
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(exe)
			cmd.Env = append(os.Environ(), envCrashPath+"="+path, "GOFAIL_FAILPOINTS="+tt.failpoint+`=panic("crash at failpoint")`)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "crash at failpoint") {
				t.Fatalf("child did not crash at %s: %v\n%s", tt.failpoint, err, out)
			}

			j, rep := openJournal(t, path, testOptions(t))
			if rep.Corruption != nil {
				t.Fatalf("crash left a corrupt file: %v", rep.Corruption)
			}
			var got journalState
			evs, _ := j.Events()
			owned, _ := j.Owned()
			steps, _ := j.Steps("uid-crash")
			outbox, _ := j.OutboxPending()
			hist, _ := j.History()
			got = journalState{len(evs), len(owned), len(steps), len(outbox), len(hist)}
			if got != tt.want {
				t.Errorf("after a crash at %s: %+v, want %+v", tt.failpoint, got, tt.want)
			}
		})
	}
}
