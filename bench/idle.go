package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host/logindtest"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// IdleStats are Idle's measurements of the agent process over the window.
type IdleStats struct {
	Seconds float64 `json:"seconds"`
	RSS     int64   `json:"rssBytes"`     // at the end
	PeakRSS int64   `json:"peakRssBytes"` // sampled every second
	CPUPct  float64 `json:"cpuPct"`       // of one core, over the window
	// RequestsPerMin is the API server's count of requests by node
	// identities (APF flow schemas system-nodes and system-node-high): the
	// agent is the only one.
	RequestsPerMin float64 `json:"requestsPerMin"`
	// Verbs is apiserver_request_total's increase over the window by verb
	// (every client, the API server's own loopback requests included).
	Verbs  map[string]float64 `json:"verbs"`
	Warmup float64            `json:"warmupSeconds"`
	// RssAnon and RssFile split RSS at the end (anonymous memory; the
	// binary's mapped pages).
	RssAnon int64 `json:"rssAnonBytes"`
	RssFile int64 `json:"rssFileBytes"`
	// Pss is the proportional set size at the end, with its anonymous and
	// file-backed parts (/proc/<pid>/smaps_rollup).
	Pss     int64 `json:"pssBytes"`
	PssAnon int64 `json:"pssAnonBytes"`
	PssFile int64 `json:"pssFileBytes"`
	// Go runtime figures from the agent's own /metrics at the end.
	GoRuntime map[string]float64 `json:"goRuntime"`
	// BinaryBytes is the size of the agent binary.
	BinaryBytes int64 `json:"binaryBytes"`
	// Cgroup is the memory cgroup the agent ran in (its directory), empty
	// when none could be made: NoCgroup then says why, and the memory
	// figures are the process's only, not the service's.
	Cgroup   string `json:"cgroup,omitempty"`
	CgroupV2 bool   `json:"cgroupV2,omitempty"`
	NoCgroup string `json:"noCgroup,omitempty"`
	// CgroupReady and CgroupEnd are the cgroup's figures at READY=1 and at
	// the end of the window: what systemd reports as the service's memory
	// (memory.current on v2; memory.usage_in_bytes on v1).
	CgroupReady *CgroupMem `json:"cgroupReady,omitempty"`
	CgroupEnd   *CgroupMem `json:"cgroupEnd,omitempty"`
	// WarmCache: the binary's page cache was left as found (else it was
	// dropped before the start, as at boot). BinaryCachedBefore and
	// BinaryCachedAfter are its bytes in the page cache before and after
	// the drop (pages another process maps cannot be dropped), BinaryCached
	// at the end of the window.
	WarmCache          bool  `json:"warmCache"`
	BinaryCachedBefore int64 `json:"binaryCachedBeforeBytes"`
	BinaryCachedAfter  int64 `json:"binaryCachedAfterBytes"`
	BinaryCached       int64 `json:"binaryCachedBytes"`
	// ReadaheadKB is the read-ahead window of the binary's block device
	// (-1: unknown): how much each page fault reads into the cache.
	ReadaheadKB int64 `json:"readaheadKB"`
	// After the window: an uncordon event for the idle agent, which has
	// released its start-up pages (internal/agent/trim.go), and one more
	// right after it. FirstClaimMs and SecondClaimMs are each claim's
	// latency (create → Claimed seen by a watch), FirstTotalMs and
	// SecondTotalMs to Succeeded and deleted; CgroupAfterEvents is the
	// cgroup's memory after both (the events' code is resident again until
	// the next trim).
	// CgroupAfterScrape is the cgroup's memory a moment (scrapeSettle)
	// after the harness's one scrape of the agent's /metrics, at the end
	// of the window; CgroupAfterDrop 65 s later, after the agent's next
	// drop of its unmapped cache.
	// CgroupWindow is the cgroup's memory sampled every second over the
	// window: the end figure is one point of it. CgroupSettled is the
	// same from CgroupSettledAfter seconds into the window on
	// (SettledAfter: past the agent's trim, a minute after it turns idle,
	// at READY=1), and CgroupSamples the samples themselves, one a second
	// from the window's start.
	CgroupWindow       *MemWindow `json:"cgroupWindow,omitempty"`
	CgroupSettled      *MemWindow `json:"cgroupSettled,omitempty"`
	CgroupSettledAfter float64    `json:"cgroupSettledAfterSeconds,omitempty"`
	CgroupSamples      []int64    `json:"cgroupSamplesBytes,omitempty"`
	CgroupAfterScrape  *CgroupMem `json:"cgroupAfterScrape,omitempty"`
	CgroupAfterDrop    *CgroupMem `json:"cgroupAfterDrop,omitempty"`
	FirstClaimMs       float64    `json:"firstClaimAfterIdleMs"`
	FirstTotalMs       float64    `json:"firstTotalAfterIdleMs"`
	SecondClaimMs      float64    `json:"secondClaimMs"`
	SecondTotalMs      float64    `json:"secondTotalMs"`
	CgroupAfterEvents  *CgroupMem `json:"cgroupAfterEvents,omitempty"`
}

// Idle runs bin/lifecycle-agent (simulate mode, one node, the test logind
// on a private bus) against the test control plane, lets it settle for
// warmup after READY=1, then measures it for window: RSS and CPU from
// /proc/<pid>, requests from the API server's counters. The agent runs in
// a memory cgroup of its own where one can be made (NewMemCgroup), started
// with the binary's pages dropped from the page cache unless warmCache, so
// that the cgroup is charged for the pages the agent faults in, as a
// service started at boot is.
func Idle(ctx context.Context, dir, bin string, warmup, window time.Duration, warmCache bool, say func(string, ...any)) (IdleStats, error) {
	st := IdleStats{Warmup: warmup.Seconds(), WarmCache: warmCache}
	env, err := StartEnv(ctx, nil, false)
	if err != nil {
		return st, err
	}
	defer env.Stop()
	const node = "bench-idle"
	if err := testenv.CreateNode(ctx, env.AdminConfig(), node, nil); err != nil {
		return st, err
	}
	kc, err := env.WriteKubeconfigFor("node:" + node)
	if err != nil {
		return st, err
	}
	ldir, err := startLogindDir()
	if err != nil {
		return st, err
	}
	srv, err := logindtest.New(ldir, logindtest.Options{InhibitDelayMax: 30 * time.Second})
	if err != nil {
		return st, err
	}
	defer srv.Close()
	cg, err := NewMemCgroup(fmt.Sprintf("lifecycle-bench-idle-%d", os.Getpid()))
	if err != nil {
		st.NoCgroup = err.Error()
		say("idle: WARNING: %v; the memory figures will be the process's (RSS, PSS), not the service's as systemd accounts it", err)
	} else {
		st.Cgroup, st.CgroupV2 = cg.Dir, cg.V2
		defer func() { _ = cg.Remove() }()
	}
	if warmCache {
		st.BinaryCachedBefore, err = ResidentBytes(bin)
		st.BinaryCachedAfter = st.BinaryCachedBefore
	} else {
		st.BinaryCachedBefore, st.BinaryCachedAfter, err = DropPageCache(bin)
	}
	if err != nil {
		return st, err
	}
	st.ReadaheadKB = ReadaheadKB(bin)
	say("idle: %s of the binary's %s in the page cache at the start (%s before the drop); its device reads ahead %d KiB", mib(st.BinaryCachedAfter), mibFile(bin), mib(st.BinaryCachedBefore), st.ReadaheadKB)
	d, err := StartDaemon(DaemonOptions{Bin: bin, Dir: filepath.Join(dir, "agent"), Node: node, Kubeconfig: kc, Bus: srv.Address(), Cgroup: cg,
		Args: []string{"--event-retention", "0s"}}) // the events after the window are deleted when done
	if err != nil {
		return st, err
	}
	defer d.Stop()
	if _, err := d.WaitReady(60 * time.Second); err != nil {
		return st, err
	}
	if cg != nil {
		if m, err := cg.Read(); err == nil {
			st.CgroupReady = &m
		}
	}
	say("idle: agent pid %d ready; warming up %s, then measuring %s", d.Cmd.Process.Pid, warmup, window)
	if err := waitCtx(ctx, warmup); err != nil {
		return st, err
	}
	c0, err := env.Scrape(ctx)
	if err != nil {
		return st, err
	}
	smp, err := StartSampler(d.Cmd.Process.Pid, time.Second)
	if err != nil {
		return st, err
	}
	var cgs *memSampler
	if cg != nil {
		cgs = startMemSampler(cg, time.Second)
	}
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		left := time.Until(end)
		if err := waitCtx(ctx, min(left, time.Minute)); err != nil {
			smp.Stop()
			if cgs != nil {
				cgs.stop()
			}
			return st, err
		}
		if left > time.Minute {
			say("idle: %s left", (left - time.Minute).Round(time.Second))
		}
	}
	first, last, peak := smp.Stop()
	if cgs != nil {
		st.CgroupSamples = cgs.stop()
		w := SummarizeMem(st.CgroupSamples, time.Second, IdleMemGoal)
		st.CgroupWindow = &w
		if rest, skip := settledSamples(st.CgroupSamples, time.Second, warmup); rest != nil {
			w := SummarizeMem(rest, time.Second, IdleMemGoal)
			st.CgroupSettled, st.CgroupSettledAfter = &w, float64(skip)
		}
	}
	c1, err := env.Scrape(ctx)
	if err != nil {
		return st, err
	}
	delta := c1.Sub(c0)
	st.Seconds = last.At.Sub(first.At).Seconds()
	st.RSS, st.PeakRSS, st.CPUPct = last.RSS, peak, CPUPercent(first, last)
	st.RssAnon, st.RssFile = last.RssAnon, last.RssFile
	st.Pss, st.PssAnon, st.PssFile = last.Pss, last.PssAnon, last.PssFile
	// The service's figures are read before the harness scrapes the
	// agent's /metrics: the first scrape of an idle agent faults the
	// metrics code back in, with the read-ahead around it (8 MiB a fault
	// on this VM's disk), and charges it to the service until the agent's
	// next drop of its unmapped cache (internal/agent/trim.go). Read after
	// the scrape, the figure was the harness's probe, not the idle agent
	// (docs/benchmarks.md section 5); what the scrape costs is reported
	// apart (CgroupAfterScrape, CgroupAfterDrop).
	if cg != nil {
		m, err := cg.Read()
		if err != nil {
			return st, err
		}
		st.CgroupEnd = &m
	}
	st.BinaryCached, _ = ResidentBytes(bin)
	st.GoRuntime, _ = d.ScrapeGauges("go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes", "go_goroutines", "go_memstats_stack_inuse_bytes")
	if cg != nil {
		if err := waitCtx(ctx, scrapeSettle); err != nil {
			return st, err
		}
		if m, err := cg.Read(); err == nil {
			st.CgroupAfterScrape = &m
		}
		// The idle agent drops its unmapped cache within 5 s of a major
		// fault and a minute after its last drop in any case
		// (internal/agent/trim.go): 65 s covers either. The reading
		// scrapeSettle after the scrape may come after that first drop
		// (then it shows less than the scrape brought in).
		if err := waitCtx(ctx, 65*time.Second); err != nil {
			return st, err
		}
		if m, err := cg.Read(); err == nil {
			st.CgroupAfterDrop = &m
		}
	}
	if fi, err := os.Stat(bin); err == nil {
		st.BinaryBytes = fi.Size()
	}
	st.RequestsPerMin = delta.NodeRequests() / st.Seconds * 60
	st.Verbs = delta.Requests
	select {
	case <-d.exited:
		return st, fmt.Errorf("bench: the agent exited during the window:\n%s", d.Log.String())
	default:
	}
	// What the trim costs the next event: the first claim after the idle
	// window faults the claim's code back in.
	if err := env.WaitTransitions(ctx, node, "uncordon", 30*time.Second); err != nil {
		return st, err
	}
	obs, err := env.Observe(ctx, nil)
	if err != nil {
		return st, err
	}
	for i, out := range [][2]*float64{{&st.FirstClaimMs, &st.FirstTotalMs}, {&st.SecondClaimMs, &st.SecondTotalMs}} {
		name := fmt.Sprintf("after-idle-%d", i+1)
		t0 := time.Now()
		if err := env.CreateEvent(ctx, name, node, "uncordon", nil); err != nil {
			return st, err
		}
		tc, err := obs.Claimed(ctx, name, 30*time.Second)
		if err != nil {
			return st, err
		}
		final, err := obs.Gone(ctx, name, 60*time.Second)
		if err != nil {
			return st, err
		}
		if !strings.HasPrefix(final, "Succeeded") {
			return st, fmt.Errorf("bench: event %s ended %q", name, final)
		}
		*out[0], *out[1] = float64(tc.Sub(t0).Microseconds())/1000, float64(time.Since(t0).Microseconds())/1000
	}
	say("idle: after the window, the first claim took %.1f ms (to deleted %.1f ms), the next one %.1f ms (%.1f ms)", st.FirstClaimMs, st.FirstTotalMs, st.SecondClaimMs, st.SecondTotalMs)
	if cg != nil {
		if m, err := cg.Read(); err == nil {
			st.CgroupAfterEvents = &m
		}
	}
	return st, nil
}

// IdleMemGoal is the idle agent's memory goal as systemd accounts the
// service (row 5a; docs/benchmarks.md section 5).
const IdleMemGoal = 30 << 20

// SettledAfter is how far into the idle window, begun warmup after
// READY=1, the agent's trim is behind it: the trim comes
// agent.TrimAfterIdle after the agent turns idle, a moment after
// READY=1; 10 s more for the trim's own work and the drop after it.
func SettledAfter(warmup time.Duration) time.Duration {
	return max(agent.TrimAfterIdle+10*time.Second-warmup, 0)
}

// settledSamples returns the samples (taken every interval from the
// window's start) from SettledAfter(warmup) on, rounded up to a whole
// sample, and how many it skipped; nil when nothing is skipped (the
// settled summary would be the window's) or nothing is left.
func settledSamples(samples []int64, interval, warmup time.Duration) ([]int64, int) {
	after := SettledAfter(warmup)
	skip := int((after + interval - 1) / interval)
	if skip == 0 || skip >= len(samples) {
		return nil, 0
	}
	return samples[skip:], skip
}

// scrapeSettle is how long after its scrape of the agent's /metrics the
// harness reads the cgroup again: read-ahead completes asynchronously.
const scrapeSettle = 2 * time.Second

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func mibFile(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "?"
	}
	return mib(fi.Size())
}

// MemWindow summarizes a memory cgroup's figure sampled at a fixed
// interval over a window.
type MemWindow struct {
	Samples int   `json:"samples"`
	Mean    int64 `json:"meanBytes"`
	P50     int64 `json:"p50Bytes"`
	Max     int64 `json:"maxBytes"`
	// Limit is the goal the samples are held to; SecondsAbove how long
	// (samples above it × the interval) the figure was over it.
	Limit        int64   `json:"limitBytes"`
	SecondsAbove float64 `json:"secondsAbove"`
}

// SummarizeMem summarizes samples taken every interval against limit.
func SummarizeMem(samples []int64, interval time.Duration, limit int64) MemWindow {
	w := MemWindow{Samples: len(samples), Limit: limit}
	if len(samples) == 0 {
		return w
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var sum float64
	above := 0
	for _, v := range samples {
		sum += float64(v)
		if v > limit {
			above++
		}
	}
	w.Mean = int64(sum / float64(len(samples)))
	w.P50 = sorted[(len(sorted)-1)/2]
	w.Max = sorted[len(sorted)-1]
	w.SecondsAbove = float64(above) * interval.Seconds()
	return w
}

// memSampler reads a memory cgroup's figure (memory.current or
// memory.usage_in_bytes) every interval until stopped.
type memSampler struct {
	quit, done chan struct{}
	samples    []int64
}

func startMemSampler(cg *MemCgroup, every time.Duration) *memSampler {
	s := &memSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if m, err := cg.Read(); err == nil {
				s.samples = append(s.samples, m.Current)
			}
			select {
			case <-s.quit:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and returns the samples.
func (s *memSampler) stop() []int64 {
	close(s.quit)
	<-s.done
	return s.samples
}
