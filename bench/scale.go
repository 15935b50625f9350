package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
)

// ScaleOptions configure Scale.
type ScaleOptions struct {
	N int // agents (one node each)
	// Fraction of the nodes that receive an event at once, per round
	// (default 0.05; at least one node).
	Fraction float64
	// Samples is the number of claims to measure (default 200); rounds are
	// added until it is reached, at most MaxRounds (default 60).
	Samples   int
	MaxRounds int
	// Unfiltered makes every agent watch all events (the comparison).
	Unfiltered bool
	// StartWidth is how many agents start at once (default 8).
	StartWidth int
	// IdleWindow is the quiet period measured after all agents are idle
	// (default 30 s).
	IdleWindow time.Duration
	// APITimeout, when set, replaces the agents' apiTimeout (diagnostic:
	// the client's timeout also ends every watch after that long).
	APITimeout time.Duration
	Dir        string
	Progress   func(format string, args ...any)
}

// Window is the cost of one measurement window.
type Window struct {
	Seconds float64 `json:"seconds"`
	// RPS is apiserver_request_total's increase per second (every client,
	// this harness included).
	RPS float64 `json:"rps"`
	// NodeRPS is the increase of APF's dispatched requests of node
	// identities per second (ServerCounters.NodeRequests): the agents'.
	NodeRPS float64 `json:"nodeRps"`
	// Verbs is apiserver_request_total's increase by verb.
	Verbs           map[string]float64 `json:"verbs"`
	APIServerCPUPct float64            `json:"apiserverCpuPct"` // of one core
	EtcdCPUPct      float64            `json:"etcdCpuPct"`
	BenchCPUPct     float64            `json:"benchCpuPct"` // this process: the N agents and the harness
	// ServerMs is the API server's mean time per request by verb
	// (apiserver_request_duration_seconds; WATCH excluded by its meaning).
	ServerMs map[string]float64 `json:"serverMeanMs"`
	// APFWaitMs is the mean time requests queued in API Priority and
	// Fairness, by priority level.
	APFWaitMs map[string]float64 `json:"apfWaitMeanMs"`
	// Watches are the watches started, by resource, and
	// TerminatedWatchers those the server's watch cache closed because
	// their client fell behind (ServerCounters).
	Watches            map[string]float64 `json:"watches"`
	TerminatedWatchers map[string]float64 `json:"terminatedWatchers"`
	// Received are the changes the watch cache offered to every watcher
	// of their resource, Sent the events that passed a watcher's selector
	// (ServerCounters, with Dispatched), by resource.
	Received   map[string]float64 `json:"watchCacheReceived"`
	Dispatched map[string]float64 `json:"watchCacheDispatched"`
	Sent       map[string]float64 `json:"watchEventsSent"`
	// APIServerCPUSeconds is the window's increase of the API server's own
	// process_cpu_seconds_total (the portable figure; APIServerCPUPct is
	// the same process's CPU read from /proc).
	APIServerCPUSeconds float64 `json:"apiserverCpuSeconds"`
}

// ScaleStats are Scale's measurements.
type ScaleStats struct {
	N          int     `json:"n"`
	Unfiltered bool    `json:"unfiltered"`
	APITimeout string  `json:"apiTimeout,omitempty"`
	StartSec   float64 `json:"startSeconds"` // all agents started and idle
	Rounds     int     `json:"rounds"`
	PerRound   int     `json:"eventsPerRound"`
	Claim      Dist    `json:"claim"`
	Condition  Dist    `json:"condition"`
	Idle       Window  `json:"idle"`
	Events     Window  `json:"events"`
	// APIServerRSS at the end and its peak (sampled every second).
	APIServerRSS     int64 `json:"apiserverRssBytes"`
	APIServerPeakRSS int64 `json:"apiserverPeakRssBytes"`
	EtcdRSS          int64 `json:"etcdRssBytes"`
	BenchRSS         int64 `json:"benchRssBytes"`
	// Per event of the busy window, from the API server's own metrics:
	// its CPU seconds above its idle rate (the idle window's
	// process_cpu_seconds_total per second, times the busy window's
	// length, taken off), the LifecycleEvent changes its watch cache
	// received (each offered to all N agents' watches: the fan-out), and
	// the LifecycleEvent watches it started (restarts, mostly).
	CPUSecondsPerEvent float64 `json:"apiserverCpuSecondsPerEvent"`
	ChangesPerEvent    float64 `json:"lifecycleEventChangesPerEvent"`
	WatchesPerEvent    float64 `json:"lifecycleEventWatchesPerEvent"`
}

// Scale runs N agents, each a goroutine of this process with its own
// client (x509 identity system:node:<name>), watch, node Lease and journal:
// agent.Run with NoServers/NoLogind/NoGPU, the daemon's code. After an idle
// window it creates uncordon events for Fraction of the nodes at once,
// round after round, and times each claim as ClaimLatency does.
func Scale(ctx context.Context, o ScaleOptions) (ScaleStats, error) {
	st := ScaleStats{N: o.N, Unfiltered: o.Unfiltered}
	if o.APITimeout > 0 {
		st.APITimeout = o.APITimeout.String()
	}
	if o.Fraction <= 0 {
		o.Fraction = 0.05
	}
	if o.Samples <= 0 {
		o.Samples = 200
	}
	if o.MaxRounds <= 0 {
		o.MaxRounds = 60
	}
	if o.StartWidth <= 0 {
		o.StartWidth = 8
	}
	if o.IdleWindow <= 0 {
		o.IdleWindow = 30 * time.Second
	}
	say := o.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	env, err := StartEnv(ctx, nil, false)
	if err != nil {
		return st, err
	}
	defer env.Stop()
	pids := env.PIDs()
	apiPID, etcdPID := pids["kube-apiserver"], pids["etcd"]
	apiSampler, err := StartSampler(apiPID, time.Second)
	if err != nil {
		return st, err
	}

	names := make([]string, o.N)
	for i := range names {
		names[i] = fmt.Sprintf("bench-node-%04d", i)
	}
	say("creating %d nodes", o.N)
	if err := env.CreateNodes(ctx, names, map[string]string{"bench": "scale"}); err != nil {
		return st, err
	}
	log, closer, err := FileLogger(filepath.Join(o.Dir, "agents.log"), slog.LevelWarn)
	if err != nil {
		return st, err
	}
	defer closer.Close()

	say("starting %d agents (%d at a time, unfiltered=%v)", o.N, o.StartWidth, o.Unfiltered)
	agents := make([]*Agent, o.N)
	t0 := time.Now()
	err = parallel(ctx, o.N, o.StartWidth, func(i int) error {
		a, err := StartAgent(ctx, AgentOptions{Node: names[i], Dir: filepath.Join(o.Dir, names[i]), Rest: env.AgentRestConfig(names[i]),
			Log: log.With("agent", names[i]), Unfiltered: o.Unfiltered, Configure: func(c *config.Config) {
				if o.APITimeout > 0 {
					c.APITimeout = o.APITimeout
				}
			}})
		if err != nil {
			return err
		}
		agents[i] = a
		select {
		case <-a.Idle():
			return nil
		case err := <-a.Done():
			return fmt.Errorf("bench: agent %s stopped: %v", names[i], err)
		case <-time.After(5 * time.Minute):
			return fmt.Errorf("bench: agent %s not idle after 5 minutes", names[i])
		}
	})
	defer func() {
		var wg sync.WaitGroup
		for _, a := range agents {
			if a != nil {
				wg.Add(1)
				go func() { defer wg.Done(); _ = a.Stop() }()
			}
		}
		wg.Wait()
	}()
	if err != nil {
		return st, err
	}
	st.StartSec = time.Since(t0).Seconds()
	say("%d agents idle after %.1fs; settling 10s, then an idle window of %s", o.N, st.StartSec, o.IdleWindow)
	select {
	case <-ctx.Done():
		return st, ctx.Err()
	case <-time.After(10 * time.Second):
	}

	self := os.Getpid()
	measure := func(run func() error) (Window, error) {
		var w Window
		c0, err := env.Scrape(ctx)
		if err != nil {
			return w, err
		}
		a0, _ := ReadProc(apiPID)
		e0, _ := ReadProc(etcdPID)
		b0, _ := ReadProc(self)
		if err := run(); err != nil {
			return w, err
		}
		a1, _ := ReadProc(apiPID)
		e1, _ := ReadProc(etcdPID)
		b1, _ := ReadProc(self)
		c1, err := env.Scrape(ctx)
		if err != nil {
			return w, err
		}
		d := c1.Sub(c0)
		w.Seconds = a1.At.Sub(a0.At).Seconds()
		w.RPS = d.Total() / w.Seconds
		w.NodeRPS = d.NodeRequests() / w.Seconds
		w.Verbs = d.Requests
		w.Watches, w.TerminatedWatchers = d.Watches, d.TerminatedWatchers
		w.Received, w.Dispatched, w.Sent, w.APIServerCPUSeconds = d.Received, d.Dispatched, d.Sent, d.CPUSeconds
		w.ServerMs = MeanMs(d.DurationSum, d.DurationCount)
		delete(w.ServerMs, "WATCH")
		w.APFWaitMs = MeanMs(d.APFWaitSum, d.APFWaitCount)
		w.APIServerCPUPct, w.EtcdCPUPct, w.BenchCPUPct = CPUPercent(a0, a1), CPUPercent(e0, e1), CPUPercent(b0, b1)
		return w, nil
	}
	st.Idle, err = measure(func() error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.IdleWindow):
			return nil
		}
	})
	if err != nil {
		return st, err
	}
	say("idle: %.1f req/s (agents %.2f req/s), apiserver %.1f%% CPU", st.Idle.RPS, st.Idle.NodeRPS, st.Idle.APIServerCPUPct)

	obs, err := env.Observe(ctx, nil)
	if err != nil {
		return st, err
	}
	k := max(1, int(math.Round(float64(o.N)*o.Fraction)))
	rounds := min(o.MaxRounds, (o.Samples+k-1)/k)
	st.Rounds, st.PerRound = rounds, k
	var mu sync.Mutex
	var claims, conds []time.Duration
	next := 0
	st.Events, err = measure(func() error {
		for r := 0; r < rounds; r++ {
			batch := make([]string, k)
			for i := range batch {
				batch[i] = names[next%o.N]
				next++
			}
			err := parallel(ctx, k, k, func(i int) error {
				name := fmt.Sprintf("scale-r%03d-%s", r, batch[i])
				t0 := time.Now()
				if err := env.CreateEvent(ctx, name, batch[i], "uncordon", nil); err != nil {
					return err
				}
				tc, err := obs.Claimed(ctx, name, 5*time.Minute)
				if err != nil {
					return err
				}
				tn, err := obs.Condition(ctx, name, 5*time.Minute)
				if err != nil {
					return err
				}
				mu.Lock()
				claims = append(claims, tc.Sub(t0))
				conds = append(conds, tn.Sub(t0))
				mu.Unlock()
				final, err := obs.Gone(ctx, name, 5*time.Minute)
				if err == nil && !strings.HasPrefix(final, "Succeeded") && obs.GoneUnseen(name) {
					// The server closed the observer's watch (at 1,000
					// unfiltered watches it closes slow watchers) and a
					// re-list found the event gone: its end state was never
					// seen. The agent's Kubernetes Event says how it ended.
					if final, err = env.EndFromEvents(ctx, name, 30*time.Second); err == nil {
						say("%s: its end was not seen (the observer's watch was closed); its Kubernetes Event says %q", name, final)
					}
				}
				if err == nil && !strings.HasPrefix(final, "Succeeded") {
					err = fmt.Errorf("bench: event %s ended %q", name, final)
				}
				return err
			})
			if err != nil {
				return err
			}
			say("round %d/%d: %d events claimed and done", r+1, rounds, k)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		return nil
	})
	if err != nil {
		return st, err
	}
	st.Claim, st.Condition = Summarize(claims), Summarize(conds)
	st.perEvent(rounds * k)
	_, last, peak := apiSampler.Stop()
	st.APIServerRSS, st.APIServerPeakRSS = last.RSS, peak
	if p, err := ReadProc(etcdPID); err == nil {
		st.EtcdRSS = p.RSS
	}
	if p, err := ReadProc(self); err == nil {
		st.BenchRSS = p.RSS
	}
	return st, nil
}

// perEvent sets the per-event figures from the windows' server counters
// for events events: the API server's CPU seconds above its idle rate (the
// idle window's per second, times the busy window's length, taken off),
// and the LifecycleEvent changes and watches.
func (st *ScaleStats) perEvent(events int) {
	if events <= 0 {
		return
	}
	n := float64(events)
	idle := 0.0
	if st.Idle.Seconds > 0 {
		idle = st.Idle.APIServerCPUSeconds / st.Idle.Seconds * st.Events.Seconds
	}
	st.CPUSecondsPerEvent = (st.Events.APIServerCPUSeconds - idle) / n
	st.ChangesPerEvent = st.Events.Received["lifecycleevents"] / n
	st.WatchesPerEvent = st.Events.Watches["lifecycleevents"] / n
}
