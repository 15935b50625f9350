package bench

import (
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

// TestMergeTable: a partial run replaces its own rows and notes and keeps
// every other row, note and the earlier machine line.
func TestMergeTable(t *testing.T) {
	const hdr = "| # | benchmark | goal | measured | goal met | command | run |\n|---|---|---|---|---|---|---|\n"
	old := hdr + "| 1a | claim | p99 ≤ 50 ms | p99 56 ms | missed | `c` | 2026-11-30 15:23Z, 3m54s |\n" +
		"| 6 | drain | ≤ 1.0 | ratio 1.02 | missed | `d` | 2026-11-30 15:28Z, 3m13s |\n" +
		"| 8a | journal | — | p99 1.2 ms | n/a | `j` | 2026-11-30 15:15Z, 24s |\n" +
		"\nMachine: 2× AMD EPYC, 23.5 GiB, Linux 6.1, go1.26.7. Load average at the start of each run is in its JSON result.\n" +
		"\nNotes from `claim` (load average at start 0.5):\n- claim note\n" +
		"\nNotes from `drain` (load average at start 0.6):\n- old drain note\n"
	next := hdr + "| 6 | drain | ≤ 0.5 | ratio 0.81 | missed | `d` | 2026-12-04 02:47Z, 2m54s |\n" +
		"\nMachine: 2× AMD EPYC, 23.5 GiB, Linux 6.18, go1.26.8. Load average at the start of each run is in its JSON result.\n" +
		"\nNotes from `drain` (load average at start 1.9):\n- new drain note\n"
	got := MergeTable(old, next)
	for _, want := range []string{"| 1a | claim", "| 6 | drain | ≤ 0.5 | ratio 0.81", "| 8a | journal", "- claim note", "- new drain note", "Linux 6.18", "Earlier rows: 2× AMD EPYC, 23.5 GiB, Linux 6.1"} {
		if !strings.Contains(got, want) {
			t.Errorf("merged table lacks %q:\n%s", want, got)
		}
	}
	for _, gone := range []string{"ratio 1.02", "old drain note"} {
		if strings.Contains(got, gone) {
			t.Errorf("merged table still has %q:\n%s", gone, got)
		}
	}
	if i, j, k := strings.Index(got, "| 1a"), strings.Index(got, "| 6 "), strings.Index(got, "| 8a"); !(i < j && j < k) {
		t.Errorf("rows out of order:\n%s", got)
	}
	// Merged again with the same partial run: the earlier machine is named
	// once, not once more per merge.
	again := MergeTable(got, next)
	if n := strings.Count(again, "Earlier rows"); n != 1 || strings.Count(again, "Linux 6.1,") != 1 {
		t.Errorf("merged twice: the machine line repeats (%d× \"Earlier rows\"):\n%s", n, again)
	}
	// A full run keeps no earlier row, so no earlier machine either.
	full := hdr + "| 1a | claim | p99 ≤ 25 ms | p99 40 ms | missed | `c` | 2026-12-06 14:00Z, 3m50s |\n" +
		"| 6 | drain | ≤ 0.5 | ratio 0.37 | met | `d` | 2026-12-06 14:20Z, 2m17s |\n" +
		"| 8a | journal | — | p99 1.1 ms | n/a | `j` | 2026-12-06 14:30Z, 24s |\n" +
		"\nMachine: 2× AMD EPYC, 23.5 GiB, Linux 6.18, go1.26.8. Load average at the start of each run is in its JSON result.\n"
	if all := MergeTable(again, full); strings.Contains(all, "Earlier rows") || strings.Contains(all, "Linux 6.1,") {
		t.Errorf("a full run's table still names the earlier machine:\n%s", all)
	}
}

// TestReadProcPSS: this process's PSS is read from smaps_rollup, split
// into its anonymous and file-backed parts, and no larger than its RSS.
func TestReadProcPSS(t *testing.T) {
	s, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.Pss <= 0 || s.PssAnon <= 0 || s.PssAnon+s.PssFile > s.Pss+4096 || s.Pss > s.RSS {
		t.Fatalf("RSS %d, PSS %d (anon %d, file %d): want 0 < PSS ≤ RSS, parts summing to PSS", s.RSS, s.Pss, s.PssAnon, s.PssFile)
	}
}

// TestBuildCommit: the run column names the commit the benchmark was built
// from, marked dirty when the tree was, and nothing without a VCS stamp.
func TestBuildCommit(t *testing.T) {
	stamp := func(kv ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{}
		for i := 0; i+1 < len(kv); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return bi
	}
	for _, c := range []struct {
		bi   *debug.BuildInfo
		want string
	}{
		{stamp("vcs.revision", "b0073a4c1d2e3f", "vcs.modified", "false"), "b0073a4"},
		{stamp("vcs.revision", "b0073a4c1d2e3f", "vcs.modified", "true"), "b0073a4-dirty"},
		{stamp("-tags", "x"), ""},
		{nil, ""},
	} {
		if got := BuildCommit(c.bi); got != c.want {
			t.Errorf("BuildCommit(%v) = %q, want %q", c.bi, got, c.want)
		}
	}
	dir := t.TempDir()
	r := &Result{Scenario: "claim", Command: "c", Commit: "b0073a4", Rows: []Row{{ID: "1a", What: "w", Goal: "g", Measured: "m", Met: "met"}}}
	if _, err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	table, err := RenderTable(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table, ", b0073a4 |") {
		t.Errorf("the run column does not name the commit:\n%s", table)
	}
}

// TestCommitOf: Go's VCS stamp wins; without one (a git worktree), the
// commit the build script named.
func TestCommitOf(t *testing.T) {
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "be87208aaaa"}, {Key: "vcs.modified", Value: "false"}}}
	if got := CommitOf(stamped, "1234567"); got != "be87208" {
		t.Errorf("stamped build: %q, want be87208", got)
	}
	if got := CommitOf(&debug.BuildInfo{}, "be87208"); got != "be87208" {
		t.Errorf("unstamped build with a named commit: %q, want be87208", got)
	}
	if got := CommitOf(nil, ""); got != "" {
		t.Errorf("nothing known: %q, want empty", got)
	}
}

// TestScalePerEvent: the per-event figures of a scale run take the API
// server's idle rate off its busy-window CPU and divide by the events.
func TestScalePerEvent(t *testing.T) {
	st := ScaleStats{
		Idle: Window{Seconds: 30, APIServerCPUSeconds: 3}, // 0.1 CPU-s a second idle
		Events: Window{Seconds: 20, APIServerCPUSeconds: 22, // 2 of them idle
			Received: map[string]float64{"lifecycleevents": 1200, "nodes": 400},
			Watches:  map[string]float64{"lifecycleevents": 6000}},
	}
	st.perEvent(200)
	if st.CPUSecondsPerEvent != 0.1 || st.ChangesPerEvent != 6 || st.WatchesPerEvent != 30 {
		t.Errorf("per event: CPU %v (want 0.1), changes %v (want 6), watches %v (want 30)", st.CPUSecondsPerEvent, st.ChangesPerEvent, st.WatchesPerEvent)
	}
	none := ScaleStats{Events: Window{Seconds: 20, APIServerCPUSeconds: 22}}
	none.perEvent(0)
	if none.CPUSecondsPerEvent != 0 {
		t.Errorf("no events: CPU per event %v, want 0", none.CPUSecondsPerEvent)
	}
}
