package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/internal/needs"
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

// Identity is stable for one journal on one machine: a restarted agent
// keeps its claims, while a second agent process (with its own journal) is
// a different holder, and so is an agent on another machine configured
// with the same node name and journal path (machineID tells them apart).
// With machineID empty it is the identity older agents used, which did not
// include it: LegacyIdentity.
func Identity(node, journalPath, machineID string) string {
	abs, err := filepath.Abs(journalPath)
	if err != nil {
		abs = journalPath
	}
	in := abs
	if machineID != "" {
		in = machineID + "\n" + abs
	}
	sum := sha256.Sum256([]byte(in))
	return node + "/" + hex.EncodeToString(sum[:])[:8]
}

// LegacyIdentity is the identity older agents used (no machine ID).
// An agent accepts it as its own for what its journal says it holds (the
// Leases of an event claimed before an upgrade), never to adopt an event
// from the API alone.
func LegacyIdentity(node, journalPath string) string { return Identity(node, journalPath, "") }

// SimulatedMachineIDFile, next to the journal, stands in for
// /etc/machine-id under host.mode=simulate when it exists (tests run
// "machines" side by side on one host).
const SimulatedMachineIDFile = "simulated-machine-id"

// machineID reads the machine ID the identity includes ("" when none can
// be read: the identity is then the legacy one, and the log says so).
func machineID(cfg *config.Config, log *slog.Logger) string {
	p := host.Paths{}
	if cfg.Host.Mode == config.HostModeSimulate {
		if f := filepath.Join(filepath.Dir(cfg.JournalPath), SimulatedMachineIDFile); fileExists(f) {
			p.MachineIDFile = f
		}
	}
	id, err := p.MachineID()
	if err != nil {
		log.Warn("no machine ID: the holder identity cannot tell this host from another given the same node name", "err", err)
		return ""
	}
	return id
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
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

	// A second agent must not take the socket of the one that runs: say
	// which process holds it before anything else is opened.
	if !o.NoServers {
		if err := checkSocketFree(cfg.SocketPath); err != nil {
			return err
		}
	}
	simulated := 0.0
	if cfg.Host.Mode == config.HostModeSimulate {
		simulated = 1
		log.Warn("host.mode is simulate: reboots, shutdowns and host commands are logged and journaled, NEVER performed")
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "lifecycle_agent_host_simulated",
		Help: "1 when host.mode is simulate: host actions (reboot, commands) are journaled but not performed."},
		func() float64 { return simulated }))

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
	api, err := apiclient.New(rc, cfg.NodeName, cfg.APITimeout)
	if err != nil {
		return err
	}
	var gpu *gpuStack
	var gpuErr error
	if !o.NoGPU {
		gpu, gpuErr = newGPUStack(cfg, api, log, clk)
	}
	drv := append(builtinDrivers(cfg, log, clk, gpu != nil, api), o.ExtraDrivers...)
	var unpublished []UnpublishedDriver
	if o.Host == nil && cfg.Host.Mode == config.HostModeReal {
		drv, unpublished = withoutLogindDrivers(ctx, drv, logind, log)
	}
	if gpu != nil {
		defer gpu.mgr.Shutdown()
		if cfg.DriverEnabled(gpu.driver.Short(), true, false) {
			drv = append(drv, gpu.driver)
		}
	}

	registerContactMetrics(reg, api)
	identity := Identity(cfg.NodeName, cfg.JournalPath, machineID(cfg, log))
	var former []string
	if legacy := LegacyIdentity(cfg.NodeName, cfg.JournalPath); legacy != identity {
		former = append(former, legacy)
	}
	api.FormerIdentities = former
	gates, err := Gates(cfg, api, log)
	if err != nil {
		return err
	}
	notifier, err := newNotifier(cfg, j, reg, log, clk)
	if err != nil {
		return err
	}
	var wakeNotifier func()
	if notifier != nil {
		wakeNotifier = notifier.Wake
	}
	// The real daemon releases what it does not use once idle (trim.go);
	// many agents in one process (benchmarks) do not.
	var tr *trimmer
	if !o.NoServers {
		tr = newTrimmer(log, clk)
		defer tr.stop()
	}
	eng, err := engine.New(engine.Config{
		Node: cfg.NodeName, Identity: identity, FormerIdentities: former, API: api, Journal: j, Drivers: drv, Host: hostOps,
		Clock: clk, Log: log, EventRetention: cfg.EventRetention, Metrics: metrics,
		Notify: func(s string) {
			notify("STATUS", s)
			if tr != nil {
				tr.state(s)
			}
		},
		UnfilteredWatch: o.UnfilteredWatch,
		Windows:         cfg.Maintenance.Windows, Gates: gates,
		Notices:        wakeNotifier,
		ShutdownReturn: rebootConfigOf(cfg, api, clk, gpu != nil).NodeReturn(),
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
		cs := &controlState{eng: eng, journal: j, hostMode: cfg.Host.Mode, unpublished: unpublished, log: log}
		stop, err := serve(ctx, cfg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), cs, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	switch {
	case logind != nil && cfg.DriverEnabled(config.DriverShutdown, false, false):
		hooks.guard = startShutdownGuard(ctx, cfg, logind, eng, log)
	case logind != nil:
		log.Warn("the shutdown driver is off (drivers.shutdown.enabled=false): no delay lock is held, a shutdown is not handled")
	}
	reboot, err := startNeeds(ctx, cfg, api, j, hostOps.BootID(), gpu != nil, reg, log, clk)
	if err != nil {
		return err
	}
	if gpu != nil {
		gpu.startMonitor(ctx, cfg, api, j, hostOps.BootID(), reboot, reg, log, clk)
		gpu.followDriverUpgrades(ctx, api, log)
	} else if !o.NoGPU && gpuMayAppear(cfg, gpuErr) {
		go waitForGPU(ctx, cfg, api, log, clk, gpuErr, func(g *gpuStack) {
			context.AfterFunc(ctx, func() { _ = g.mgr.Shutdown() })
			g.startMonitor(ctx, cfg, api, j, hostOps.BootID(), reboot, reg, log, clk)
			g.followDriverUpgrades(ctx, api, log)
			if cfg.DriverEnabled(g.driver.Short(), true, false) {
				eng.AddDriver(g.driver)
			}
		})
	}
	notify("READY", fmt.Sprintf("journal replayed: %d unfinished event(s)", len(unfinished)))
	if o.Ready != nil {
		close(o.Ready)
	}
	stopNotifier := startNotifier(ctx, notifier)
	err = eng.Run(ctx)
	notify("STOPPING", "stopping")
	stopNotifier() // at once: a send in flight is not waited for
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

// logindDrivers need logind in real mode: they reboot through it.
var logindDrivers = map[string]bool{"reboot": true, "os-upgrade": true}

// withoutLogindDrivers drops the drivers that reboot through logind when
// logind does not answer, so that no transition is published that this
// node cannot perform; the reason shows in status and doctor.
func withoutLogindDrivers(ctx context.Context, drv []drivers.Driver, logind *host.Logind, log *slog.Logger) ([]drivers.Driver, []UnpublishedDriver) {
	var why string
	if logind == nil {
		why = "host.mode is real and logind is not used"
	} else {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := logind.InhibitDelayMax(pctx)
		cancel()
		if err == nil {
			return drv, nil
		}
		why = "host.mode is real and systemd-logind does not answer on D-Bus (" + err.Error() + "); start it, then restart the agent"
	}
	var keep []drivers.Driver
	var out []UnpublishedDriver
	for _, d := range drv {
		if logindDrivers[d.Short()] {
			out = append(out, UnpublishedDriver{Driver: d.Name(), Reason: why})
			log.Warn("driver not published: it needs logind", "driver", d.Name(), "reason", why)
			continue
		}
		keep = append(keep, d)
	}
	return keep, out
}

// startNeeds starts the reboot-required detector (internal/needs) unless
// both its sentinels are off and there are no GPUs to ask for a reboot
// (gpu: the GPU monitor runs and reports its cause); nil when off.
func startNeeds(ctx context.Context, cfg *config.Config, api *apiclient.Client, j *journal.Journal, bootID string, gpu bool, reg prometheus.Registerer, log *slog.Logger, clk clock.Clock) (*needs.Reboot, error) {
	nc := needs.Config{
		SentinelFile: cfg.Needs.Reboot.SentinelFile, SentinelCommand: cfg.Needs.Reboot.SentinelCommand,
		CommandTimeout: cfg.Needs.Reboot.CommandTimeout, Interval: cfg.Needs.Reboot.Interval, GPU: gpu,
		Sink: api, Registerer: reg, Clock: clk, Log: log,
	}
	if !nc.Enabled() {
		log.Info("reboot-required detection is off (needs.reboot.sentinelFile and sentinelCommand are empty, no GPUs)")
		return nil, nil
	}
	if cfg.Needs.Reboot.Policy == config.PolicyRequest {
		// config.Load refused request without the reboot driver.
		rq := cfg.Needs.Reboot.Request
		req, err := needs.NewRequester(needs.RequestConfig{Need: "reboot", KeyPrefix: needs.RebootKey,
			Group: rq.Group, MaxConcurrent: rq.MaxConcurrent, BreakerFailures: rq.BreakerFailures,
			API: requestAPI{api}, Journal: j, Registerer: reg, Clock: clk, Log: log})
		if err != nil {
			return nil, err
		}
		transition := cfg.NodeName + "-" + config.DriverReboot
		nc.OnNeed = func(ctx context.Context, c apiclient.NodeCondition) {
			if c.Status != corev1.ConditionTrue {
				req.Release(ctx, needs.RebootKey)
				return
			}
			ev := needs.RebootEvent(cfg.NodeName, transition, bootID, c.Message)
			if err := req.Request(ctx, needs.RebootKey, ev); err != nil && !errors.Is(err, needs.ErrBreakerOpen) {
				log.Warn("requesting a reboot failed; retrying at the next evaluation", "err", err)
			}
		}
		go req.Run(ctx)
	}
	r, err := needs.NewReboot(nc)
	if err != nil {
		return nil, err
	}
	go r.Run(ctx)
	return r, nil
}

// requestAPI is the Requester's view of the client.
type requestAPI struct{ *apiclient.Client }

func (a requestAPI) CreateEvent(ctx context.Context, ev *v1alpha1.LifecycleEvent) error {
	_, err := a.LC.Events.Create(ctx, ev, metav1.CreateOptions{})
	return err
}
