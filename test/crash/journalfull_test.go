package crash

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// metric returns the value line of a metric without labels on /metrics.
func metric(t *testing.T, a *agentProc, name string) float64 {
	t.Helper()
	v, err := agentMetric(a, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The journal refuses an event's end state (disk full: a failpoint makes
// the write of the Finishing record fail): the agent must not report the
// end or release the finalizer while the journal cannot keep it — an agent
// that went on would lose the end state at the next restart and run the
// event again — and must say so: status, lifecycle_agent_finish_blocked.
// Once the journal writes again the event ends Succeeded.
func TestJournalFullAtFinish(t *testing.T) {
	c, lc, _, _ := compoundCase(t, "compound-journal-full", false)
	ctx := context.Background()
	c.gofailHTTP = true
	a := c.start(t, `journalFinishingWriteError=return("ENOSPC")`)
	waitFor(t, "transition published", 60*time.Second, a, func() bool {
		_, err := lc.Transitions.Get(ctx, c.node+"-uncordon", metav1.GetOptions{})
		return err == nil
	})
	createDrain(t, lc, c, c.event, "uncordon")
	waitFor(t, "the agent to report the journal refusing the end state", 30*time.Second, a, func() bool {
		st, err := statusFromSocket(ctx, c.socket())
		return err == nil && strings.Contains(st.State, "blocked: cannot journal its end state") && strings.Contains(st.State, "no space left on device")
	})
	if v := metric(t, a, "lifecycle_agent_finish_blocked"); v != 1 {
		t.Errorf("lifecycle_agent_finish_blocked %v while the journal refuses the end state, want 1", v)
	}
	time.Sleep(2 * time.Second) // a few retries
	ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventClaimed || !hasFinalizer(ev) {
		t.Errorf("while the journal refuses the end state the event is %s with finalizers %v, want Claimed with the agent's finalizer", ev.Status.ClaimStatus, ev.Finalizers)
	}

	// The disk has room again.
	req, _ := http.NewRequest(http.MethodDelete, "http://"+a.gofail+"/journalFinishingWriteError", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, "the event to end Succeeded once the journal writes", 60*time.Second, a, func() bool {
		ev, err := lc.Events.Get(ctx, c.event, metav1.GetOptions{})
		return err == nil && ev.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded && !hasFinalizer(ev)
	})
	if v := metric(t, a, "lifecycle_agent_finish_blocked"); v != 0 {
		t.Errorf("lifecycle_agent_finish_blocked %v after the journal recovered, want 0", v)
	}
	claimNextThenStop(t, c, lc, a)
}

func hasFinalizer(ev *v1alpha1.LifecycleEvent) bool {
	for _, f := range ev.Finalizers {
		if f == v1alpha1.Finalizer {
			return true
		}
	}
	return false
}
