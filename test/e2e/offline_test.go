package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// While the API server is down, steps that need no API go on and status
// waits in the outbox; when it returns, everything is delivered in order and
// the newest state wins.
func TestOfflineStepsAndOutbox(t *testing.T) {
	node := "offline-node"
	newNode(t, node)
	g := newGateDriver("offline", false, "one", "two", "three")
	a := startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{g}})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "offline"), metav1.GetOptions{})
		return err == nil
	})
	createEvent(t, "offline-1", node, transitionName(node, "offline"), nil, nil)
	lc := clients(t, env.AdminConfig())
	waitFor(t, "step one running", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "offline-1", metav1.GetOptions{})
		return err == nil && ev.Status.CurrentStep == "one"
	})

	restart, err := env.StopProcess("kube-apiserver")
	if err != nil {
		t.Fatal(err)
	}
	apiDown := true
	defer func() {
		if apiDown {
			_ = restart(context.Background())
		}
	}()
	for _, s := range []string{"one", "two", "three"} {
		g.open(s)
		select {
		case got := <-g.ran:
			if got != s {
				t.Fatalf("ran %s, want %s", got, s)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("step %s did not run while the API server was down", s)
		}
	}
	// The end state waits in the outbox until the server is back.
	waitFor(t, "the agent to queue its end state", 30*time.Second, func() bool {
		return containsAll(a.logBuf.String(), "finishing (Succeeded)")
	})
	if err := restart(context.Background()); err != nil {
		t.Fatalf("restarting kube-apiserver: %v", err)
	}
	apiDown = false
	ev := waitEvent(t, "offline-1", 2*time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("got %s: %s", ev.Status.ClaimStatus, ev.Status.Message)
	}
	if got := stepStates(ev); got != "one=Done,two=Done,three=Done" {
		t.Fatalf("steps = %s; the newest state must win", got)
	}
	for _, s := range ev.Status.Steps {
		if s.FinishTime == nil || s.StartTime == nil {
			t.Fatalf("step %s lacks times: %+v", s.Name, s)
		}
	}
	// The finalizer off is not the end of the agent's work: it gives its
	// Leases back, then moves the event to the history. Stopped before
	// that (a loaded machine: make test with other tests beside it), the
	// event stays journaled as finishing, for the next start.
	waitFor(t, "the event moved to the journal's history", 30*time.Second, func() bool {
		return containsAll(a.logBuf.String(), "event finished")
	})
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if len(doc.Outbox) != 0 {
		t.Fatalf("outbox not empty after delivery: %+v", doc.Outbox)
	}
	if len(doc.History) != 1 || doc.History[0].Event.Name != "offline-1" || doc.History[0].Outcome != journal.OutcomeSucceeded {
		t.Fatalf("journal history = %+v", doc.History)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}

func exportJournal(t *testing.T, path string) journal.ExportDoc {
	t.Helper()
	var b bytes.Buffer
	if err := journal.Export(path, &b); err != nil {
		t.Fatal(err)
	}
	var doc journal.ExportDoc
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// A lost journal (moved aside as corrupt, or deleted): the agent adopts the
// event it had claimed and rebuilds its steps from the event's status, so a
// step that was done is not repeated.
func TestLostJournalAdoptsWithoutRepeating(t *testing.T) {
	node := "lostjournal-node"
	newNode(t, node)
	g := newGateDriver("twostep", false, "one", "two")
	a := startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{g}})
	waitFor(t, "transitions", 30*time.Second, func() bool {
		_, err := clients(t, env.AdminConfig()).Transitions.Get(context.Background(), transitionName(node, "twostep"), metav1.GetOptions{})
		return err == nil
	})
	createEvent(t, "lost-1", node, transitionName(node, "twostep"), nil, nil)
	g.open("one")
	lc := clients(t, env.AdminConfig())
	waitFor(t, "step one done and two running in the status", 30*time.Second, func() bool {
		ev, err := lc.Events.Get(context.Background(), "lost-1", metav1.GetOptions{})
		return err == nil && stepStates(ev) == "one=Done,two=Running"
	})
	a.stop(t)
	if err := os.Remove(a.Journal); err != nil {
		t.Fatal(err)
	}
	g2 := newGateDriver("twostep", false, "one", "two")
	g2.open("two") // "one" stays shut: running it again would hang the event
	startAgent(t, node, agentOpts{retention: time.Hour, extra: []drivers.Driver{g2}, dir: a.dir})
	ev := waitEvent(t, "lost-1", time.Minute)
	if ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded || stepStates(ev) != "one=Done,two=Done" {
		t.Fatalf("got %s %s (%s)", ev.Status.ClaimStatus, ev.Status.Message, stepStates(ev))
	}
	select {
	case s := <-g2.ran:
		if s != "two" {
			t.Fatalf("after the journal was lost, step %s ran again", s)
		}
	default:
		t.Fatal("step two never ran")
	}
}

// A cordon whose event ended without success and whose abort could not undo
// it (the journal still owns it) is undone by the idle agent; the journal's
// record goes with it.
func TestLeftoverCordonUndone(t *testing.T) {
	node := "leftover-node"
	dir := leftoverCordon(t, node, "gave-up-1", journal.EventRecord{UID: "11111111-2222-3333-4444-555555555555", Driver: drivers.Prefix + "drain", State: journal.EventAborting},
		node, "step evict failed; abort: the API server did not answer")
	a := startAgent(t, node, agentOpts{dir: dir, retention: time.Hour})
	waitFor(t, "the leftover cordon undone", 60*time.Second, func() bool {
		n := getNode(t, node)
		return !n.Spec.Unschedulable && n.Annotations[v1alpha1.AnnotationCordonedBy] == ""
	})
	// Its record goes after the uncordon: stopped in between, the journal
	// still owns it (for the next start).
	waitFor(t, "the leftover's record dropped", 30*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "undid a leftover cordon")
	})
	a.stop(t)
	doc := exportJournal(t, a.Journal)
	if len(doc.Owned) != 0 {
		t.Fatalf("the journal still owns %+v", doc.Owned)
	}
}

// A kept cordon's record (readiness.onTimeout keepCordoned) left in the
// journal by a crash after its event moved to the history, before finish
// dropped it: the idle agent drops the record and leaves the cordon, which
// is the admin's.
func TestLeftoverKeptRecordDropped(t *testing.T) {
	node := "leftover-kept"
	dir := leftoverCordon(t, node, "kept-1", journal.EventRecord{UID: "11111111-2222-3333-4444-666666666666", Driver: drivers.Prefix + "reboot", State: journal.EventFinishing},
		drivers.CordonKept(node).Key, "step wait-workloads-ready failed"+drivers.KeptSuffix)
	a := startAgent(t, node, agentOpts{dir: dir, retention: time.Hour})
	waitFor(t, "the kept record dropped", 60*time.Second, func() bool {
		return strings.Contains(a.logBuf.String(), "dropped the record of an ended event's kept cordon")
	})
	a.stop(t)
	if doc := exportJournal(t, a.Journal); len(doc.Owned) != 0 {
		t.Errorf("the journal still owns %+v", doc.Owned)
	}
	if n := getNode(t, node); !n.Spec.Unschedulable || n.Annotations[v1alpha1.AnnotationCordonedBy] != "kept-1" {
		t.Errorf("node unschedulable=%v cordoned-by %q, want the kept cordon left", n.Spec.Unschedulable, n.Annotations[v1alpha1.AnnotationCordonedBy])
	}
}

// leftoverCordon is a node cordoned by event name, and the journal (in the
// directory it returns) of an agent whose event rec (name, Object set here)
// ended Failed with msg still owning the change of kind cordon keyed by
// changeNode (the node's cordon, or its kept record).
func leftoverCordon(t *testing.T, node, name string, rec journal.EventRecord, changeNode, msg string) string {
	t.Helper()
	newNode(t, node)
	dir := t.TempDir()
	j, _, err := journal.Open(context.Background(), filepath.Join(dir, "journal.db"), journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec.Name, rec.Object = name, []byte(`{}`)
	if err := j.PutEvent(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := j.AddOwned(journal.Change{Kind: journal.ChangeCordon, Node: changeNode, EventUID: rec.UID, Value: name}); err != nil {
		t.Fatal(err)
	}
	if err := j.FinishEvent(rec.UID, journal.OutcomeFailed, msg); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(env.AdminConfig())
	patch := []byte(`{"metadata":{"annotations":{"` + v1alpha1.AnnotationCordonedBy + `":"` + name + `"}},"spec":{"unschedulable":true}}`)
	if _, err := cs.CoreV1().Nodes().Patch(context.Background(), node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}
