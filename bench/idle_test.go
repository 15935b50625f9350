package bench

import (
	"testing"
	"time"
)

func TestSummarizeMem(t *testing.T) {
	const mb = 1 << 20
	w := SummarizeMem([]int64{16 * mb, 17 * mb, 33 * mb, 31 * mb, 16 * mb}, time.Second, 30*mb)
	if w.Samples != 5 || w.Mean != (16+17+33+31+16)*mb/5 || w.P50 != 17*mb || w.Max != 33*mb || w.SecondsAbove != 2 {
		t.Errorf("SummarizeMem = %+v; want 5 samples, mean 22.6 MiB, median 17, max 33, 2 s above 30 MiB", w)
	}
	if w := SummarizeMem(nil, time.Second, 30*mb); w.Samples != 0 || w.Max != 0 {
		t.Errorf("SummarizeMem(nil) = %+v; want zeros", w)
	}
}

// The settled summary starts past the agent's trim, a minute after
// READY=1 (plus 10 s), whatever the warm-up: with the default 30 s
// warm-up that is 40 s into the window; a warm-up past it skips nothing.
func TestSettledAfter(t *testing.T) {
	samples := make([]int64, 241) // 4 minutes, one a second from 0 s
	for i := range samples {
		samples[i] = int64(i)
	}
	if rest, skip := settledSamples(samples, time.Second, 30*time.Second); skip != 40 || len(rest) != 201 || rest[0] != 40 {
		t.Errorf("settledSamples(30 s warm-up) skipped %d, %d left; want 40 skipped, 201 left from the sample at 40 s", skip, len(rest))
	}
	if _, skip := settledSamples(samples, time.Second, 30*time.Second+500*time.Millisecond); skip != 40 {
		t.Errorf("settledSamples(30.5 s warm-up) skipped %d; want 40 (39.5 s rounded up)", skip)
	}
	if rest, _ := settledSamples(samples, time.Second, 2*time.Minute); rest != nil {
		t.Errorf("settledSamples(2 min warm-up) = %d samples; want none (nothing to skip: the window's own summary)", len(rest))
	}
	if rest, _ := settledSamples(samples[:30], time.Second, 30*time.Second); rest != nil {
		t.Errorf("settledSamples(30 samples) = %d samples; want none (the window ends before the trim)", len(rest))
	}
	for _, c := range []struct{ warm, want time.Duration }{
		{30 * time.Second, 40 * time.Second},
		{0, 70 * time.Second},
		{2 * time.Minute, 0},
	} {
		if got := SettledAfter(c.warm); got != c.want {
			t.Errorf("SettledAfter(%s) = %s; want %s", c.warm, got, c.want)
		}
	}
}
