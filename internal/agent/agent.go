package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// Options are what Run needs beyond the configuration.
type Options struct {
	Config *config.Config
	Log    *slog.Logger
	Clock  clock.Clock
	// RestConfig overrides the kubeconfig file (tests, benchmarks).
	RestConfig *apiclient.RestConfig
	// Host overrides the host operations chosen by host.mode.
	Host drivers.HostOps
	// CheckCommand is the journal's integrity-check subprocess argv prefix.
	CheckCommand []string
	// Notify receives sd_notify-style state: "READY", "STATUS=...", "STOPPING".
	Notify func(kind, msg string)
	// NoServers skips the metrics listener and the control socket (benchmarks
	// with many agents in one process).
	NoServers bool
	// ExtraDrivers are added to the built-in ones (tests).
	ExtraDrivers []drivers.Driver
	// Ready, if set, is closed once READY was announced.
	Ready chan<- struct{}
	// Health, if set, is given the engine's health check (engine.Healthy)
	// once the engine exists: systemd's watchdog pings only while it passes.
	Health func(check func() error)
	// LogindAddress is the D-Bus address of logind's bus (empty: the system bus).
	LogindAddress string
	// NoLogind skips the shutdown guard (many agents in one process).
	NoLogind bool
	// NoGPU skips NVML (many agents in one process).
	NoGPU bool
	// UnfilteredWatch makes the engine watch every LifecycleEvent instead
	// of this node's (bench/ only: the filtered watch's comparison).
	UnfilteredWatch bool
}

// Identity is stable for one journal on one node: a restarted agent keeps
// its claims, while a second agent process (with its own journal) is a
// different holder.
func Identity(node, journalPath string) string {
	abs, err := filepath.Abs(journalPath)
	if err != nil {
		abs = journalPath
	}
	sum := sha256.Sum256([]byte(abs))
	return node + "/" + hex.EncodeToString(sum[:])[:8]
}

// Run runs the agent until ctx ends.
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	log := o.Log.With("node", cfg.NodeName)
	clk := o.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	notify := o.Notify
	if notify == nil {
		notify = func(string, string) {}
	}
	reg := prometheus.NewRegistry()
	if !o.NoServers {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	metrics := engine.NewMetrics(reg)

	// The kubeconfig is read (not used) first: a bad path fails before
	// anything is created.
	rc := o.RestConfig
	if rc == nil {
		var err error
		if rc, err = apiclient.LoadConfig(cfg.Kubeconfig); err != nil {
			return err
		}
	}

	// 1. The journal.
	if err := os.MkdirAll(filepath.Dir(cfg.JournalPath), 0o700); err != nil {
		return fmt.Errorf("agent: journal directory: %w", err)
	}
	jopts := journal.Options{CheckCommand: o.CheckCommand, Clock: clk, TrustCleanClose: true,
		ObserveCommit: func(d time.Duration) { metrics.JournalCommit.Observe(d.Seconds()) }}
	j, rep, err := journal.Open(ctx, cfg.JournalPath, jopts)
	if err != nil {
		return err
	}
	defer j.Close()
	if rep != nil && rep.Corruption != nil {
		log.Error("the journal was corrupt: moved aside and started empty; events held in the API are rebuilt from their status",
			"journal", cfg.JournalPath, "movedTo", rep.Corruption.MovedTo, "err", rep.Corruption.Err)
	}
	if rep != nil && len(rep.Migrations) > 0 {
		log.Info("journal migrated", "journal", cfg.JournalPath, "migrations", rep.Migrations)
	}

	// 2. Host operations, drivers and the API client (no request is made
	// yet: replay works offline).
	var logind *host.Logind
	if !o.NoLogind {
		logind, err = host.New(host.Config{Address: o.LogindAddress, Logger: log, Clock: clk})
		if err != nil {
			return err
		}
		defer logind.Close()
	}
	hooks := &lockHooks{}
	hostOps := o.Host
	if hostOps == nil {
		hostOps, err = newHostOps(cfg, logind, hooks, log, clk)
		if err != nil {
			return err
		}
	}
	var gpu *gpuStack
	if !o.NoGPU {
		gpu = newGPUStack(cfg, log, clk)
	}
	drv := append(builtinDrivers(cfg, log, clk, gpu != nil), o.ExtraDrivers...)
	if gpu != nil {
		defer gpu.mgr.Shutdown()
		if cfg.DriverEnabled(gpu.driver.Short(), true, false) {
			drv = append(drv, gpu.driver)
		}
	}

	api, err := apiclient.New(rc, cfg.NodeName, cfg.APITimeout)
	if err != nil {
		return err
	}
	registerContactMetrics(reg, api)
	identity := Identity(cfg.NodeName, cfg.JournalPath)
	eng, err := engine.New(engine.Config{
		Node: cfg.NodeName, Identity: identity, API: api, Journal: j, Drivers: drv, Host: hostOps,
		Clock: clk, Log: log, EventRetention: cfg.EventRetention, Metrics: metrics,
		Notify:          func(s string) { notify("STATUS", s) },
		UnfilteredWatch: o.UnfilteredWatch,
	})
	if err != nil {
		return err
	}
	if o.Health != nil {
		o.Health(eng.Healthy)
	}
	unfinished, err := j.Events()
	if err != nil {
		return fmt.Errorf("agent: journal replay: %w", err)
	}
	log.Info("journal replayed", "journal", cfg.JournalPath, "unfinished", len(unfinished), "identity", identity, "hostMode", cfg.Host.Mode)

	if !o.NoServers {
		stop, err := serve(ctx, cfg, reg, eng, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if logind != nil {
		hooks.guard = startShutdownGuard(ctx, cfg, logind, eng, log)
	}
	if gpu != nil {
		gpu.startMonitor(ctx, cfg, api, hostOps.BootID(), reg, log, clk)
	}
	notify("READY", fmt.Sprintf("journal replayed: %d unfinished event(s)", len(unfinished)))
	if o.Ready != nil {
		close(o.Ready)
	}
	err = eng.Run(ctx)
	notify("STOPPING", "stopping")
	return err
}

// registerContactMetrics exports apiclient.Contact: when the agent last
// heard from the API server, and whether its last request got an answer.
func registerContactMetrics(reg prometheus.Registerer, api *apiclient.Client) {
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifecycle_agent_api_last_contact_timestamp_seconds",
			Help: "Unix time of the last response (or watch data) from the API server; 0 if none yet."}, func() float64 {
			t := api.Contact().LastHeard
			if t.IsZero() {
				return 0
			}
			return float64(t.UnixNano()) / 1e9
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifecycle_agent_api_reachable",
			Help: "1 if the agent's most recent API request got a response, 0 if it failed without one."}, func() float64 {
			if api.Contact().Reachable {
				return 1
			}
			return 0
		}))
}

// serve starts the metrics/healthz listener and the control socket.
func serve(ctx context.Context, cfg *config.Config, reg *prometheus.Registry, eng *engine.Engine, log *slog.Logger) (func(), error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := eng.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ml, err := net.Listen("tcp", cfg.MetricsAddress)
	if err != nil {
		return nil, fmt.Errorf("agent: metrics listener on %s: %w", cfg.MetricsAddress, err)
	}
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = msrv.Serve(ml) }()

	if err := os.MkdirAll(filepath.Dir(cfg.SocketPath), 0o700); err != nil {
		_ = msrv.Close()
		return nil, fmt.Errorf("agent: control socket directory: %w", err)
	}
	_ = os.Remove(cfg.SocketPath)
	sl, err := net.Listen("unix", cfg.SocketPath)
	if err != nil {
		_ = msrv.Close()
		return nil, fmt.Errorf("agent: control socket %s: %w", cfg.SocketPath, err)
	}
	if err := os.Chmod(cfg.SocketPath, 0o600); err != nil {
		_ = msrv.Close()
		_ = sl.Close()
		return nil, err
	}
	smux := http.NewServeMux()
	smux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(eng.Snapshot())
	})
	smux.HandleFunc("/request", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		var req RequestBody
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
			writeErr(w, http.StatusBadRequest, "bad request body: "+err.Error())
			return
		}
		res, err := eng.Request(r.Context(), req.Driver, req.Params)
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, engine.ErrUnknownDriver) || errors.Is(err, drivers.ErrBadParameter) {
				code = http.StatusBadRequest
			}
			writeErr(w, code, err.Error())
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
	smux.HandleFunc("/event", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		out := EventView{Name: name, Queued: eng.Queued(name)}
		if !out.Queued {
			ev, err := eng.Event(r.Context(), name)
			if apiclient.IsNotFound(err) {
				writeErr(w, http.StatusNotFound, fmt.Sprintf("event %s is gone: cancelled, or deleted after it ended (eventRetention)", name))
				return
			}
			if err != nil {
				writeErr(w, http.StatusBadGateway, err.Error())
				return
			}
			out.Status = ev.Status
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	ssrv := &http.Server{Handler: smux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = ssrv.Serve(sl) }()
	log.Info("serving", "metrics", ml.Addr().String(), "socket", cfg.SocketPath)
	return func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = msrv.Shutdown(c)
		_ = ssrv.Shutdown(c)
		_ = os.Remove(cfg.SocketPath)
	}, nil
}

// StatusFromSocket asks a running agent for its snapshot.
func StatusFromSocket(ctx context.Context, socket string) (engine.Snapshot, error) {
	var s engine.Snapshot
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}, Timeout: 5 * time.Second}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/status", nil)
	resp, err := c.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return s, fmt.Errorf("cannot reach the agent at %s: %w (is it running? the socket is root-only)", socket, err)
		}
		return s, fmt.Errorf("cannot reach the agent at %s: %w", socket, err)
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// RequestBody is POST /request on the control socket.
type RequestBody struct {
	Driver string            `json:"driver"`
	Params map[string]string `json:"params,omitempty"`
}

// EventView is GET /event?name= on the control socket.
type EventView struct {
	Name   string                        `json:"name"`
	Queued bool                          `json:"queued"`
	Status v1alpha1.LifecycleEventStatus `json:"status"`
}

type errorBody struct {
	Error string `json:"error"`
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(errorBody{Error: msg})
}

// socketClient talks HTTP over the control socket.
func socketClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}, Timeout: 30 * time.Second}
}

// ErrGone says the event no longer exists.
type ErrGone struct{ Msg string }

func (e *ErrGone) Error() string { return e.Msg }

// ErrRefused is an error the agent returned for a bad request.
type ErrRefused struct{ Msg string }

func (e *ErrRefused) Error() string { return e.Msg }

// RequestViaSocket asks the running agent to create (or queue) an event.
func RequestViaSocket(ctx context.Context, socket string, body RequestBody) (engine.RequestResult, error) {
	var res engine.RequestResult
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/request", bytes.NewReader(b))
	resp, err := socketClient(socket).Do(req)
	if err != nil {
		return res, fmt.Errorf("cannot reach the agent at %s: %w (is it running? the socket is root-only)", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		if resp.StatusCode == http.StatusBadRequest {
			return res, &ErrRefused{Msg: eb.Error}
		}
		return res, fmt.Errorf("agent: %s", eb.Error)
	}
	return res, json.NewDecoder(resp.Body).Decode(&res)
}

// EventViaSocket reads an event's status through the agent.
func EventViaSocket(ctx context.Context, socket, name string) (EventView, error) {
	var v EventView
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/event?name="+url.QueryEscape(name), nil)
	resp, err := socketClient(socket).Do(req)
	if err != nil {
		return v, fmt.Errorf("cannot reach the agent at %s: %w", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		_ = json.NewDecoder(resp.Body).Decode(&eb)
		if resp.StatusCode == http.StatusNotFound {
			return v, &ErrGone{Msg: eb.Error}
		}
		return v, fmt.Errorf("agent: %s", eb.Error)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}
