package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

// Options configure Start.
type Options struct {
	// ControllerManager also starts kube-controller-manager with the
	// disruption (PDB status), garbage-collector, namespace, serviceaccount
	// and replicaset controllers.
	ControllerManager bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Dir holds certificates, data and logs; empty means a new temp dir,
	// removed by Stop.
	Dir string
	// AuditLog makes kube-apiserver write an audit log (JSON lines, level
	// Metadata, stage ResponseComplete) of every pod create and delete and
	// every eviction (pods/eviction create), at AuditLogPath.
	AuditLog bool
	// FeatureGates is passed as --feature-gates to kube-apiserver and
	// kube-controller-manager, e.g. "NodeLifecycleConditions=true".
	FeatureGates string
}

// Env is a running control plane.
type Env struct {
	URL    string
	Dir    string
	BinDir string

	pki        *pki
	tokens     map[string]string // user -> token
	procs      []*proc
	ownDir     bool
	log        io.Writer
	stopOnce   sync.Once
	etcdURL    string
	adminToken string
	auditLog   string
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// RepoRoot returns the root of the lifecycle-agent checkout: from this
// file's path as compiled in, or, in a binary built with -trimpath (where
// that path is the module's import path: make demo builds hack/demo so,
// to share make build's compiled packages), the nearest directory at or
// above the working directory whose go.mod is this module's.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	if filepath.IsAbs(file) {
		return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	}
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := wd; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/lifecycle-agent/lifecycle-agent\n")) {
			return d
		}
		if filepath.Dir(d) == d {
			return wd
		}
	}
}

// Binaries builds (or reuses from the cache) the control-plane binaries,
// kube-apiserver, etcd and kube-controller-manager, and returns their
// directory.
func Binaries(ctx context.Context, log io.Writer) (string, error) {
	return binaries(ctx, log, true)
}

// binaries is Binaries with kube-controller-manager only when asked for:
// hack/kubebin.sh builds it (minutes on a cold machine) only with
// --with-controller-manager, into the same cached directory.
func binaries(ctx context.Context, log io.Writer, controllerManager bool) (string, error) {
	if d := os.Getenv("LIFECYCLE_AGENT_KUBEBIN"); d != "" {
		return d, nil
	}
	var args []string
	what := "kube-apiserver and etcd"
	if controllerManager {
		args = append(args, "--with-controller-manager")
		what = "kube-apiserver, etcd and kube-controller-manager"
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(RepoRoot(), "hack", "kubebin.sh"), args...)
	cmd.Stdout = &out
	cmd.Stderr = log
	if cmd.Stderr == nil {
		cmd.Stderr = io.Discard
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("testenv: hack/kubebin.sh failed (it builds %s; needs Go and the module proxy): %w", what, err)
	}
	return strings.TrimSpace(out.String()), nil
}

// freePort is a port free now; a variable so that a test can hand out a
// taken one (TestStartRetriesTakenPort).
var freePort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func token() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start builds (cached) and starts etcd, kube-apiserver and optionally
// kube-controller-manager. Call Stop when done.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	bin, err := binaries(ctx, log, opts.ControllerManager)
	if err != nil {
		return nil, err
	}
	e := &Env{BinDir: bin, log: log, Dir: opts.Dir, tokens: map[string]string{}}
	if e.Dir == "" {
		e.Dir, err = os.MkdirTemp("", "lifecycle-agent-testenv-")
		if err != nil {
			return nil, err
		}
		e.ownDir = true
	}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	if e.pki, err = newPKI(filepath.Join(e.Dir, "pki")); err != nil {
		return nil, fmt.Errorf("testenv: pki: %w", err)
	}
	// Static tokens: user,uid,groups.
	e.adminToken = token()
	users := []struct{ name, groups string }{
		{"test-admin", "system:masters"},
		{"system:node:node-a", "system:nodes"},
		{"system:node:node-b", "system:nodes"},
		{"alice", ""},
	}
	var tok strings.Builder
	for _, u := range users {
		t := token()
		if u.name == "test-admin" {
			t = e.adminToken
		}
		e.tokens[u.name] = t
		fmt.Fprintf(&tok, "%s,%s,uid-%s,%q\n", t, u.name, strings.ReplaceAll(u.name, ":", "-"), u.groups)
	}
	tokFile := filepath.Join(e.pki.dir, "tokens.csv")
	if err := os.WriteFile(tokFile, []byte(tok.String()), 0o600); err != nil {
		return nil, err
	}

	// etcd, on ports picked free just before: another test process may
	// take one in between (go test runs packages in parallel), so a start
	// that fails binding is tried again on new ports.
	if err := e.startRetryingPorts(ctx, "etcd", func(attempt int) error {
		ec, err := freePort()
		if err != nil {
			return err
		}
		ep, err := freePort()
		if err != nil {
			return err
		}
		e.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ec)
		peer := fmt.Sprintf("http://127.0.0.1:%d", ep)
		if err := e.start(ctx, "etcd", filepath.Join(bin, "etcd"),
			"--name", "default", "--data-dir", filepath.Join(e.Dir, fmt.Sprintf("etcd-data-%d", attempt)),
			"--listen-client-urls", e.etcdURL, "--advertise-client-urls", e.etcdURL,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "default="+peer, "--log-level", "warn",
			"--unsafe-no-fsync", "--quota-backend-bytes", strconv.Itoa(2<<30)); err != nil {
			return err
		}
		return e.waitHTTP(ctx, "etcd", e.etcdURL+"/health", nil, func(b []byte) bool { return bytes.Contains(b, []byte(`"health":"true"`)) })
	}); err != nil {
		return nil, err
	}

	// kube-apiserver (its port chosen at each attempt, as etcd's)
	pk := e.pki.dir
	apiArgs := []string{
		"--etcd-servers", e.etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--endpoint-reconciler-type", "none",
		"--tls-cert-file", filepath.Join(pk, "apiserver.crt"), "--tls-private-key-file", filepath.Join(pk, "apiserver.key"),
		"--client-ca-file", filepath.Join(pk, "ca.crt"),
		"--token-auth-file", tokFile, "--anonymous-auth=false",
		"--authorization-mode", "Node,RBAC",
		"--enable-admission-plugins", "NodeRestriction",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", filepath.Join(pk, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(pk, "sa.key"),
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--profiling=false",
		"--max-requests-inflight", "2000", "--max-mutating-requests-inflight", "1000",
	}
	if opts.AuditLog {
		policy := filepath.Join(e.Dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return nil, err
		}
		e.auditLog = filepath.Join(e.Dir, "audit.log")
		apiArgs = append(apiArgs, "--audit-policy-file", policy, "--audit-log-path", e.auditLog,
			"--audit-log-format", "json", "--audit-log-mode", "blocking", "--audit-log-maxsize", "0")
	}
	if opts.FeatureGates != "" {
		apiArgs = append(apiArgs, "--feature-gates", opts.FeatureGates)
	}
	if err := e.startRetryingPorts(ctx, "kube-apiserver", func(int) error {
		port, err := freePort()
		if err != nil {
			return err
		}
		e.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
		if err := e.start(ctx, "kube-apiserver", filepath.Join(bin, "kube-apiserver"), append(apiArgs, "--secure-port", strconv.Itoa(port))...); err != nil {
			return err
		}
		return e.waitHTTP(ctx, "kube-apiserver", e.URL+"/readyz", map[string]string{"Authorization": "Bearer " + e.adminToken},
			func(b []byte) bool { return string(b) == "ok" })
	}); err != nil {
		return nil, err
	}

	if opts.ControllerManager {
		cert, key, err := e.pki.issue("kcm", "system:kube-controller-manager", nil, false)
		if err != nil {
			return nil, err
		}
		kc := filepath.Join(e.Dir, "kcm.kubeconfig")
		if err := WriteKubeconfig(kc, &rest.Config{Host: e.URL, TLSClientConfig: rest.TLSClientConfig{CAData: e.pki.caPEM, CertData: cert, KeyData: key}}); err != nil {
			return nil, err
		}
		kcmArgs := []string{"--kubeconfig", kc, "--leader-elect=false",
			"--controllers", "disruption,garbagecollector,namespace,serviceaccount,serviceaccount-token,replicaset",
			"--service-account-private-key-file", filepath.Join(pk, "sa.key"),
			"--root-ca-file", filepath.Join(pk, "ca.crt"),
			"--use-service-account-credentials=true",
			"--bind-address", "127.0.0.1", "--secure-port", "0"}
		if opts.FeatureGates != "" {
			kcmArgs = append(kcmArgs, "--feature-gates", opts.FeatureGates)
		}
		if err := e.start(ctx, "kube-controller-manager", filepath.Join(bin, "kube-controller-manager"), kcmArgs...); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(log, "testenv: control plane at %s (dir %s)\n", e.URL, e.Dir)
	return e, nil
}

func (e *Env) start(ctx context.Context, name, path string, args ...string) error {
	lf, err := os.Create(filepath.Join(e.Dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// etcd reads every ETCD_* variable as a flag: give it a clean environment.
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		lf.Close()
		return fmt.Errorf("testenv: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); lf.Close(); close(p.done) }()
	e.procs = append(e.procs, p)
	return nil
}

// startRetryingPorts runs start (attempt 1, 2, 3) until the component it
// starts does not fail on a port another process took since freePort.
func (e *Env) startRetryingPorts(ctx context.Context, name string, start func(attempt int) error) error {
	for attempt := 1; ; attempt++ {
		err := start(attempt)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
		fmt.Fprintf(e.log, "testenv: %s lost a port to another process; trying new ports (attempt %d)\n", name, attempt+1)
		e.forget(name)
	}
}

// forget stops and drops the processes named name.
func (e *Env) forget(name string) {
	kept := e.procs[:0]
	for _, p := range e.procs {
		if p.name != name {
			kept = append(kept, p)
			continue
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	e.procs = kept
}

func (e *Env) proc(name string) *proc {
	for _, p := range e.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

func (e *Env) waitHTTP(ctx context.Context, name, url string, hdr map[string]string, ok func([]byte) bool) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: e.tlsConfig()}}
	deadline := time.Now().Add(120 * time.Second)
	p := e.proc(name)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if resp, err := client.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ok(b) {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("testenv: %s exited (%v); last log lines:\n%s", name, p.err, e.tail(name, 30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("testenv: %s not ready after 120s; last log lines:\n%s", name, e.tail(name, 30))
}

func (e *Env) tail(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(e.Dir, name+".log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Stop stops every process (SIGTERM, then SIGKILL after 10 s), apiserver
// first, and removes the directory if Start created it.
func (e *Env) Stop() {
	e.stopOnce.Do(func() {
		for i := len(e.procs) - 1; i >= 0; i-- {
			p := e.procs[i]
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
		if e.ownDir && e.Dir != "" {
			_ = os.RemoveAll(e.Dir)
		}
	})
}

// StopProcess stops one process by name (for outage tests) and returns a
// function that starts it again with the same arguments.
func (e *Env) StopProcess(name string) (restart func(context.Context) error, err error) {
	p := e.proc(name)
	if p == nil {
		return nil, fmt.Errorf("testenv: no process %s", name)
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	args := p.cmd.Args[1:]
	path := p.cmd.Path
	return func(ctx context.Context) error {
		for i, q := range e.procs {
			if q == p {
				e.procs = append(e.procs[:i], e.procs[i+1:]...)
				break
			}
		}
		if err := e.start(ctx, name, path, args...); err != nil {
			return err
		}
		if name == "kube-apiserver" {
			return e.waitHTTP(ctx, name, e.URL+"/readyz", map[string]string{"Authorization": "Bearer " + e.adminToken},
				func(b []byte) bool { return string(b) == "ok" })
		}
		return nil
	}, nil
}

// PIDs returns the process IDs of the running control-plane processes.
func (e *Env) PIDs() map[string]int {
	m := map[string]int{}
	for _, p := range e.procs {
		select {
		case <-p.done:
		default:
			m[p.name] = p.cmd.Process.Pid
		}
	}
	return m
}

// AuditLogPath is kube-apiserver's audit log (Options.AuditLog), or "".
func (e *Env) AuditLogPath() string { return e.auditLog }

// auditPolicy records pod creates and deletes and evictions, once each
// (ResponseComplete), with their response codes.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  verbs: ["create", "delete", "deletecollection"]
  resources:
  - group: ""
    resources: ["pods", "pods/eviction"]
- level: None
`

var errNoToken = errors.New("testenv: no static token")
