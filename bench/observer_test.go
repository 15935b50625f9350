package bench

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

func benchEvent(name, rv string, cs v1alpha1.LifecycleEventClaimStatus) *v1alpha1.LifecycleEvent {
	return &v1alpha1.LifecycleEvent{
		ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv},
		Status:     v1alpha1.LifecycleEventStatus{ClaimStatus: cs},
	}
}

func newTestObserver() *Observer {
	return &Observer{changed: make(chan struct{}), claimed: map[string]time.Time{}, cond: map[string]time.Time{},
		gone: map[string]time.Time{}, unseen: map[string]bool{}, final: map[string]string{}, steps: map[string]int{}}
}

// TestObserverSeesADeletionLostWithItsWatch: the server ends the observer's
// watch, and the resourceVersion it resumes from is too old (410); the event
// was deleted in between. The observer must still report it gone (a fresh
// list no longer has it) and go on watching from the list's resourceVersion,
// not from "now" with the deletion lost: a scale run's wait for it timed out
// ("not deleted within 5m0s").
func TestObserverSeesADeletionLostWithItsWatch(t *testing.T) {
	o := newTestObserver()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	var opened []string
	watches := make(chan *watch.FakeWatcher, 4)
	open := func(rv string) (watch.Interface, error) {
		mu.Lock()
		opened = append(opened, rv)
		n := len(opened)
		mu.Unlock()
		if n == 3 {
			// The server may refuse the watch itself with 410 (compacted
			// again before it opened): the observer lists once more.
			return nil, apierrors.NewResourceExpired("too old resource version: 41 (45)")
		}
		w := watch.NewFake()
		watches <- w
		return w, nil
	}
	relists := 0
	relist := func() (string, error) {
		relists++
		// a-1 is gone, a-2 was created and claimed meanwhile.
		o.relisted([]v1alpha1.LifecycleEvent{*benchEvent("a-2", "41", v1alpha1.LifecycleEventClaimed)}, time.Now())
		return "41", nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchLoop(ctx, "10", open, relist, func(typ watch.EventType, obj runtime.Object, at time.Time) { o.onEvent(typ, obj, at) })
	}()

	next := func() *watch.FakeWatcher {
		t.Helper()
		select {
		case w := <-watches:
			return w
		case <-time.After(5 * time.Second):
			t.Fatal("no watch opened within 5s")
			return nil
		}
	}
	w := next()
	w.Add(benchEvent("a-1", "11", ""))
	w.Modify(benchEvent("a-1", "12", v1alpha1.LifecycleEventClaimed))
	if _, err := o.Claimed(ctx, "a-1", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	w.Stop() // the server closed the watch; the observer re-watches from 12
	w = next()
	// 12 was compacted while the watch was closed: the server says so, as
	// an ERROR event.
	w.Error(&apierrors.NewResourceExpired("too old resource version: 12 (40)").ErrStatus)

	final, err := o.Gone(ctx, "a-1", 5*time.Second)
	if err != nil {
		t.Fatalf("the deletion that happened while the watch was closed is not seen: %v", err)
	}
	// Its end state was lost with the watch: the status last seen is
	// the claim, and the observer says it is not the end.
	if final != "Claimed: " || !o.GoneUnseen("a-1") {
		t.Fatalf("a-1 gone with last status %q, unseen %v; want \"Claimed: \", unseen", final, o.GoneUnseen("a-1"))
	}
	if _, err := o.Claimed(ctx, "a-2", 5*time.Second); err != nil {
		t.Fatalf("the event created while the watch was closed is not seen: %v", err)
	}
	// Then it watches on from the list, not from "now".
	w = next()
	w.Delete(benchEvent("a-2", "42", v1alpha1.LifecycleEventSucceeded))
	if final, err := o.Gone(ctx, "a-2", 5*time.Second); err != nil || final != "Succeeded: " || o.GoneUnseen("a-2") {
		t.Fatalf("a-2 gone: last status %q, unseen %v, err %v; want \"Succeeded: \", seen by the watch", final, o.GoneUnseen("a-2"), err)
	}
	cancel()
	w.Stop() // a real watch ends with ctx
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch loop did not end with its context")
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"10", "12", "41", "41"}
	if len(opened) != len(want) {
		t.Fatalf("watches opened from %q, want %q", opened, want)
	}
	for i := range want {
		if opened[i] != want[i] {
			t.Fatalf("watches opened from %q, want %q", opened, want)
		}
	}
	if relists != 2 {
		t.Errorf("relisted %d times, want 2 (after the ERROR event, after the refused watch)", relists)
	}
}

// TestEndFromEvents: an event whose end state the observer's watch missed
// ends as its agent's outcome Event says, and the Events that are not an
// outcome (a step's failure, a take-over) say nothing about it.
func TestEndFromEvents(t *testing.T) {
	ev := func(typ, reason, msg string) corev1.Event {
		return corev1.Event{Type: typ, Reason: reason, Message: msg, Source: corev1.EventSource{Component: "lifecycle-agent"}}
	}
	for _, c := range []struct {
		name string
		evs  []corev1.Event
		want string
		ok   bool
	}{
		{"none yet", nil, "", false},
		{"not an outcome", []corev1.Event{ev("Normal", "TakenOver", "t"), ev("Warning", "StepFailed", "s")}, "", false},
		{"someone else's", []corev1.Event{{Type: "Normal", Reason: "Uncordoned", Source: corev1.EventSource{Component: "kubectl"}}}, "", false},
		{"succeeded", []corev1.Event{ev("Warning", "StepFailed", "s"), ev("Normal", "Uncordoned", "done")}, "Succeeded: done", true},
		{"cancelled", []corev1.Event{ev("Normal", "Cancelled", "deleted")}, "Cancelled: deleted", true},
		{"failed", []corev1.Event{ev("Warning", "Failed", "step x")}, "Failed: step x", true},
		{"sla expired", []corev1.Event{ev("Warning", "SlaExpired", "late")}, "SlaExpired: late", true},
	} {
		got, ok := endFromEvents(c.evs)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: got %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
