package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
)

// A watch that runs behind the agent's own writes (a loaded API server, a
// slow link: at 1,000 agents it runs seconds behind) still shows an event
// the agent has just finished as the Pending object it was created as. The
// agent must not claim it again from that copy: the resourceVersion guard
// would refuse the claim (409), but only after the agent had taken the
// group's disruption slot and the node Lease for it — writes for nothing,
// and a slot Lease left held by an ended event. Here the agent's event
// watch reads each chunk 300 ms late; three uncordon events in a
// disruption group run one after the other.
func TestNoClaimFromAStaleWatch(t *testing.T) {
	const node = "stale-watch"
	newNode(t, node)
	rec := &lateWatch{delay: 300 * time.Millisecond}
	rc := env.NodeConfig(node)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec })
	startAgent(t, node, agentOpts{retention: time.Hour, rest: rc})
	waitTransition(t, transitionName(node, "uncordon"))
	lc := clients(t, env.AdminConfig())
	group := &v1alpha1.DisruptionBudget{Group: "stale-rack", MaxConcurrent: 1}
	for _, name := range []string{"stale-1", "stale-2", "stale-3"} {
		createEvent(t, name, node, transitionName(node, "uncordon"), nil, group)
		if ev := waitEvent(t, name, time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
			t.Fatalf("%s: %s %s", name, ev.Status.ClaimStatus, ev.Status.Message)
		}
		waitFor(t, name+"'s finalizer off", 30*time.Second, func() bool {
			ev, err := lc.Events.Get(context.Background(), name, metav1.GetOptions{})
			return err == nil && len(ev.Finalizers) == 0
		})
		// Long enough for the late watch to show the event's first
		// (Pending) copy after the end, and for a claim from it.
		time.Sleep(time.Second)
	}
	time.Sleep(2 * time.Second)
	for _, name := range []string{apiclient.NodeLeaseName(node), apiclient.SlotLeaseName(group.Group, 0)} {
		l, err := lc.Leases(v1alpha1.SystemNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("lease %s: %v", name, err)
		}
		if h := l.Spec.HolderIdentity; h != nil && *h != "" {
			t.Errorf("lease %s held at rest by %s for event %s, which ended", name, *h, l.Annotations[apiclient.AnnotationLeaseEvent])
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.conflicts > 0 {
		t.Errorf("%d of the agent's writes to LifecycleEvents refused with 409: a claim from a stale copy", rec.conflicts)
	}
	// Per event: the slot taken and released, the node Lease taken and
	// released; nothing more.
	if want := 3 * 4; rec.leaseWrites != want {
		t.Errorf("the agent wrote LifecycleLeases %d times for 3 events, want %d (take and release the slot and the node Lease, each)", rec.leaseWrites, want)
	}
}

// With eventRetention 0 a finished event is deleted as soon as it has
// ended, not when the agent's own watch shows it ended: behind a watch that
// runs seconds late (here each chunk read 4 s late: about 20 s behind by the
// end) the deletion would wait that long, and on a loaded server (the
// unfiltered 1,000-agent benchmark) for minutes. Asserted by order, not by
// time: the agent's DELETE goes out before its own watch has delivered the
// event's Succeeded (a loaded CI machine cannot make that flake; without
// the fix the DELETE followed it, 19.9 s after an on-time watch saw the end).
func TestRetentionZeroDeletesBeforeALateWatch(t *testing.T) {
	const node = "late-watch-delete"
	newNode(t, node)
	rc := env.NodeConfig(node)
	late := &lateWatch{delay: 4 * time.Second}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { late.next = rt; return late })
	startAgent(t, node, agentOpts{retention: 0, rest: rc})
	waitTransition(t, transitionName(node, "uncordon"))
	lc := clients(t, env.AdminConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := watchEventNamed(ctx, t, lc, "late-del")
	createEvent(t, "late-del", node, transitionName(node, "uncordon"), nil, nil)
	var ended, gone time.Time
	for ev := range w.ResultChan() {
		le, ok := ev.Object.(*v1alpha1.LifecycleEvent)
		if !ok {
			continue
		}
		if ended.IsZero() && le.Status.ClaimStatus == v1alpha1.LifecycleEventSucceeded {
			ended = time.Now()
		}
		if ev.Type == watch.Deleted {
			gone = time.Now()
			break
		}
	}
	late.mu.Lock()
	deleteSent, endSeen := late.deleteSent, late.endSeen
	late.mu.Unlock()
	switch {
	case gone.IsZero():
		t.Fatal("the finished event was not deleted within 2 minutes (eventRetention 0)")
	case ended.IsZero():
		t.Fatal("the event was deleted without ever showing Succeeded")
	case deleteSent.IsZero():
		t.Fatal("the event was deleted, but not by the agent")
	case !endSeen.IsZero() && !deleteSent.Before(endSeen):
		t.Errorf("the agent deleted the event %s after its own late watch showed it Succeeded (%s after an on-time watch did): it waited for its watch, where eventRetention 0 deletes at once",
			deleteSent.Sub(endSeen).Round(time.Millisecond), gone.Sub(ended).Round(time.Millisecond))
	}
	t.Logf("deleted %s after an on-time watch showed it Succeeded", gone.Sub(ended).Round(time.Millisecond))
}

// lateWatch delays every read of a LifecycleEvent watch's body and counts
// the agent's LifecycleLease writes and its 409s on LifecycleEvents; it
// notes when the agent first sent a DELETE of a LifecycleEvent and when
// its watch first delivered a Succeeded status.
type lateWatch struct {
	next  http.RoundTripper
	delay time.Duration

	mu          sync.Mutex
	leaseWrites int
	conflicts   int
	deleteSent  time.Time
	endSeen     time.Time
}

func (l *lateWatch) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodDelete && strings.Contains(req.URL.Path, "/lifecycleevents/") {
		l.mu.Lock() // as it goes out, before any watch can show its effect
		if l.deleteSent.IsZero() {
			l.deleteSent = time.Now()
		}
		l.mu.Unlock()
	}
	resp, err := l.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	p := req.URL.Path
	l.mu.Lock()
	if strings.Contains(p, "/lifecycleleases") && req.Method != http.MethodGet {
		l.leaseWrites++
	}
	if strings.Contains(p, "/lifecycleevents") && resp.StatusCode == http.StatusConflict {
		l.conflicts++
	}
	l.mu.Unlock()
	if req.URL.Query().Get("watch") == "true" && strings.Contains(p, "/lifecycleevents") {
		resp.Body = &lateBody{ReadCloser: resp.Body, delay: l.delay, l: l}
	}
	return resp, nil
}

type lateBody struct {
	io.ReadCloser
	delay time.Duration
	l     *lateWatch
	tail  []byte // the end of the last read, for a status split across two
}

// succeeded is how a Succeeded status reads in a watch event's JSON.
var succeeded = []byte(`"claimStatus":"` + string(v1alpha1.LifecycleEventSucceeded) + `"`)

func (b *lateBody) Read(p []byte) (int, error) {
	time.Sleep(b.delay)
	n, err := b.ReadCloser.Read(p)
	b.tail = append(b.tail, p[:n]...)
	if bytes.Contains(b.tail, succeeded) {
		b.l.mu.Lock()
		if b.l.endSeen.IsZero() {
			b.l.endSeen = time.Now()
		}
		b.l.mu.Unlock()
	}
	if len(b.tail) > len(succeeded) {
		b.tail = slices.Clone(b.tail[len(b.tail)-len(succeeded):])
	}
	return n, err
}
