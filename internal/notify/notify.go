package notify

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nicholas-fedor/shoutrrr/pkg/router"
	"github.com/nicholas-fedor/shoutrrr/pkg/types"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// MaxAge is how long a notice is retried before it is given up.
const MaxAge = 24 * time.Hour

// Target is one configured notification URL.
type Target struct {
	ID      string // TargetID of the URL: stable across restarts, no secret in it
	Service string // the shoutrrr service (slack, teams, generic, ...)
	svc     types.Service
	raw     string      // the URL, for redact only: never logged
	busy    atomic.Bool // a send that outlived the timeout has not returned yet
}

// String names t in logs and messages: its service and ID, never its URL.
func (t *Target) String() string { return t.Service + " " + t.ID }

// TargetID names a notification URL without revealing it: the first 12 hex
// digits of its SHA-256.
func TargetID(rawURL string) string {
	sum := sha256.Sum256([]byte(rawURL))
	return hex.EncodeToString(sum[:6])
}

// Parse makes a Target of each URL. An error names the URL by its place in
// the list and its service, never by its text (URLs carry tokens).
func Parse(urls []string) ([]*Target, error) {
	var out []*Target
	for i, raw := range urls {
		t, err := parseOne(raw)
		if err != nil {
			return nil, fmt.Errorf("URL #%d: %w", i+1, err)
		}
		out = append(out, t)
	}
	return out, nil
}

func parseOne(raw string) (*Target, error) {
	var r router.ServiceRouter
	scheme, u, err := r.ExtractServiceName(raw)
	if err != nil || u.Scheme == "" {
		return nil, errors.New("not a URL (want service://..., e.g. slack://..., teams://..., generic+https://host/path)")
	}
	svc, err := r.NewService(scheme)
	if err != nil {
		services := r.ListServices()
		slices.Sort(services)
		return nil, fmt.Errorf("unknown notification service %q (the services are shoutrrr's: %s)", scheme, strings.Join(services, ", "))
	}
	if u.Scheme != scheme {
		cs, ok := svc.(types.CustomURLService)
		if !ok {
			return nil, fmt.Errorf("%s: the service takes no %q URL", scheme, u.Scheme)
		}
		if u, err = cs.GetConfigURLFromCustom(u); err != nil {
			return nil, fmt.Errorf("%s: %s", scheme, redact(err.Error(), raw))
		}
	}
	if err := svc.Initialize(u, nil); err != nil {
		return nil, fmt.Errorf("%s: %s", scheme, redact(err.Error(), raw))
	}
	return &Target{ID: TargetID(raw), Service: scheme, svc: svc, raw: raw}, nil
}

// redact removes from msg what of rawURL may be a secret: the user
// information, path segments, query values and fragment, and a host that
// is not a DNS name or address (some services keep a token there).
func redact(msg, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(details withheld: the URL does not parse)"
	}
	var secrets []string
	if u.User != nil {
		secrets = append(secrets, u.User.Username())
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p)
		}
	}
	if h := u.Hostname(); h != "" && !strings.Contains(h, ".") && !strings.Contains(h, ":") && h != "localhost" {
		secrets = append(secrets, h)
	}
	secrets = append(secrets, strings.Split(u.Path, "/")...)
	for _, vs := range u.Query() {
		secrets = append(secrets, vs...)
	}
	secrets = append(secrets, u.Fragment)
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "***")
			msg = strings.ReplaceAll(msg, url.PathEscape(s), "***")
		}
	}
	return msg
}

// Metrics are the notifier's.
type Metrics struct {
	Sent    *prometheus.CounterVec // by service: a target took a notice
	Failed  *prometheus.CounterVec // by service: a send failed (retried)
	Dropped prometheus.Counter     // notices given up after MaxAge
	Pending prometheus.Gauge       // notices not yet delivered to every target
}

// NewMetrics creates the metrics and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifecycle_agent_notifications_sent_total",
			Help: "Notices a notification target took, by service."}, []string{"service"}),
		Failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifecycle_agent_notifications_failed_total",
			Help: "Sends of a notice that failed (each is retried until it is 24 h old), by service."}, []string{"service"}),
		Dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "lifecycle_agent_notifications_dropped_total",
			Help: "Notices given up: not delivered to every target within 24 h."}),
		Pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifecycle_agent_notifications_pending",
			Help: "Notices in the journal not yet delivered to every target."}),
	}
	if reg != nil {
		reg.MustRegister(m.Sent, m.Failed, m.Dropped, m.Pending)
	}
	return m
}

// Notifier delivers the journal's notices to the targets: one worker per
// target, so a target that is down or hangs delays no other.
type Notifier struct {
	Journal *journal.Journal
	Targets []*Target
	// Timeout is the longest one send may take before it counts as failed.
	Timeout time.Duration
	Log     *slog.Logger
	Clock   clock.Clock
	Metrics *Metrics

	once    sync.Once
	workers []*worker
	ids     []string       // every target's ID: a notice is done when all took it
	running sync.WaitGroup // sends still in flight (tests wait on it)
}

// worker delivers to one target, in the order the notices were queued: a
// failed send holds the notices after it (a "done" never arrives before
// its "claimed") until the back-off ends.
type worker struct {
	t       *Target
	wake    chan struct{}
	fails   int       // consecutive failed sends
	retryAt time.Time // after a failed send: nothing before
}

func (n *Notifier) init() {
	n.once.Do(func() {
		if n.Clock == nil {
			n.Clock = clock.RealClock{}
		}
		if n.Log == nil {
			n.Log = slog.New(slog.DiscardHandler)
		}
		if n.Metrics == nil {
			n.Metrics = NewMetrics(nil)
		}
		if n.Timeout <= 0 {
			n.Timeout = 10 * time.Second
		}
		for _, t := range n.Targets {
			n.workers = append(n.workers, &worker{t: t, wake: make(chan struct{}, 1)})
			n.ids = append(n.ids, t.ID)
		}
	})
}

// Wake makes every worker look at the journal now. It never blocks.
func (n *Notifier) Wake() {
	n.init()
	for _, w := range n.workers {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Run delivers notices until ctx ends. It returns as soon as ctx ends,
// leaving a send in flight to finish on its own (its result is dropped and
// the notice is sent to that target again at the next start: a target may
// get a message twice, never none).
func (n *Notifier) Run(ctx context.Context) {
	n.init()
	var wg sync.WaitGroup
	for _, w := range n.workers {
		wg.Go(func() {
			for {
				wait := n.pass(ctx, w)
				select {
				case <-ctx.Done():
					return
				case <-w.wake:
				case <-n.Clock.After(wait):
				}
			}
		})
	}
	wg.Wait()
}

// pass sends w's target every notice it has not taken, oldest first, and
// returns how long to wait before the next pass.
func (n *Notifier) pass(ctx context.Context, w *worker) time.Duration {
	const idle = time.Minute
	if now := n.Clock.Now(); now.Before(w.retryAt) {
		return w.retryAt.Sub(now)
	}
	ns, err := n.Journal.Notices()
	if err != nil {
		n.Log.Error("notifications: reading the journal's notices", "err", err)
		return idle
	}
	n.Metrics.Pending.Set(float64(len(ns)))
	for _, nt := range ns {
		if ctx.Err() != nil {
			return idle
		}
		if nt.SentToAll(n.ids) { // e.g. a target removed from the config since
			n.done(nt, false)
			continue
		}
		if slices.Contains(nt.Sent, w.t.ID) {
			continue
		}
		if n.Clock.Now().Sub(nt.Created) > MaxAge {
			n.done(nt, true)
			continue
		}
		err := n.send(ctx, w.t, nt)
		if ctx.Err() != nil {
			return idle
		}
		if _, jerr := n.Journal.NoticeAttempted(nt.Seq, w.t.ID, err == nil, n.ids); jerr != nil {
			n.Log.Error("notifications: journaling a delivery", "event", nt.Event, "err", jerr)
		}
		if err != nil {
			w.fails++
			d := backoff(w.fails)
			w.retryAt = n.Clock.Now().Add(d)
			n.Metrics.Failed.WithLabelValues(w.t.Service).Inc()
			n.Log.Warn("notification failed; will retry", "service", w.t.Service, "target", w.t.ID,
				"event", nt.Event, "kind", nt.Kind.String(), "attempt", nt.Attempts+1, "retryIn", d, "err", err)
			return d
		}
		w.fails, w.retryAt = 0, time.Time{}
		n.Metrics.Sent.WithLabelValues(w.t.Service).Inc()
		n.Log.Info("notification sent", "service", w.t.Service, "target", w.t.ID, "event", nt.Event, "kind", nt.Kind.String())
	}
	return idle
}

// done deletes nt: every target took it, or (giveUp) it is too old.
func (n *Notifier) done(nt journal.Notice, giveUp bool) {
	deleted, err := n.Journal.NoticeDone(nt.Seq)
	if err != nil {
		n.Log.Error("notifications: removing a notice", "seq", nt.Seq, "err", err)
		return
	}
	if giveUp && deleted { // once, by whichever worker got there first
		n.Log.Error("notifications: giving up a notice not delivered within 24h", "event", nt.Event,
			"kind", nt.Kind.String(), "created", nt.Created, "attempts", nt.Attempts, "sentTo", nt.Sent)
		n.Metrics.Dropped.Inc()
	}
}

// backoff after attempt: 5 s, 10 s, 20 s ... at most 5 minutes.
func backoff(attempt int) time.Duration {
	return min(5*time.Second<<min(attempt-1, 6), 5*time.Minute)
}

// send sends one notice to one target, giving up after Timeout. A send
// that outlives it keeps the target busy (skipped) until it returns, so a
// target that hangs holds one goroutine, not one per attempt.
func (n *Notifier) send(ctx context.Context, t *Target, nt journal.Notice) error {
	if !t.busy.CompareAndSwap(false, true) {
		return errors.New("an earlier send to this target has not returned yet")
	}
	params := types.Params{}
	if nt.Title != "" {
		params.SetTitle(nt.Title)
	}
	res := make(chan error, 1)
	n.running.Add(1)
	go func() {
		defer n.running.Done()
		defer t.busy.Store(false)
		res <- t.svc.Send(nt.Text, &params)
	}()
	select {
	case err := <-res:
		if err != nil {
			return errors.New(redact(cutURLs(err.Error()), t.raw))
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.Clock.After(n.Timeout):
		return fmt.Errorf("no answer within %s", n.Timeout)
	}
}

// Test sends text to t now, within Timeout (doctor --notify-test). It
// needs no journal.
func (n *Notifier) Test(ctx context.Context, t *Target, title, text string) error {
	n.init()
	return n.send(ctx, t, journal.Notice{Title: title, Text: text})
}

// cutURLs replaces each http(s) URL in msg (a service's error names the
// endpoint it posted to, token and all) with "<url>".
func cutURLs(msg string) string {
	for _, scheme := range []string{"https://", "http://"} {
		for {
			i := strings.Index(msg, scheme)
			if i < 0 {
				break
			}
			j := strings.IndexAny(msg[i:], "\" ")
			if j < 0 {
				j = len(msg) - i
			}
			msg = msg[:i] + "<url>" + msg[i+j:]
		}
	}
	return msg
}
