package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
}

// Idle runs bin/lifecycle-agent (simulate mode, one node, the test logind
// on a private bus) against the test control plane, lets it settle for
// warmup after READY=1, then measures it for window: RSS and CPU from
// /proc/<pid>, requests from the API server's counters.
func Idle(ctx context.Context, dir, bin string, warmup, window time.Duration, say func(string, ...any)) (IdleStats, error) {
	st := IdleStats{Warmup: warmup.Seconds()}
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
	d, err := StartDaemon(DaemonOptions{Bin: bin, Dir: filepath.Join(dir, "agent"), Node: node, Kubeconfig: kc, Bus: srv.Address()})
	if err != nil {
		return st, err
	}
	defer d.Stop()
	if _, err := d.WaitReady(60 * time.Second); err != nil {
		return st, err
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
	end := time.Now().Add(window)
	for time.Now().Before(end) {
		left := time.Until(end)
		if err := waitCtx(ctx, min(left, time.Minute)); err != nil {
			smp.Stop()
			return st, err
		}
		if left > time.Minute {
			say("idle: %s left", (left - time.Minute).Round(time.Second))
		}
	}
	first, last, peak := smp.Stop()
	c1, err := env.Scrape(ctx)
	if err != nil {
		return st, err
	}
	delta := c1.Sub(c0)
	st.Seconds = last.At.Sub(first.At).Seconds()
	st.RSS, st.PeakRSS, st.CPUPct = last.RSS, peak, CPUPercent(first, last)
	st.RssAnon, st.RssFile = last.RssAnon, last.RssFile
	st.Pss, st.PssAnon, st.PssFile = last.Pss, last.PssAnon, last.PssFile
	st.GoRuntime, _ = d.ScrapeGauges("go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes", "go_goroutines", "go_memstats_stack_inuse_bytes")
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
	return st, nil
}
