package crash

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
	"github.com/lifecycle-agent/lifecycle-agent/test/testenv"
)

// agentProc is one run of the real agent binary.
type agentProc struct {
	cmd     *exec.Cmd
	log     string
	metrics string // host:port of /metrics
	gofail  string // host:port of gofail's HTTP endpoint, when crashCase.gofailHTTP
	done    chan struct{}
	err     error // cmd.Wait's, valid once done is closed
}

// agentConfig is the config file every agent of the crash test reads:
// finished events are kept (the test reads them), PDB-refused evictions are
// retried quickly, and the log says what happened at debug level.
const agentConfig = `logLevel: debug
eventRetention: 1h
drain:
  evictRetryDelay: 500ms
`

// start runs `lifecycle-agent run` as system:node:<node> on the case's
// journal; failpoints, when not empty, is GOFAIL_FAILPOINTS.
func (c *crashCase) start(t *testing.T, failpoints string) *agentProc {
	t.Helper()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c.runs++
	a := &agentProc{log: filepath.Join(c.dir, fmt.Sprintf("agent-%d.log", c.runs)), done: make(chan struct{})}
	lf, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.metrics = fmt.Sprintf("127.0.0.1:%d", port)
	mode := c.hostMode
	if mode == "" {
		mode = "simulate"
	}
	cmd := exec.Command(agentFP.Path, "run", "--host-mode", mode, "--node-name", c.node,
		"--kubeconfig", c.kubeconfig, "--journal", c.journal(), "--socket", c.socket(),
		"--metrics-address", a.metrics, "--config", c.config())
	cmd.Env = append(agentEnv(failpoints), c.extraEnv...)
	if c.gofailHTTP {
		fp, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		a.gofail = fmt.Sprintf("127.0.0.1:%d", fp)
		cmd.Env = append(cmd.Env, "GOFAIL_HTTP="+a.gofail)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("start %s: %v", agentFP.Path, err)
	}
	a.cmd = cmd
	go func() { a.err = cmd.Wait(); lf.Close(); close(a.done) }()
	c.logs = append(c.logs, a.log)
	t.Cleanup(func() { a.kill() })
	return a
}

// agentEnv is this process's environment without the agent's own settings
// (LIFECYCLE_AGENT_*) and failpoints, plus failpoints when given.
func agentEnv(failpoints string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LIFECYCLE_AGENT_") || strings.HasPrefix(kv, "GOFAIL_") || strings.HasPrefix(kv, "KUBECONFIG=") {
			continue
		}
		env = append(env, kv)
	}
	if failpoints != "" {
		env = append(env, "GOFAIL_FAILPOINTS="+failpoints)
	}
	return env
}

func (a *agentProc) exited() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the agent (by its pid) and waits for it.
func (a *agentProc) kill() {
	if a.cmd == nil || a.exited() {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
}

// stop sends SIGTERM and waits up to timeout; it reports whether the agent
// exited by itself with status 0.
func (a *agentProc) stop(timeout time.Duration) error {
	if !a.exited() {
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-a.done:
	case <-time.After(timeout):
		a.kill()
		return fmt.Errorf("agent did not stop within %s of SIGTERM (killed)", timeout)
	}
	if a.err != nil {
		return fmt.Errorf("agent exited after SIGTERM: %w (%s)", a.err, a.exit())
	}
	return nil
}

// exit describes how the process ended.
func (a *agentProc) exit() string {
	st := a.cmd.ProcessState
	if st == nil {
		return "running"
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", st.ExitCode())
}

func (a *agentProc) exitCode() int {
	if a.cmd.ProcessState == nil {
		return -1
	}
	return a.cmd.ProcessState.ExitCode()
}

func (a *agentProc) logText() string {
	b, _ := os.ReadFile(a.log)
	return string(b)
}

// tail returns the last n lines of the agent's log.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// agentStatus is the part of the control socket's GET /status (engine
// Snapshot) the test reads.
type agentStatus struct {
	Event *struct {
		Name string `json:"name"`
	} `json:"event"`
	State      string        `json:"state"`
	Outbox     int           `json:"outboxDepth"`
	Unfinished int           `json:"unfinished"`
	History    []historyItem `json:"history"`
}

type historyItem struct {
	Name    string `json:"name"`
	Outcome string `json:"outcome"`
}

func statusFromSocket(ctx context.Context, socket string) (agentStatus, error) {
	var s agentStatus
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}}
	defer c.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/status", nil)
	resp, err := c.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("GET /status: %s", resp.Status)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// exportJournal runs `lifecycle-agent journal export` on a stopped agent's
// journal.
func (c *crashCase) exportJournal() (*journal.ExportDoc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, agentFP.Path, "journal", "export", "--journal", c.journal(), "--config", c.config())
	cmd.Env = agentEnv("")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("journal export: %w\n%s", err, stderr.String())
	}
	var doc journal.ExportDoc
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		return nil, fmt.Errorf("journal export: decode: %w\n%s", err, stdout.String())
	}
	return &doc, nil
}

// evictions counts the eviction requests (pods/eviction create) for pods of
// namespace ns in the audit log, by pod and response code, and by user.
type evictions struct {
	accepted   map[string]int // pod -> requests answered 201
	acceptedAt []time.Time    // when each 201 was answered (the audit stage timestamp)
	refused    int            // answered 429 (PodDisruptionBudget)
	other      []string       // any other answer: "pod code"; a request cut by a kill ends 504
	users      map[string]int
}

func auditEvictions(ns string) (evictions, error) {
	ev := evictions{accepted: map[string]int{}, users: map[string]int{}}
	reqs, err := testenv.PodRequests(env.AuditLogPath(), ns)
	if err != nil {
		return ev, err
	}
	for _, r := range reqs {
		if r.Verb != "create" || r.Subresource != "eviction" {
			continue
		}
		ev.users[r.User]++
		switch r.Code {
		case http.StatusCreated:
			ev.accepted[r.Pod]++
			ev.acceptedAt = append(ev.acceptedAt, r.At)
		case http.StatusTooManyRequests:
			ev.refused++
		default:
			ev.other = append(ev.other, fmt.Sprintf("%s %d", r.Pod, r.Code))
		}
	}
	return ev, nil
}

var errTimeout = errors.New("timed out")
