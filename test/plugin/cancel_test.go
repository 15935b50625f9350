package plugin

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// TestWaitCancelled: `kubectl lifecycle drain NODE` (which waits) on a
// drain held by a budget that never frees, then the event deleted: the
// command exits 5, cancelled — not 1, a failure nobody had — and
// `cancel --wait` says cancelled.
func TestWaitCancelled(t *testing.T) {
	const node = "cancel-wait-1"
	startNodes(t, node)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &testenv.Workload{Namespace: "cancel-wait", Name: "web", Node: node, Replicas: 1, MinAvailable: 1}
	if err := w.Start(ctx, env.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitPodsRunning(ctx, env.AdminConfig(), node, 1); err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() { done <- plugin(t, 2*time.Minute, "drain", node) }()
	name := ""
	deadline := time.Now().Add(60 * time.Second)
	for name == "" && time.Now().Before(deadline) {
		l, err := lc.Events.List(ctx, metav1.ListOptions{FieldSelector: "spec.bindingNode=" + node})
		if err == nil {
			for _, ev := range l.Items {
				if ev.Status.CurrentStep == "evict" && strings.Contains(ev.Status.Message, "disruption budget") {
					name = ev.Name
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if name == "" {
		t.Fatal("no drain event of the plugin held by the budget within 60 s")
	}
	r := plugin(t, time.Minute, "cancel", name, "--wait")
	wantExit(t, r, 0, "cancel --wait")
	wantContains(t, r.stdout, "lifecycleevent "+name+" cancelled (last status Claimed", "cancel --wait")
	select {
	case r = <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("drain did not return within 90 s of the cancel")
	}
	wantExit(t, r, 5, "drain of a cancelled event")
	wantContains(t, r.stderr, "was deleted before it ended (cancelled)", "drain of a cancelled event")
}
