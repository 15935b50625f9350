package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The close-out's waits after a shutdown (returnAfterShutdown), replayed
// from what the journal holds: a decision taken before a restart stands,
// a wait done in an earlier boot is waited for again in this one.
func TestShutdownReturnReplay(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps and kept are what the journal holds for the shutdown
		// (boot "old" is an earlier boot, "" this one).
		steps []journal.StepRecord
		kept  bool
		// want: the runs of wait-ready, its StepStarted seen non-zero,
		// and the error's text ("" for none).
		runs    int
		started bool
		err     string
	}{
		{
			name: "the cordon kept before the failure was journaled: not run again, not back",
			steps: []journal.StepRecord{
				{Step: "wait-ready", Phase: journal.PhaseIntent, State: journal.StepRunning, Attempt: 1},
			},
			kept: true, runs: 0, err: "decided before the agent restarted",
		},
		{
			name: "failed in an earlier boot: the failure stands",
			steps: []journal.StepRecord{
				{Step: "wait-ready", Phase: journal.PhaseIntent, State: journal.StepRunning, Attempt: 1, BootID: "old"},
				{Step: "wait-ready", Phase: journal.PhaseDone, State: journal.StepFailed, Attempt: 1, BootID: "old", Message: "the node did not become Ready"},
			},
			runs: 0, err: "the node did not become Ready",
		},
		{
			name: "done in an earlier boot (a power loss before the close-out): waited for again, from now",
			steps: []journal.StepRecord{
				{Step: "wait-ready", Phase: journal.PhaseIntent, State: journal.StepRunning, Attempt: 1, BootID: "old"},
				{Step: "wait-ready", Phase: journal.PhaseDone, State: journal.StepDone, Attempt: 1, BootID: "old"},
			},
			runs: 1, started: true,
		},
		{
			name: "done in this boot: not run again",
			steps: []journal.StepRecord{
				{Step: "wait-ready", Phase: journal.PhaseIntent, State: journal.StepRunning, Attempt: 1},
				{Step: "wait-ready", Phase: journal.PhaseDone, State: journal.StepDone, Attempt: 1},
			},
			runs: 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
			e := newOfflineEngine(t, clk)
			j, boot := e.cfg.Journal, e.cfg.Host.BootID()
			runs, started := 0, false
			e.cfg.ShutdownReturn = drivers.NodeReturn{KeepCordoned: true, Steps: []drivers.Step{{Name: "wait-ready", Run: func(_ context.Context, rt drivers.Runtime) error {
				runs++
				started = !rt.StepStarted().IsZero()
				return nil
			}}}}
			r := journal.EventRecord{UID: e.shutdownUID("old"), Name: "shutdown-n-old", Driver: ShutdownDriver, State: journal.EventRunning,
				Attrs: map[string]string{"bootID": "old", "local": "true"}}
			if err := j.PutEvent(r); err != nil {
				t.Fatal(err)
			}
			for _, st := range tc.steps {
				if st.BootID == "" {
					st.BootID = boot
				}
				if _, err := j.AppendStep(r.UID, st); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := j.AddOwned(journal.Change{Kind: journal.ChangeCordon, Node: "n", Name: shutdownOwner, EventUID: r.UID, Value: shutdownOwner}); err != nil {
				t.Fatal(err)
			}
			if tc.kept {
				rt := &shutdownRuntime{e: e, r: r}
				if err := rt.Own(drivers.CordonKept("n")); err != nil {
					t.Fatal(err)
				}
			}
			err := e.returnAfterShutdown(context.Background(), r)
			var nb notBack
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("returnAfterShutdown: %v, want the node back", err)
			case tc.err != "" && (!errors.As(err, &nb) || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("returnAfterShutdown: %v, want not back: %q", err, tc.err)
			}
			if runs != tc.runs || started != tc.started {
				t.Errorf("wait-ready ran %d times (StepStarted known: %v), want %d (%v)", runs, started, tc.runs, tc.started)
			}
		})
	}
}

// An event adopted without its journal: the steps rebuilt from its status
// keep a failed step's failure (it is not run again), except the readiness
// wait's, which looks once more and journals what readiness.onTimeout keeps.
func TestRebuiltStepsFailed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e := newOfflineEngine(t, clk)
	for _, tc := range []struct {
		step, want string
		state      v1alpha1.StepState
		msg        string
	}{
		{step: "verify", want: "verify:intent verify:Failed(the target was not reached)"},
		{step: drivers.StepWaitWorkloads, want: drivers.StepWaitWorkloads + ":intent"},
		// A Done step's message is kept: the conditions read the cordon
		// step's (a lost journal gave "back in service" on a node left
		// cordoned by an earlier drain event).
		{step: "cordon", state: v1alpha1.StepDone, msg: drivers.CordonNotOurs, want: "cordon:intent cordon:Done(" + drivers.CordonNotOurs + ")"},
	} {
		a := &active{name: "ev", uid: "uid-1"}
		state, msg := v1alpha1.StepFailed, "the target was not reached"
		if tc.state != "" {
			state, msg = tc.state, tc.msg
		}
		a.status.Steps = []v1alpha1.StepStatus{{Name: tc.step, State: state, Attempt: 1, Message: msg}}
		var got []string
		for _, r := range e.rebuiltSteps(a) {
			s := r.Step + ":intent"
			if r.Phase == journal.PhaseDone {
				s = r.Step + ":" + r.State.String() + "(" + r.Message + ")"
			}
			got = append(got, s)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s in the status, rebuilt as %q, want %q", tc.step, got, tc.want)
		}
	}
}

// The next boot makes a shutdown's cordon when the journal has no record
// of it made for the last announcement: a cordon made for an earlier
// announcement of the same shutdown (cancelled and uncordoned, the record
// kept because the API server did not take the conditions) does not count.
func TestCordonMadeForLastAnnouncement(t *testing.T) {
	intent := journal.StepRecord{Step: "shutdown", Phase: journal.PhaseIntent, State: journal.StepRunning}
	made := journal.StepRecord{Step: shutdownCordonStep, Phase: journal.PhaseDone, State: journal.StepDone}
	for _, tc := range []struct {
		name string
		recs []journal.StepRecord
		want bool
	}{
		{"made", []journal.StepRecord{intent, made}, true},
		{"not made (the API server did not answer)", []journal.StepRecord{intent}, false},
		{"made for an earlier announcement, announced again", []journal.StepRecord{intent, made, intent}, false},
		{"made again after the second announcement", []journal.StepRecord{intent, made, intent, made}, true},
	} {
		if got := cordonMadeForLastAnnouncement(tc.recs); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A shutdown of this boot holds new claims and an earlier shutdown's
// close-out only while it can be one on its way down: a record left
// Running in the same boot for longer than shutdownStale (its cancel never
// seen) holds nothing up, or every new event waited until the next reboot.
func TestShutdownUnderwayIsBounded(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC))
	e := newOfflineEngine(t, clk)
	boot := e.cfg.Host.BootID()
	if e.shutdownUnderway() {
		t.Fatal("underway with nothing journaled")
	}
	r := journal.EventRecord{UID: e.shutdownUID(boot), Name: "shutdown-n", Driver: ShutdownDriver, State: journal.EventRunning,
		Attrs: map[string]string{"bootID": boot, "local": "true"}}
	if err := e.cfg.Journal.PutEvent(r); err != nil {
		t.Fatal(err)
	}
	if !e.shutdownUnderway() {
		t.Fatal("a shutdown just announced is not underway")
	}
	clk.Step(shutdownStale + time.Minute)
	if e.shutdownUnderway() {
		t.Errorf("a same-boot shutdown announced %s ago still holds everything up", shutdownStale+time.Minute)
	}
}

// A snapshot of what the node has, read within the budget, is kept even
// when the budget is spent by the time PrepareShutdown looks for it (its
// wait for an earlier shutdown's close-out ran it out): a select on both
// dropped it about half the time, and the next boot compared against
// nothing. 64 tries: one drop in them fails.
func TestSnapshotReadPastTheBudget(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 64; i++ {
		snap := make(chan map[string]string, 1)
		snap <- map[string]string{drivers.ResolvedReadiness: "gpus=8"}
		if p, ok := snapshotRead(ctx, snap); !ok || p[drivers.ResolvedReadiness] != "gpus=8" {
			t.Fatalf("try %d: got %v, %v; want the snapshot read", i, p, ok)
		}
	}
	if _, ok := snapshotRead(ctx, make(chan map[string]string)); ok {
		t.Fatal("a snapshot not read within the budget: got one")
	}
}
