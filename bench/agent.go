package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/lifecycle-agent/lifecycle-agent/internal/agent"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/hostops"
)

// CheckFileArg is the first argument on which a bench binary (the
// lifecycle-bench command, or a bench test binary) runs the journal's
// integrity check instead of itself: agent.Options.CheckCommand.
const CheckFileArg = "journal-check-file"

// CheckCommand re-executes this binary as the journal's integrity checker
// (the daemon re-executes itself the same way).
func CheckCommand() []string {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	return []string{exe, CheckFileArg}
}

// AgentOptions configure one in-process agent.
type AgentOptions struct {
	Node string
	// Dir holds the journal and the simulated host's state.
	Dir string
	// Rest is the agent's identity (Env.AgentRestConfig).
	Rest *rest.Config
	// Log receives the agent's log; nil discards it.
	Log *slog.Logger
	// LogindAddress, when set, runs the shutdown guard against that bus.
	LogindAddress string
	// Unfiltered watches every event (the comparison of scenario scale).
	Unfiltered bool
	// Configure adjusts the configuration (defaults: simulate mode,
	// eventRetention 0).
	Configure func(*config.Config)
	// Counter, if set, counts every request the agent makes.
	Counter *Counter
	// ExtraDrivers are offered beside the configured ones (the writes
	// scenario's gpu-reset on go-nvml's mock).
	ExtraDrivers []drivers.Driver
}

// Agent is a real agent — internal/agent.Run, the code `lifecycle-agent
// run` runs — in this process, with host actions simulated.
type Agent struct {
	Node    string
	Dir     string
	Journal string
	cancel  context.CancelFunc
	done    chan error
	ready   chan struct{}
	idle    chan struct{}
	idleOne sync.Once
}

// StartAgent starts an agent and returns once it announced READY. Wait for
// Idle to know it watches its events.
func StartAgent(ctx context.Context, o AgentOptions) (*Agent, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	cfg, err := config.Load(config.Options{DefaultPath: filepath.Join(o.Dir, "absent.yaml"), Hostname: func() (string, error) { return o.Node, nil }})
	if err != nil {
		return nil, err
	}
	cfg.NodeName = o.Node
	cfg.JournalPath = filepath.Join(o.Dir, "journal.db")
	cfg.SocketPath = filepath.Join(o.Dir, "agent.sock")
	cfg.Host.Mode = config.HostModeSimulate
	cfg.EventRetention = 0
	if o.Configure != nil {
		o.Configure(cfg)
	}
	if o.Counter != nil {
		o.Rest = rest.CopyConfig(o.Rest)
		o.Rest.WrapTransport = o.Counter.Wrap
	}
	host, err := hostops.NewSimulated(hostops.SimulatedConfig{StateDir: o.Dir, Logger: o.Log})
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(ctx)
	a := &Agent{Node: o.Node, Dir: o.Dir, Journal: cfg.JournalPath, cancel: cancel, done: make(chan error, 1),
		ready: make(chan struct{}), idle: make(chan struct{})}
	go func() {
		a.done <- agent.Run(actx, agent.Options{Config: cfg, Log: o.Log, RestConfig: o.Rest, Host: host,
			CheckCommand: CheckCommand(), NoServers: true, NoLogind: o.LogindAddress == "", LogindAddress: o.LogindAddress,
			NoGPU: true, Ready: a.ready, UnfilteredWatch: o.Unfiltered, ExtraDrivers: o.ExtraDrivers,
			Notify: func(kind, msg string) {
				if kind == "STATUS" && msg == "idle" {
					a.idleOne.Do(func() { close(a.idle) })
				}
			}})
	}()
	select {
	case <-a.ready:
		return a, nil
	case err := <-a.done:
		cancel()
		return nil, fmt.Errorf("bench: agent %s did not start: %w", o.Node, err)
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
}

// Idle is closed once the engine first reached "idle": transitions
// published and the event watch started.
func (a *Agent) Idle() <-chan struct{} { return a.idle }

// Done receives Run's error once the agent stopped.
func (a *Agent) Done() <-chan error { return a.done }

// Stop cancels the agent and waits for it.
func (a *Agent) Stop() error {
	if a.cancel == nil {
		return nil
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil && !errors.Is(err, context.Canceled) && !strings.Contains(err.Error(), "context canceled") {
			return err
		}
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("bench: agent %s did not stop within 30s", a.Node)
	}
}

// FileLogger logs at level and above into path (the agents' logs are kept
// for inspection; nothing is printed).
func FileLogger(path string, level slog.Level) (*slog.Logger, io.Closer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	return slog.New(slog.NewTextHandler(&lockedWriter{w: f}, &slog.HandlerOptions{Level: level})), f, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
