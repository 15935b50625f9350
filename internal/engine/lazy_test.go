package engine

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// pushStatusLazy: a progress status lingers statusLinger at the head of
// the outbox and the next one supersedes it keeping the older time (a
// stream still goes out once a second); while a step with a Done check
// runs, a status queued behind its unsent Running goes out at once; once
// it is delivered, progress lingers again.
func TestLazyStatus(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	e := newOfflineEngine(t, clk)
	j := e.cfg.Journal
	checked := func(context.Context, drivers.Runtime, string) (bool, error) { return false, nil }
	a := &active{name: "ev", uid: "uid-1", steps: []drivers.Step{{Name: "cordon"}, {Name: "reboot", Done: checked}}}
	for _, s := range a.steps {
		a.status.Steps = append(a.status.Steps, v1alpha1.StepStatus{Name: s.Name, State: v1alpha1.StepPending})
	}
	rt := &stepRuntime{e: e, a: a}
	head := func() (journal.OutboxEntry, int) {
		t.Helper()
		p, err := j.OutboxPending()
		if err != nil || len(p) == 0 {
			t.Fatalf("outbox: %d entries, %v", len(p), err)
		}
		return p[0], len(p)
	}
	deliver := func() {
		t.Helper()
		en, _ := head()
		if err := j.OutboxAck(en.Seq); err != nil {
			t.Fatal(err)
		}
		e.acked(en.Seq)
	}

	// The first step (no Done check) runs and reports progress.
	a.status.CurrentStep, a.status.Steps[0].State = "cordon", v1alpha1.StepRunning
	if err := e.pushStatusLazy(a); err != nil {
		t.Fatal(err)
	}
	p, _ := j.OutboxPending()
	if w := e.lingering(p); w != statusLinger {
		t.Fatalf("a step's Running lingers %s, want %s", w, statusLinger)
	}
	clk.Step(600 * time.Millisecond)
	rt.Progress("cordoned")
	p, _ = j.OutboxPending()
	if len(p) != 1 {
		t.Fatalf("%d status entries queued, want 1 (superseded)", len(p))
	}
	if w := e.lingering(p); w != 400*time.Millisecond {
		t.Fatalf("the superseding progress lingers %s, want the first one's remaining 400ms", w)
	}
	clk.Step(400 * time.Millisecond)
	if w := e.lingering(p); w != 0 {
		t.Fatalf("due, it still lingers %s", w)
	}
	deliver()

	// The step with a Done check: its Running is urgent, and progress
	// queued behind it while it is unsent is urgent too.
	a.status.Steps[0].State = v1alpha1.StepDone
	a.status.CurrentStep, a.status.Steps[1].State = "reboot", v1alpha1.StepRunning
	if err := e.pushStatus(a); err != nil {
		t.Fatal(err)
	}
	rt.Progress("asking logind to reboot")
	p, _ = j.OutboxPending()
	if len(p) != 1 || e.lingering(p) != 0 {
		t.Fatalf("%d entries, lingering %s: want the progress to carry the urgent Running on at once", len(p), e.lingering(p))
	}
	deliver()
	// Delivered: progress lingers again.
	rt.Progress("rebooted")
	p, _ = j.OutboxPending()
	if w := e.lingering(p); w != statusLinger {
		t.Fatalf("progress after the Running was delivered lingers %s, want %s", w, statusLinger)
	}
}
