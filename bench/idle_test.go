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
