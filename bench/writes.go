package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
	"github.com/lifecycle-agent/lifecycle-agent/internal/devices/devicestest"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// WriteCase is one event of Writes.
type WriteCase struct {
	Label  string
	Driver string // short name, as in the transition's name
	Params map[string]string
	// Pods, when > 0, puts that many pods (a StatefulSet's) on the node
	// before the event; their replacements go to a spare node.
	Pods int
	// MinAvailable, when > 0, puts the pods behind a PodDisruptionBudget
	// with that minAvailable: evictions are refused (429) until the
	// replacements run on the spare node.
	MinAvailable int
}

// WriteStats is what one event cost in requests made with the agent's
// identity, counted at the agent's client.
type WriteStats struct {
	Label  string `json:"label"`
	Driver string `json:"driver"`
	Steps  int    `json:"steps"`
	Writes int    `json:"writes"` // evictions apart: Evictions
	Reads  int    `json:"reads"`
	// Evictions are the drain's POST pods/eviction, accepted or refused by
	// a PodDisruptionBudget (429): one per pod and per refused try, the
	// drain's own cost, counted apart from Writes.
	Evictions int            `json:"evictions"`
	Budget    int            `json:"budget"` // 2 × steps + 4
	Outcome   string         `json:"outcome"`
	Writing   map[string]int `json:"writing"` // write requests by "VERB resource"
	// WriteBytes is the request bodies of Writes, in bytes: what the
	// server decodes for them.
	WriteBytes int64          `json:"writeBytes"`
	Reading    map[string]int `json:"reading"` // other requests
	// ServerNodeRequests is the same window's increase of the API
	// server's count of node-identity requests (NodeRequests), the
	// server's view of what Writes+Reads counted at the client.
	ServerNodeRequests float64 `json:"serverNodeRequests"`
	Seconds            float64 `json:"seconds"`
}

// DefaultWriteCases covers every built-in driver but shutdown (not
// claimed: logind starts it), gpu-reset on go-nvml's mock of a DGX H100,
// plus a vendor exec driver, in an order that leaves the node as it found
// it.
func DefaultWriteCases() []WriteCase {
	return []WriteCase{
		{Label: "uncordon (node not cordoned)", Driver: "uncordon"},
		{Label: "drain (no pods)", Driver: "drain"},
		{Label: "uncordon (our cordon)", Driver: "uncordon"},
		{Label: "reboot, simulated (drain on, no pods)", Driver: "reboot"},
		{Label: "reboot, simulated (drain=false)", Driver: "reboot", Params: map[string]string{"drain": "false"}},
		{Label: "os-upgrade, profile, simulated (no pods)", Driver: "os-upgrade", Params: map[string]string{"profile": "bench"}},
		{Label: "exec driver from config (2 steps)", Driver: "bench-exec"},
		{Label: "drain (10 pods, no PDB)", Driver: "drain", Pods: 10},
		{Label: "uncordon (our cordon, after the 10-pod drain)", Driver: "uncordon"},
		{Label: "drain (5 pods behind a PDB, minAvailable 4)", Driver: "drain", Pods: 5, MinAvailable: 4},
		{Label: "uncordon (our cordon, after the PDB drain)", Driver: "uncordon"},
		{Label: "gpu-reset, simulated (one GPU of a mock DGX H100)", Driver: "gpu-reset", Params: map[string]string{"gpus": "0"}},
	}
}

// Writes runs one agent and, one after the other, one event per case,
// counting the requests the agent makes with its identity (a counting
// RoundTripper on its own client) from the event's creation until it is
// finished, deleted, and the agent has been quiet for a second.
func Writes(ctx context.Context, dir string, cases []WriteCase, say func(string, ...any)) ([]WriteStats, error) {
	env, err := StartEnv(ctx, nil, true)
	if err != nil {
		return nil, err
	}
	defer env.Stop()
	const node = "bench-writes"
	if err := testenv.CreateNode(ctx, env.AdminConfig(), node, nil); err != nil {
		return nil, err
	}
	if _, err := testenv.RunKubeletStandIn(ctx, env.AdminConfig(), node); err != nil {
		return nil, err
	}
	const spare = node + "-spare" // where a workload's evicted pods come back
	if err := testenv.CreateNode(ctx, env.AdminConfig(), spare, nil); err != nil {
		return nil, err
	}
	if _, err := testenv.RunKubeletStandIn(ctx, env.AdminConfig(), spare); err != nil {
		return nil, err
	}
	log, closer, err := FileLogger(filepath.Join(dir, "agent.log"), slog.LevelInfo)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	counter := NewCounter()
	gpu, stopGPU, err := mockGPUReset(log)
	if err != nil {
		return nil, err
	}
	defer stopGPU()
	a, err := StartAgent(ctx, AgentOptions{Node: node, Dir: filepath.Join(dir, node), Rest: env.AgentRestConfig(node), Log: log, Counter: counter,
		ExtraDrivers: []drivers.Driver{gpu},
		Configure: func(c *config.Config) {
			c.OSUpgrade.Profiles = map[string]config.OSUpgradeProfile{"bench": {Command: []string{"/bin/true"}, Timeout: time.Minute, RebootPolicy: config.RebootAlways}}
			c.Exec.Drivers = []config.ExecDriver{{Name: "bench-exec", Start: "BenchStarted", End: "BenchDone", SLA: 10 * time.Minute, Steps: []config.ExecStep{
				{Name: "one", Command: []string{"/bin/true"}, Timeout: time.Minute},
				{Name: "two", Command: []string{"/bin/true"}, Timeout: time.Minute},
			}}}
		}})
	if err != nil {
		return nil, err
	}
	defer a.Stop()
	select {
	case <-a.Idle():
	case <-time.After(60 * time.Second):
		return nil, fmt.Errorf("bench: agent not idle after 60s")
	}
	obs, err := env.Observe(ctx, nil)
	if err != nil {
		return nil, err
	}
	var out []WriteStats
	for i, c := range cases {
		if err := env.WaitTransitions(ctx, node, c.Driver, 30*time.Second); err != nil {
			return out, err
		}
		if c.Pods > 0 {
			w := &testenv.Workload{Namespace: fmt.Sprintf("bench-writes-%d", i), Name: "app", Node: node, Spare: spare, Replicas: c.Pods, MinAvailable: c.MinAvailable}
			if err := w.Start(ctx, env.AdminConfig()); err != nil {
				return out, err
			}
			if err := testenv.WaitPodsRunning(ctx, env.AdminConfig(), node, c.Pods); err != nil {
				return out, err
			}
		}
		quiet(counter, time.Second, 30*time.Second)
		name := fmt.Sprintf("writes-%02d-%s", i, c.Driver)
		before, beforeBytes := counter.SnapshotBytes()
		s0, err := env.Scrape(ctx)
		if err != nil {
			return out, err
		}
		t0 := time.Now()
		if err := env.CreateEvent(ctx, name, node, c.Driver, c.Params); err != nil {
			return out, err
		}
		final, err := obs.Gone(ctx, name, 5*time.Minute)
		if err != nil {
			return out, err
		}
		quiet(counter, time.Second, 30*time.Second)
		s1, err := env.Scrape(ctx)
		if err != nil {
			return out, err
		}
		after, afterBytes := counter.SnapshotBytes()
		d := DiffCounts(before, after)
		ws := WriteStats{Label: c.Label, Driver: c.Driver, Steps: obs.Steps(name), Outcome: final, Writing: map[string]int{}, Reading: map[string]int{},
			ServerNodeRequests: s1.Sub(s0).NodeRequests(), Seconds: time.Since(t0).Seconds()}
		for k, v := range d {
			if k == evictionKey {
				ws.Evictions += v
				continue
			}
			if IsWrite(k) {
				ws.Writes += v
				ws.Writing[k] = v
				ws.WriteBytes += afterBytes[k] - beforeBytes[k]
			} else {
				ws.Reads += v
				ws.Reading[k] = v
			}
		}
		ws.Budget = 2*ws.Steps + 4
		if c.Pods > 0 {
			// The report prints the label: the evictions, apart, in it.
			ws.Label = fmt.Sprintf("%s; evictions apart: %d POST pods/eviction for %d pods", c.Label, ws.Evictions, c.Pods)
		}
		out = append(out, ws)
		say("%s: %d steps, %d writes (budget %d), %d evictions apart, %d reads: %s", ws.Label, ws.Steps, ws.Writes, ws.Budget, ws.Evictions, ws.Reads, FormatCounts(ws.Writing))
		if !strings.HasPrefix(final, "Succeeded") {
			return out, fmt.Errorf("bench: %s ended %q", name, final)
		}
	}
	return out, nil
}

// evictionKey is how the counter names an eviction (counted apart).
const evictionKey = "POST pods/eviction"

// mockGPUReset is the gpu-reset driver on go-nvml's mock of a DGX H100
// (internal/devices/devicestest), reset through NVML; with the host
// simulated the reset is journaled and logged, not performed (as in the
// chaos schedules). No GPU Operator and no readiness checks.
func mockGPUReset(log *slog.Logger) (drivers.Driver, func(), error) {
	f := devicestest.New(devicestest.DGXH100)
	f.StableUUIDs()
	mgr, err := devices.New(devices.Config{NVML: f.NVML(), Logger: log})
	if err == nil {
		err = mgr.Init()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("bench: the mock GPUs: %w", err)
	}
	return drivers.GPUReset{Devices: mgr, Method: devices.ResetMethodNVML, Log: log}, func() { _ = mgr.Shutdown() }, nil
}

// quiet waits until the counter did not move (watches aside) for d.
func quiet(c *Counter, d, limit time.Duration) {
	deadline := time.Now().Add(limit)
	sum := func() int {
		n := 0
		for k, v := range c.Snapshot() {
			if !strings.HasPrefix(k, "WATCH ") {
				n += v
			}
		}
		return n
	}
	last, since := sum(), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if n := sum(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= d {
			return
		}
	}
}

// FormatCounts prints counts as "3× PUT lifecycleevents/status, …", largest first.
func FormatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d× %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
