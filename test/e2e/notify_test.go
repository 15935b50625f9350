package e2e

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// receiver is a local webhook: /ok takes every message (when accepting),
// /hung never answers until the test ends.
type receiver struct {
	*httptest.Server
	mu        sync.Mutex
	accepting bool
	got       []string // the messages /ok took (status 200)
	refused   int      // the messages /ok answered 500
	hung      int      // requests to /hung
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{accepting: true}
	release := make(chan struct{})
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		switch {
		case req.URL.Path == "/hung":
			r.hung++
			r.mu.Unlock()
			<-release
			return
		case !r.accepting:
			r.refused++
			r.mu.Unlock()
			http.Error(w, "down for maintenance", http.StatusInternalServerError)
			return
		}
		r.got = append(r.got, string(b))
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	t.Cleanup(func() { close(release) }) // before Close, which waits for the handlers
	return r
}

func (r *receiver) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func (r *receiver) accept(on bool) {
	r.mu.Lock()
	r.accepting = on
	r.mu.Unlock()
}

// waitMessages waits until the receiver took exactly the messages that
// start with want, in this order, and no other.
func (r *receiver) waitMessages(t *testing.T, want ...string) {
	t.Helper()
	match := func(got []string) bool {
		if len(got) != len(want) {
			return false
		}
		for i := range want {
			if !strings.HasPrefix(got[i], want[i]) {
				return false
			}
		}
		return true
	}
	waitFor(t, "the messages "+strings.Join(want, " | "), time.Minute, func() bool { return match(r.messages()) })
	time.Sleep(2 * time.Second) // no message more arrives (a duplicate would)
	if got := r.messages(); !match(got) {
		t.Fatalf("the receiver took\n  %s\nwant exactly\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// brokenDriver's one step fails.
type brokenDriver struct{}

func (brokenDriver) Name() string       { return "e2e.lifecycle-agent.x-k8s.io/broken" }
func (brokenDriver) Short() string      { return "broken" }
func (brokenDriver) Start() string      { return "BrokenStarted" }
func (brokenDriver) End() string        { return "BrokenComplete" }
func (brokenDriver) SLA() time.Duration { return 10 * time.Minute }
func (brokenDriver) Plan(map[string]string) ([]drivers.Step, error) {
	return []drivers.Step{{Name: "break", Run: func(context.Context, drivers.Runtime) error {
		return errors.New("no firmware for this board")
	}}}, nil
}

// Notifications (issue 15.5) through the agent's wiring to a local
// webhook, shoutrrr's generic service: a claim and an end state each send
// one message; a failed step sends its failure; a target that never
// answers, with a timeout of an hour, delays no event (sends are
// asynchronous); a message the receiver refused while the agent ran is
// kept in the journal and delivered after a restart, once, and only to the
// target that had not taken it.
func TestNotifications(t *testing.T) {
	node := "notify-node"
	newNode(t, node)
	rx := newReceiver(t)
	dir := t.TempDir()
	configure := func(c *config.Config) {
		c.Exec.Drivers = []config.ExecDriver{
			{Name: "flash", Start: "FlashStarted", End: "FlashComplete",
				Steps: []config.ExecStep{{Name: "flash", Command: []string{"/bin/true"}, Timeout: time.Minute}}},
		}
		c.Notifications.URLs = []string{"generic+" + rx.URL + "/ok", "generic+" + rx.URL + "/hung"}
		c.Notifications.Timeout = time.Hour
	}
	broken := []drivers.Driver{brokenDriver{}}
	a := startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, configure: configure, extra: broken})
	waitTransition(t, transitionName(node, "flash"))
	waitTransition(t, transitionName(node, "broken"))

	createEvent(t, "told", node, transitionName(node, "flash"), nil, nil)
	if ev := waitEvent(t, "told", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("told: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	rx.waitMessages(t,
		"node notify-node: event told claimed (flash, transition notify-node-flash: FlashStarted → FlashComplete)",
		"node notify-node: event told Succeeded: ")

	createEvent(t, "failing", node, transitionName(node, "broken"), nil, nil)
	if ev := waitEvent(t, "failing", 2*time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventFailed {
		t.Fatalf("failing: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	rx.waitMessages(t,
		"node notify-node: event told claimed", "node notify-node: event told Succeeded: ",
		"node notify-node: event failing claimed (broken, ",
		"node notify-node: event failing: step break ",
		"node notify-node: event failing Failed: ")
	if got := rx.messages()[3]; !strings.Contains(got, "step break failed: no firmware for this board") {
		t.Errorf("the step failure's message does not carry the step's stderr: %q", got)
	}

	// The receiver refuses; an event runs and ends; the agent stops with
	// its messages undelivered.
	rx.accept(false)
	createEvent(t, "later", node, transitionName(node, "flash"), nil, nil)
	if ev := waitEvent(t, "later", time.Minute); ev.Status.ClaimStatus != v1alpha1.LifecycleEventSucceeded {
		t.Fatalf("later: %s %q", ev.Status.ClaimStatus, ev.Status.Message)
	}
	waitFor(t, "a refused send", time.Minute, func() bool { rx.mu.Lock(); defer rx.mu.Unlock(); return rx.refused > 0 })
	a.stop(t)
	j, _, err := journal.Open(context.Background(), a.Journal, journal.Options{CheckCommand: checkCommand()})
	if err != nil {
		t.Fatal(err)
	}
	pending, err := j.Notices()
	_ = j.Close()
	if err != nil {
		t.Fatal(err)
	}
	var later []string
	for _, n := range pending {
		if n.Event == "later" {
			later = append(later, n.Kind.String())
		}
	}
	if !slices.Equal(later, []string{"Claimed", "Ended"}) {
		t.Fatalf("the journal's notices of later after the stop: %v", later)
	}

	rx.accept(true)
	startAgent(t, node, agentOpts{retention: time.Hour, dir: dir, configure: configure, extra: broken})
	rx.waitMessages(t,
		"node notify-node: event told claimed", "node notify-node: event told Succeeded: ",
		"node notify-node: event failing claimed (broken, ", "node notify-node: event failing: step break ",
		"node notify-node: event failing Failed: ",
		"node notify-node: event later claimed (flash, ", "node notify-node: event later Succeeded: ")
	rx.mu.Lock()
	hung := rx.hung
	rx.mu.Unlock()
	if hung == 0 {
		t.Errorf("the hung target was never tried")
	}
}
