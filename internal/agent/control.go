package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
	"github.com/lifecycle-agent/lifecycle-agent/internal/apiclient"
	"github.com/lifecycle-agent/lifecycle-agent/internal/config"
	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
	"github.com/lifecycle-agent/lifecycle-agent/internal/engine"
	"github.com/lifecycle-agent/lifecycle-agent/internal/journal"
)

// The control socket (root-only, cfg.SocketPath) serves HTTP to the local
// commands:
//
//	GET  /status        StatusView: the engine's snapshot, host mode, queued requests
//	POST /request       RequestBody → engine.RequestResult (400: refused)
//	GET  /event?name=N  EventView (404: gone, never seen in the journal)
//
// One agent owns the socket. A second `run` refuses to start while
// something answers on it (naming the process, from SO_PEERCRED), removes
// only a stale socket nobody answers on, and at exit removes the socket
// only while the file is still the one it created.

// localRequestDriver is the journal's driver name for a queued local
// request (engine's requestDriver): such records are the queue, not events.
const localRequestDriver = "local-request"

// ErrSocketBusy: another process serves the control socket.
var ErrSocketBusy = errors.New("agent: control socket in use")

// checkSocketFree fails with ErrSocketBusy when a process answers on path.
// A socket file nobody answers on is stale (an agent killed with SIGKILL):
// it is left for listenControl to replace.
func checkSocketFree(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent: control socket %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("agent: control socket %s: the path exists and is not a socket; remove it or set socketPath", path)
	}
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return nil // stale
	}
	defer c.Close()
	who := "another process"
	if uc, ok := c.(*net.UnixConn); ok {
		if p := peerProcess(uc); p != "" {
			who = p
		}
	}
	return fmt.Errorf("%w: %s already serves %s; stop it first (systemctl stop lifecycle-agent), or give this agent its own --socket",
		ErrSocketBusy, who, path)
}

// peerProcess names the process at the other end of c: "pid 42
// (lifecycle-agent run --journal /x)", or "" when the kernel does not say.
func peerProcess(c *net.UnixConn) string {
	raw, err := c.SyscallConn()
	if err != nil {
		return ""
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil || cred == nil || cred.Pid <= 0 {
		return ""
	}
	s := fmt.Sprintf("pid %d", cred.Pid)
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cred.Pid)); err == nil && len(b) > 0 {
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		args[0] = filepath.Base(args[0])
		cmd := strings.Join(args, " ")
		if len(cmd) > 120 {
			cmd = cmd[:117] + "..."
		}
		s += " (" + cmd + ")"
	}
	return s
}

// listenControl binds the control socket (after checkSocketFree) and
// returns a remove function that deletes the file only while it is still
// the one bound here: a socket another process bound since is not touched.
func listenControl(path string) (net.Listener, func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, nil, fmt.Errorf("agent: control socket directory: %w", err)
	}
	if err := checkSocketFree(path); err != nil {
		return nil, nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("agent: removing the stale control socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("agent: control socket %s: %w", path, err)
	}
	// We remove the file ourselves, and only if it is still ours.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, nil, fmt.Errorf("agent: control socket %s: %w", path, err)
	}
	mine, err := os.Lstat(path)
	if err != nil {
		_ = l.Close()
		return nil, nil, fmt.Errorf("agent: control socket %s: %w", path, err)
	}
	remove := func() {
		if now, err := os.Lstat(path); err == nil && os.SameFile(mine, now) {
			_ = os.Remove(path)
		}
	}
	return l, remove, nil
}

// StatusView is GET /status: the engine's snapshot and what the agent
// knows beyond it.
type StatusView struct {
	engine.Snapshot
	// HostMode is host.mode: "real", or "simulate" (host actions are
	// logged and journaled, never performed).
	HostMode string `json:"hostMode"`
	// Queued counts local requests kept in the journal until the API
	// server answers.
	Queued int `json:"queued"`
	// Unpublished lists drivers the configuration enables but whose host
	// prerequisites are missing, with why.
	Unpublished []UnpublishedDriver `json:"unpublished,omitempty"`
}

// UnpublishedDriver is a driver the agent does not publish, and why.
type UnpublishedDriver struct {
	Driver string `json:"driver"`
	Reason string `json:"reason"`
}

// controlState is what the control socket reads besides the engine.
type controlState struct {
	eng         *engine.Engine
	journal     *journal.Journal
	hostMode    string
	unpublished []UnpublishedDriver
	log         *slog.Logger
}

// historyOutcome finds the latest finished event named name in the
// journal's history (local request records excluded).
func (cs *controlState) historyOutcome(name string) (journal.HistoryRecord, bool) {
	h, err := cs.journal.History()
	if err != nil {
		return journal.HistoryRecord{}, false
	}
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Event.Name == name && h[i].Event.Driver != localRequestDriver {
			return h[i], true
		}
	}
	return journal.HistoryRecord{}, false
}

func (cs *controlState) queued() int {
	recs, err := cs.journal.Events()
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range recs {
		if r.Driver == localRequestDriver {
			n++
		}
	}
	return n
}

func (cs *controlState) handler() http.Handler {
	smux := http.NewServeMux()
	smux.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		v := StatusView{Snapshot: cs.eng.Snapshot(), HostMode: cs.hostMode, Queued: cs.queued(), Unpublished: cs.unpublished}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
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
		for _, u := range cs.unpublished {
			if u.Driver == req.Driver || strings.HasSuffix(u.Driver, "/"+req.Driver) {
				writeErr(w, http.StatusBadRequest, fmt.Sprintf("driver %s is not published on this node: %s", req.Driver, u.Reason))
				return
			}
		}
		res, err := cs.eng.Request(r.Context(), req.Driver, req.Params)
		if err != nil {
			code := http.StatusInternalServerError
			if errors.Is(err, engine.ErrUnknownDriver) || errors.Is(err, drivers.ErrBadParameter) {
				code = http.StatusBadRequest
			}
			writeErr(w, code, strings.TrimPrefix(err.Error(), "engine: "))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})
	smux.HandleFunc("/event", func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		out := EventView{Name: name, Queued: cs.eng.Queued(name), Source: "journal"}
		if out.Queued {
			// Not yet published: the agent's own record of it (the API
			// server did not answer the create).
			out.Source = "agent"
			writeJSON(w, out)
			return
		}
		fromHistory := func() bool {
			h, ok := cs.historyOutcome(name)
			if ok {
				out.Outcome, out.Status.Message, out.Source = h.Outcome.String(), h.Message, "journal"
			}
			return ok
		}
		ev, err := cs.eng.Event(r.Context(), name)
		switch {
		case err == nil:
			out.Status, out.Source = ev.Status, "api"
		case apiclient.IsNotFound(err):
			out.Gone = true
			if !fromHistory() {
				writeErr(w, http.StatusNotFound, fmt.Sprintf("event %s does not exist: cancelled before it ended, or never bound to this node", name))
				return
			}
		default:
			// The API server does not answer: what the agent itself knows.
			out.APIError = err.Error()
			if s := cs.eng.Snapshot(); s.Event != nil && s.Event.Name == name {
				out.Source = "agent"
				out.Status.ClaimStatus = v1alpha1.LifecycleEventClaimStatus(s.Event.ClaimStatus)
				out.Status.CurrentStep, out.Status.Message = s.Event.CurrentStep, s.Event.Message
			} else if !fromHistory() {
				writeErr(w, http.StatusBadGateway, "the API server did not answer: "+err.Error())
				return
			}
		}
		writeJSON(w, out)
	})
	return smux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// serve starts the metrics/healthz listener and the control socket.
func serve(ctx context.Context, cfg *config.Config, mh http.Handler, cs *controlState, log *slog.Logger) (func(), error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", mh)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := cs.eng.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	sl, removeSocket, err := listenControl(cfg.SocketPath)
	if err != nil {
		return nil, err
	}
	ml, err := net.Listen("tcp", cfg.MetricsAddress)
	if err != nil {
		_ = sl.Close()
		removeSocket()
		return nil, fmt.Errorf("agent: metrics listener on %s: %w", cfg.MetricsAddress, err)
	}
	msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = msrv.Serve(ml) }()
	ssrv := &http.Server{Handler: cs.handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = ssrv.Serve(sl) }()
	log.Info("serving", "metrics", ml.Addr().String(), "socket", cfg.SocketPath)
	return func() {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = msrv.Shutdown(c)
		_ = ssrv.Shutdown(c)
		removeSocket()
	}, nil
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
	// Gone: the event no longer exists in the API; Outcome says how it
	// ended, from the journal's history.
	Gone bool `json:"gone,omitempty"`
	// Outcome is the journal's record of the end: Succeeded, Failed,
	// SlaExpired or Cancelled ("" while none).
	Outcome string `json:"outcome,omitempty"`
	// Source of Status: "api", "agent" (the API server did not answer:
	// the engine's own view) or "journal".
	Source string `json:"source,omitempty"`
	// APIError is set when the API server did not answer.
	APIError string `json:"apiError,omitempty"`
}

type errorBody struct {
	Error string `json:"error"`
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(errorBody{Error: msg})
}

// ErrGone says the event no longer exists and the journal has no record
// of its end.
type ErrGone struct{ Msg string }

func (e *ErrGone) Error() string { return e.Msg }

// ErrRefused is an error the agent returned for a bad request.
type ErrRefused struct{ Msg string }

func (e *ErrRefused) Error() string { return e.Msg }

// ErrUnavailable: the agent did not answer on its socket, or answered that
// the API server does not. Permission is set when the socket refused this
// user (it is root-only): retrying does not help.
type ErrUnavailable struct {
	Msg        string
	Permission bool
	// AgentDown: the agent itself did not answer (not the API server).
	AgentDown bool
}

func (e *ErrUnavailable) Error() string { return e.Msg }

// socketTimeout bounds one request on the control socket.
const socketTimeout = 30 * time.Second

// socketClient talks HTTP over the control socket.
func socketClient(socket string, timeout time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}, Timeout: timeout}
}

// unreachable turns a failed request on the socket into one line: what,
// why, what to do (no "Get http://agent/...: dial unix" transcript).
func unreachable(socket string, err error, timeout time.Duration) error {
	switch {
	case errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		return &ErrUnavailable{Permission: true, AgentDown: true,
			Msg: fmt.Sprintf("permission denied on %s: the control socket is root-only; run this command as root (sudo)", socket)}
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOENT):
		return &ErrUnavailable{AgentDown: true,
			Msg: fmt.Sprintf("the agent is not running: no control socket at %s; start it: systemctl start lifecycle-agent", socket)}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &ErrUnavailable{AgentDown: true,
			Msg: fmt.Sprintf("the agent is not running: nobody answers on %s; start it: systemctl start lifecycle-agent", socket)}
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return &ErrUnavailable{AgentDown: true,
			Msg: fmt.Sprintf("the agent did not answer on %s within %s; see journalctl -u lifecycle-agent", socket, timeout)}
	}
	var se *os.SyscallError
	if errors.As(err, &se) {
		err = se.Err
	}
	return &ErrUnavailable{AgentDown: true, Msg: fmt.Sprintf("cannot reach the agent at %s: %v", socket, err)}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// call does one request on the socket and decodes a 200 answer into out.
func call(ctx context.Context, socket, method, path string, body []byte, timeout time.Duration, out any) (int, string, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, rd)
	if err != nil {
		return 0, "", err
	}
	resp, err := socketClient(socket, timeout).Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return 0, "", ctx.Err()
		}
		return 0, "", unreachable(socket, err, timeout)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&eb)
		if eb.Error == "" {
			eb.Error = resp.Status
		}
		return resp.StatusCode, eb.Error, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return 0, "", fmt.Errorf("agent: undecodable answer on %s: %w", socket, err)
	}
	return http.StatusOK, "", nil
}

// StatusFromSocket asks a running agent for its status.
func StatusFromSocket(ctx context.Context, socket string) (StatusView, error) {
	var s StatusView
	code, msg, err := call(ctx, socket, http.MethodGet, "/status", nil, 5*time.Second, &s)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("agent: %s", msg)
	}
	return s, err
}

// RequestViaSocket asks the running agent to create (or queue) an event.
func RequestViaSocket(ctx context.Context, socket string, body RequestBody) (engine.RequestResult, error) {
	var res engine.RequestResult
	b, _ := json.Marshal(body)
	code, msg, err := call(ctx, socket, http.MethodPost, "/request", b, socketTimeout, &res)
	switch {
	case err != nil:
		return res, err
	case code == http.StatusBadRequest:
		return res, &ErrRefused{Msg: msg}
	case code != http.StatusOK:
		return res, fmt.Errorf("agent: %s", msg)
	}
	return res, nil
}

// EventViaSocket reads an event's status through the agent.
func EventViaSocket(ctx context.Context, socket, name string) (EventView, error) {
	var v EventView
	code, msg, err := call(ctx, socket, http.MethodGet, "/event?name="+url.QueryEscape(name), nil, socketTimeout, &v)
	switch {
	case err != nil:
		return v, err
	case code == http.StatusNotFound:
		return v, &ErrGone{Msg: msg}
	case code == http.StatusBadGateway:
		return v, &ErrUnavailable{Msg: msg}
	case code != http.StatusOK:
		return v, fmt.Errorf("agent: %s", msg)
	}
	return v, nil
}
