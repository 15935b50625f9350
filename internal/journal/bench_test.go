package journal

import (
	"context"
	"slices"
	"testing"
	"time"
)

// BenchmarkAppendStepIntent measures one durable commit of a step intent,
// the write the engine waits for before every action. It also reports the
// commit latency percentiles seen by Options.ObserveCommit.
func BenchmarkAppendStepIntent(b *testing.B) {
	var lat []time.Duration
	opts := Options{ObserveCommit: func(d time.Duration) { lat = append(lat, d) }}
	j, _, err := Open(context.Background(), journalPath(b), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	mustPutEvent(b, j, testEvent("uid-bench"))
	rec := StepRecord{Step: "evict", Phase: PhaseIntent, State: StepRunning, Attempt: 1, BootID: "0b8d5a36-3c1e-4bbd-8f0e-4e2c2f3b9c1d"}
	lat = lat[:0]
	for b.Loop() {
		if _, err := j.AppendStep("uid-bench", rec); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if len(lat) > 0 {
		slices.Sort(lat)
		pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
		b.ReportMetric(pct(0.50), "p50-µs")
		b.ReportMetric(pct(0.99), "p99-µs")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
	}
}
