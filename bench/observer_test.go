package bench

import (
	"context"
	"sync"
	"testing"
	"time"

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
		gone: map[string]time.Time{}, final: map[string]string{}, steps: map[string]int{}}
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

	if _, err := o.Gone(ctx, "a-1", 5*time.Second); err != nil {
		t.Fatalf("the deletion that happened while the watch was closed is not seen: %v", err)
	}
	if _, err := o.Claimed(ctx, "a-2", 5*time.Second); err != nil {
		t.Fatalf("the event created while the watch was closed is not seen: %v", err)
	}
	// Then it watches on from the list, not from "now".
	w = next()
	w.Delete(benchEvent("a-2", "42", v1alpha1.LifecycleEventSucceeded))
	if _, err := o.Gone(ctx, "a-2", 5*time.Second); err != nil {
		t.Fatal(err)
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
