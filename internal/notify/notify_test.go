package notify

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// receiver is a local HTTP endpoint that records what it is sent: the
// tests run shoutrrr's real services (generic webhook, Mattermost) against
// it, so what is asserted is what a real webhook would receive.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
	paths  []string
	status int           // answered while > 0 (0: 200)
	fails  int           // answer status this many times, then 200
	hang   chan struct{} // when set: hold each request until closed
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		hang, fail := r.hang, r.fails > 0
		if fail {
			r.fails--
		} else {
			r.bodies, r.paths = append(r.bodies, string(b)), append(r.paths, req.URL.Path)
		}
		r.mu.Unlock()
		if hang != nil {
			<-hang
		}
		if fail {
			w.WriteHeader(r.status)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

func (r *receiver) host() string { return strings.TrimPrefix(r.URL, "http://") }

func openJournal(t *testing.T, path string) *journal.Journal {
	t.Helper()
	j, _, err := journal.Open(context.Background(), path, journal.Options{
		Checker: func(_ context.Context, p string) error { return journal.CheckFile(p, time.Second) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

func push(t *testing.T, j *journal.Journal, kind journal.NoticeKind, text string) uint64 {
	t.Helper()
	seq, err := j.PushNotice(journal.Notice{UID: "uid-1", Event: "reboot-1", Kind: kind, Title: "lifecycle-agent: node n1", Text: text})
	if err != nil {
		t.Fatal(err)
	}
	return seq
}

func targets(t *testing.T, urls ...string) []*Target {
	t.Helper()
	ts, err := Parse(urls)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// passAll runs one pass of every target's worker, one after the other,
// and returns the shortest wait they asked for.
func passAll(n *Notifier) time.Duration {
	n.init()
	wait := time.Duration(1<<63 - 1)
	for _, w := range n.workers {
		wait = min(wait, n.pass(context.Background(), w))
	}
	return wait
}

func pending(t *testing.T, j *journal.Journal) []journal.Notice {
	t.Helper()
	ns, err := j.Notices()
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestDeliverToEveryService: each notice reaches a generic JSON webhook
// (title and message) and Mattermost's incoming-webhook API, in the order
// queued, and leaves the journal once both took it.
func TestDeliverToEveryService(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	hook, mm := newReceiver(t), newReceiver(t)
	n := &Notifier{Journal: j, Targets: targets(t,
		"generic+"+hook.URL+"/hook?template=json",
		"mattermost://"+mm.host()+"/token-abc123?disabletls=yes"),
		Metrics: NewMetrics(nil)}
	push(t, j, journal.NoticeClaimed, "node n1: event reboot-1 claimed")
	push(t, j, journal.NoticeEnded, "node n1: event reboot-1 Succeeded")
	passAll(n)

	got := hook.got()
	if len(got) != 2 {
		t.Fatalf("webhook got %d messages, want 2: %q", len(got), got)
	}
	for i, want := range []string{"claimed", "Succeeded"} {
		var m map[string]string
		if err := json.Unmarshal([]byte(got[i]), &m); err != nil {
			t.Fatalf("webhook body %q: %v", got[i], err)
		}
		if !strings.Contains(m["message"], want) || m["title"] != "lifecycle-agent: node n1" {
			t.Errorf("webhook message %d = %v; want title and %q", i, m, want)
		}
	}
	mmGot := mm.got()
	if len(mmGot) != 2 || !strings.Contains(mmGot[1], `"text":"node n1: event reboot-1 Succeeded"`) || mm.paths[0] != "/hooks/token-abc123" {
		t.Errorf("mattermost got %q at %q; want both messages at /hooks/token-abc123", mmGot, mm.paths)
	}
	if ns := pending(t, j); len(ns) != 0 {
		t.Errorf("journal still holds %d notices after delivery", len(ns))
	}
	if v := testutil.ToFloat64(n.Metrics.Sent.WithLabelValues("mattermost")); v != 2 {
		t.Errorf("sent{mattermost} = %v, want 2", v)
	}
}

// TestFailedTargetRetriedAlone: a target that answers 503 is retried on a
// back-off while the one that took the notice is not sent it again, and
// the journal records who has it (so a restart does not resend either).
func TestFailedTargetRetriedAlone(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	ok, flaky := newReceiver(t), newReceiver(t)
	flaky.status, flaky.fails = http.StatusServiceUnavailable, 2
	clk := clocktesting.NewFakeClock(time.Now())
	ts := targets(t, "generic+"+ok.URL+"/a", "generic+"+flaky.URL+"/b")
	n := &Notifier{Journal: j, Targets: ts, Clock: clk, Metrics: NewMetrics(nil)}
	n.init()
	push(t, j, journal.NoticeStepFailed, "node n1: event reboot-1: step drain failed")

	if wait := passAll(n); wait != 5*time.Second {
		t.Errorf("after the first failure the next pass is in %v, want 5s", wait)
	}
	ns := pending(t, j)
	if len(ns) != 1 || len(ns[0].Sent) != 1 || ns[0].Sent[0] != ts[0].ID || ns[0].Attempts != 2 {
		t.Fatalf("after one pass: %+v; want the notice held, sent to %s only, 2 attempts (one per target)", ns, ts[0].ID)
	}
	passAll(n) // not due yet: nothing sent
	if len(flaky.got())+len(ok.got()) != 1 {
		t.Fatalf("a pass before the back-off sent again")
	}
	clk.Step(5 * time.Second)
	passAll(n) // second 503
	clk.Step(10 * time.Second)
	passAll(n)
	if got := flaky.got(); len(got) != 1 || got[0] != "node n1: event reboot-1: step drain failed" {
		t.Errorf("flaky target got %q, want the message once", got)
	}
	if got := ok.got(); len(got) != 1 {
		t.Errorf("the target that took it first got it %d times, want 1", len(got))
	}
	if ns := pending(t, j); len(ns) != 0 {
		t.Errorf("journal still holds %+v", ns)
	}
	if v := testutil.ToFloat64(n.Metrics.Failed.WithLabelValues("generic")); v != 2 {
		t.Errorf("failed{generic} = %v, want 2", v)
	}
}

// TestHangingTargetBounded: a target that never answers fails after the
// timeout, does not stop the others, and holds one request at a time.
func TestHangingTargetBounded(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	hung, ok := newReceiver(t), newReceiver(t)
	release := make(chan struct{})
	hung.hang = release
	ts := targets(t, "generic+"+hung.URL+"/h", "generic+"+ok.URL+"/o")
	n := &Notifier{Journal: j, Targets: ts, Timeout: 200 * time.Millisecond, Metrics: NewMetrics(nil)}
	n.init()
	push(t, j, journal.NoticeClaimed, "one")
	push(t, j, journal.NoticeEnded, "two")
	passAll(n)
	if got := ok.got(); len(got) != 2 {
		t.Errorf("the answering target got %q, want both", got)
	}
	ns := pending(t, j)
	if len(ns) != 2 {
		t.Fatalf("want both notices held for the hung target, got %+v", ns)
	}
	if !ts[0].busy.Load() {
		t.Errorf("the hung target is not marked busy")
	}
	hung.mu.Lock()
	hung.hang = nil
	hung.mu.Unlock()
	close(release)
	n.running.Wait()
	if ts[0].busy.Load() {
		t.Errorf("busy after the hung send returned")
	}
}

// TestHungTargetDelaysNoOther: with a timeout of an hour, a target that
// never answers holds back no message to the others (each target has its
// worker), and Run still returns at once when stopped.
func TestHungTargetDelaysNoOther(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	hung, ok := newReceiver(t), newReceiver(t)
	release := make(chan struct{})
	hung.hang = release
	defer close(release) // before the receivers' Close, which waits for the handler
	n := &Notifier{Journal: j, Targets: targets(t, "generic+"+hung.URL+"/h", "generic+"+ok.URL+"/o"), Timeout: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	push(t, j, journal.NoticeClaimed, "one")
	push(t, j, journal.NoticeEnded, "two")
	n.Wake()
	deadline := time.Now().Add(10 * time.Second)
	for len(ok.got()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ok.got(); len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Errorf("while another target hangs, the answering one got %q, want [one two]", got)
	}
	if ns := pending(t, j); len(ns) != 2 {
		t.Errorf("want both notices held for the hung target, got %+v", ns)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its stop while a send hung")
	}
}

// TestNoticeSurvivesRestart: a notice queued but not sent (the agent
// stopped, the node rebooted) is sent by the next agent on the same journal.
func TestNoticeSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j := openJournal(t, path)
	push(t, j, journal.NoticeClaimed, "node n1: event reboot-1 claimed")
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	hook := newReceiver(t)
	j = openJournal(t, path)
	n := &Notifier{Journal: j, Targets: targets(t, "generic+"+hook.URL+"/x")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(hook.got()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if got := hook.got(); len(got) != 1 || got[0] != "node n1: event reboot-1 claimed" {
		t.Errorf("after the restart the webhook got %q", got)
	}
}

// TestGiveUpAfterMaxAge: a notice older than a day is dropped, counted and
// logged, not retried for ever.
func TestGiveUpAfterMaxAge(t *testing.T) {
	j := openJournal(t, filepath.Join(t.TempDir(), "journal.db"))
	clk := clocktesting.NewFakeClock(time.Now().Add(MaxAge + time.Minute))
	hook := newReceiver(t)
	n := &Notifier{Journal: j, Targets: targets(t, "generic+"+hook.URL+"/x"), Clock: clk, Metrics: NewMetrics(nil)}
	n.init()
	push(t, j, journal.NoticeClaimed, "stale")
	passAll(n)
	if len(hook.got()) != 0 || len(pending(t, j)) != 0 || testutil.ToFloat64(n.Metrics.Dropped) != 1 {
		t.Errorf("a day-old notice: sent %q, pending %d, dropped %v; want dropped unsent",
			hook.got(), len(pending(t, j)), testutil.ToFloat64(n.Metrics.Dropped))
	}
}

// TestParseRefusesWithoutTheSecret: a bad URL is refused naming its place
// and service, never its text.
func TestParseRefusesWithoutTheSecret(t *testing.T) {
	for _, tt := range []struct {
		urls []string
		want string
	}{
		{[]string{"generic+https://hooks.example/ok", "nosuchservice://s3cr3t-token@x"}, `URL #2: unknown notification service "nosuchservice"`},
		{[]string{"s3cr3t-token-no-scheme"}, "URL #1: not a URL"},
		{[]string{"slack://s3cr3t-token"}, "URL #1: slack: "},
		{[]string{"teams://s3cr3t-token@x"}, "URL #1: teams: "},
	} {
		_, err := Parse(tt.urls)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v; want an error containing %q", tt.urls, err, tt.want)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("Parse(%q) error shows the secret: %v", tt.urls, err)
		}
	}
	if ts, err := Parse([]string{
		"slack://hook:WNA3PBYV6-F20DUQND3RQ-Webc4MAvoacrpPakR8phF0zi@webhook",
		"teams://11111111-4444-4444-8444-cccccccccccc@22222222-4444-4444-8444-cccccccccccc/33333333012222222222333333333344/44444444-4444-4444-8444-cccccccccccc/V2ESyij_gAljSoUQHvZoZYzlpAoAXExyOl26dlf1xHEx05?host=contoso.webhook.office.com",
	}); err != nil || len(ts) != 2 {
		t.Errorf("valid Slack and Teams URLs: %v", err)
	}
}
