package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The CI regression benchmarks (make bench-ci): claim latency against the
// real control plane and journal commits on the disk of $TMPDIR. They
// report percentiles as metrics and assert nothing about time; compare
// runs with benchstat. The full scenarios are cmd/lifecycle-bench (make
// bench).

func TestMain(m *testing.M) {
	// Agents re-execute this binary as the journal's integrity checker.
	if len(os.Args) > 1 && os.Args[1] == CheckFileArg {
		os.Exit(journal.RunCheck(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func reportPercentiles(b *testing.B, unit string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	d := Summarize(ds)
	b.ReportMetric(d.P50, "p50-"+unit)
	b.ReportMetric(d.P99, "p99-"+unit)
	b.ReportMetric(d.Max, "max-"+unit)
}

// BenchmarkClaimLatency is scenario 1 at CI size: one in-process agent,
// uncordon events one after the other; one op is one event, created →
// Succeeded and deleted. Metrics: claim-ms (created → Claimed seen by a
// watch) and cond-ms (created → Node condition names the event).
func BenchmarkClaimLatency(b *testing.B) {
	if testing.Short() {
		b.Skip("starts a control plane")
	}
	ctx := context.Background()
	r, err := NewClaimRig(ctx, nil, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	// Warm up connections and caches.
	for i := 0; i < 3; i++ {
		if _, _, _, err := r.Once(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var claims, conds []time.Duration
	before, err := r.Env.Scrape(ctx)
	if err != nil {
		b.Fatal(err)
	}
	ops := 0
	for b.Loop() {
		ops++
		c, n, _, err := r.Once(ctx)
		if err != nil {
			b.Fatal(err)
		}
		claims, conds = append(claims, c), append(conds, n)
		// Let the agent's client-side rate limiter refill (see ClaimOptions.Gap).
		b.StopTimer()
		time.Sleep(time.Second)
		b.StartTimer()
	}
	reportPercentiles(b, "claim-ms", claims)
	reportPercentiles(b, "cond-ms", conds)
	// What the agent (identity system:node:<name>) asked of the API server
	// per event: the server's own count, parsed from its /metrics.
	after, err := r.Env.Scrape(ctx)
	if err != nil {
		b.Fatal(err)
	}
	d := after.Sub(before)
	if d.NodeRequests() <= 0 || d.DurationCount["POST"] <= 0 {
		b.Fatalf("the API server's counters did not move over %d events: node requests %v, POST count %v", ops, d.NodeRequests(), d.DurationCount["POST"])
	}
	b.ReportMetric(d.NodeRequests()/float64(ops), "node-requests/op")
}

// BenchmarkJournalCommit is one durable journal commit (fdatasync included)
// per op, cycling through the commits the engine makes for a drain event,
// in order. Metrics are the commit latencies ObserveCommit saw.
func BenchmarkJournalCommit(b *testing.B) {
	var lat []time.Duration
	j, _, err := journal.Open(context.Background(), b.TempDir()+"/journal.db", journal.Options{
		ObserveCommit: func(d time.Duration) { lat = append(lat, d) }})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	script := drainScript(j)
	i, ev := 0, 0
	lat = lat[:0]
	for b.Loop() {
		if i == 0 {
			ev++
		}
		if err := script[i](fmt.Sprintf("00000000-0000-4000-8000-%012d", ev)); err != nil {
			b.Fatal(err)
		}
		i = (i + 1) % len(script)
	}
	b.StopTimer()
	slices.Sort(lat)
	us := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	if len(lat) > 0 {
		b.ReportMetric(us(0.50), "p50-µs")
		b.ReportMetric(us(0.99), "p99-µs")
	}
}

// drainScript is the ordered list of commits of one drain event (see
// JournalEvents), each a function of the event's UID.
func drainScript(j *journal.Journal) []func(uid string) error {
	status := []byte(`{"claimStatus":"Claimed","steps":[{"name":"cordon","state":"Running"}]}`)
	var seq uint64
	put := func(st journal.EventState) func(string) error {
		return func(uid string) error {
			return j.PutEvent(journal.EventRecord{UID: uid, Name: "ev-" + uid, Driver: "lifecycle-agent.x-k8s.io/drain", ResourceVersion: "1",
				State: st, Object: []byte(`{"metadata":{"name":"ev"}}`), Attrs: map[string]string{"transition": "n-drain"}})
		}
	}
	push := func(uid string) error {
		var err error
		seq, err = j.OutboxPush(journal.OutboxEntry{UID: uid, Kind: journal.OutboxEventStatus, Payload: status})
		return err
	}
	ack := func(string) error { return j.OutboxAck(seq) }
	step := func(name string, ph journal.StepPhase, st journal.StepState) func(string) error {
		return func(uid string) error {
			_, err := j.AppendStep(uid, journal.StepRecord{Step: name, Phase: ph, State: st, Attempt: 1, BootID: "b"})
			return err
		}
	}
	s := []func(string) error{put(journal.EventClaimed), push, ack, put(journal.EventRunning)}
	for _, n := range []string{"cordon", "evict", "wait-empty"} {
		s = append(s, step(n, journal.PhaseIntent, journal.StepRunning), push, ack, step(n, journal.PhaseDone, journal.StepDone), push, ack)
	}
	return append(s, put(journal.EventFinishing), push, ack,
		func(uid string) error { return j.FinishEvent(uid, journal.OutcomeSucceeded, "done") })
}
