package vm

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// Timings collects durations by name: image builds, boots, reboots, resets,
// power cycles and whole scenarios. The tests' TestMain prints Report.
var Timings = &recorder{}

type recorder struct {
	mu   sync.Mutex
	seq  []string
	data map[string][]time.Duration
}

// Record adds one measurement of what.
func (r *recorder) Record(what string, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.data == nil {
		r.data = map[string][]time.Duration{}
	}
	if _, ok := r.data[what]; !ok {
		r.seq = append(r.seq, what)
	}
	r.data[what] = append(r.data[what], d)
}

// Report writes one line per name: count, min, mean, max; scenarios first
// in the order they ran, then the VM operations.
func (r *recorder) Report(w io.Writer, total time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seq) == 0 {
		return
	}
	names := append([]string(nil), r.seq...)
	sort.SliceStable(names, func(i, j int) bool {
		return strings.HasPrefix(names[i], "Test") && !strings.HasPrefix(names[j], "Test")
	})
	fmt.Fprintf(w, "\n=== VM test timings (TCG) ===\n")
	for _, n := range names {
		ds := r.data[n]
		min, max, sum := ds[0], ds[0], time.Duration(0)
		for _, d := range ds {
			sum += d
			if d < min {
				min = d
			}
			if d > max {
				max = d
			}
		}
		if len(ds) == 1 {
			fmt.Fprintf(w, "  %-44s %8s\n", n, ds[0].Round(100*time.Millisecond))
			continue
		}
		fmt.Fprintf(w, "  %-44s %8s  (n=%d, min %s, max %s)\n", n, (sum / time.Duration(len(ds))).Round(100*time.Millisecond),
			len(ds), min.Round(100*time.Millisecond), max.Round(100*time.Millisecond))
	}
	fmt.Fprintf(w, "  %-44s %8s\n", "total (package)", total.Round(time.Second))
}

// Scenario records how long the calling test took; use as
// defer vm.Scenario(t)().
func Scenario(t interface{ Name() string }) func() {
	start := time.Now()
	return func() { Timings.Record(t.Name(), time.Since(start)) }
}
