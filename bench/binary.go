package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// Daemon is bin/lifecycle-agent run, started as systemd would: with a
// NOTIFY_SOCKET this harness listens on, so READY=1 is seen as systemd sees
// it, and DBUS_SYSTEM_BUS_ADDRESS pointing at the test logind.
type Daemon struct {
	Cmd     *exec.Cmd
	Started time.Time // just before exec
	Ready   time.Time // READY=1 received
	Log     *bytes.Buffer
	// Metrics is the agent's own /metrics URL.
	Metrics string
	sock    *net.UnixConn
	ready   chan struct{}
	exited  chan struct{}
	waitErr error
}

// DaemonOptions configure StartDaemon.
type DaemonOptions struct {
	Bin        string // bin/lifecycle-agent
	Dir        string // journal, socket, config, notify socket
	Node       string
	Kubeconfig string
	// Bus is the D-Bus address of the (test) logind; empty: none.
	Bus string
	// Journal, if set, is used instead of <Dir>/journal.db.
	Journal string
	// Cgroup, if set, is the memory cgroup the agent runs in from its
	// first instruction (MemCgroup.Wrap).
	Cgroup *MemCgroup
	// Args are added to the agent's command line.
	Args []string
}

// StartDaemon starts the agent binary.
func StartDaemon(o DaemonOptions) (*Daemon, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(o.Dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte("# lifecycle-bench: everything on the command line\n"), 0o600); err != nil {
		return nil, err
	}
	port, err := testenv.FreePort()
	if err != nil {
		return nil, err
	}
	notify := filepath.Join(o.Dir, "notify.sock")
	_ = os.Remove(notify)
	sock, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	journal := o.Journal
	if journal == "" {
		journal = filepath.Join(o.Dir, "journal.db")
	}
	d := &Daemon{Log: &bytes.Buffer{}, sock: sock, ready: make(chan struct{}), exited: make(chan struct{}),
		Metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port)}
	argv := []string{o.Bin, "run", "--config", cfgPath, "--node-name", o.Node, "--kubeconfig", o.Kubeconfig,
		"--journal", journal, "--socket", filepath.Join(o.Dir, "agent.sock"),
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "--host-mode", "simulate", "--log-level", "info"}
	argv = append(argv, o.Args...)
	if o.Cgroup != nil {
		argv = o.Cgroup.Wrap(argv)
	}
	d.Cmd = exec.Command(argv[0], argv[1:]...)
	env := []string{"NOTIFY_SOCKET=" + notify}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LIFECYCLE_AGENT_") && !strings.HasPrefix(kv, "NOTIFY_SOCKET=") && !strings.HasPrefix(kv, "DBUS_SYSTEM_BUS_ADDRESS=") {
			env = append(env, kv)
		}
	}
	if o.Bus != "" {
		env = append(env, "DBUS_SYSTEM_BUS_ADDRESS="+o.Bus)
	} else {
		env = append(env, "DBUS_SYSTEM_BUS_ADDRESS=unix:path="+filepath.Join(o.Dir, "no-bus"))
	}
	d.Cmd.Env = env
	d.Cmd.Stdout, d.Cmd.Stderr = &syncWriter{b: d.Log}, &syncWriter{b: d.Log}
	d.Cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := sock.Read(buf)
			if err != nil {
				return
			}
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				if line == "READY=1" {
					d.Ready = time.Now()
					close(d.ready)
				}
			}
		}
	}()
	d.Started = time.Now()
	if err := d.Cmd.Start(); err != nil {
		sock.Close()
		return nil, err
	}
	go func() { d.waitErr = d.Cmd.Wait(); close(d.exited) }()
	return d, nil
}

// WaitReady waits for READY=1 and returns the time from exec to it.
func (d *Daemon) WaitReady(timeout time.Duration) (time.Duration, error) {
	select {
	case <-d.ready:
		return d.Ready.Sub(d.Started), nil
	case <-d.exited:
		return 0, fmt.Errorf("bench: the agent exited before READY=1 (%v):\n%s", d.waitErr, d.Log.String())
	case <-time.After(timeout):
		return 0, fmt.Errorf("bench: no READY=1 after %s:\n%s", timeout, d.Log.String())
	}
}

// Stop sends SIGTERM and waits (SIGKILL after 20 s).
func (d *Daemon) Stop() error {
	defer d.sock.Close()
	select {
	case <-d.exited:
		return nil
	default:
	}
	_ = d.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return nil
	case <-time.After(20 * time.Second):
		_ = d.Cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("bench: the agent did not stop on SIGTERM within 20s")
	}
}

type syncWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.b.Len() > 4<<20 {
		return len(p), nil // keep the first 4 MiB
	}
	return w.b.Write(p)
}

// ScrapeGauges reads the agent's own /metrics and returns the samples of
// the named metrics (without labels).
func (d *Daemon) ScrapeGauges(names ...string) (map[string]float64, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(d.Metrics)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		for _, n := range names {
			if f[0] == n {
				v, err := strconv.ParseFloat(f[1], 64)
				if err == nil {
					out[n] = v
				}
			}
		}
	}
	return out, nil
}

// startLogind starts the test logind on a private dbus-daemon in a short
// temporary directory (the socket path is limited to 108 bytes).
func startLogindDir() (string, error) { return os.MkdirTemp("", "lcb-logind-") }

// waitCtx sleeps d or until ctx ends.
func waitCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
