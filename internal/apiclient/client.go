package apiclient

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lifecycle-agent/lifecycle-agent/api/v1alpha1"
)

// http2HealthCheck: after 6 s without a frame read the transport pings
// (17 bytes, answered by the server's connection loop, not a request), and
// closes the connection when no answer came within 3 s more: a dead
// connection is found at most 9 s after its last frame (client-go's
// default is 30 s + 15 s). An idle agent's watch connection carries about
// one frame a minute (bookmarks), so it is pinged every 6 s; at 3 s (until
// 2026-12-07) the pings were 40-50 % of an idle agent's CPU
// (docs/bench/2026-12-07-http2-ping). Longer costs the time to find a
// half-open connection: at 8 s + 3 s a claim after a half-open outage
// came up to 14 s after the heal, against docs/reliability.md's bound of
// 15 s (test/e2e TestClaimsAfterEveryOutage).
var http2HealthCheck = map[string]string{"HTTP2_READ_IDLE_TIMEOUT_SECONDS": "6", "HTTP2_PING_TIMEOUT_SECONDS": "3"}

// firstByteTimeout bounds how long a new connection may stay silent: a
// server that has not sent its first byte (the TLS ServerHello) by then is
// not there, whatever client-go's 10 s TLS handshake timeout would wait.
const firstByteTimeout = 3 * time.Second

// The claim lane's token bucket (New): one claim per event takes two or
// three of its tokens, so it never runs dry however events follow each
// other (the main bucket, 20 QPS, bounds them).
const (
	claimQPS   = 10
	claimBurst = 20
)

// firstByteConn fails reads and writes of a new connection after a
// deadline until the first byte arrives, then lifts the deadline: after
// that the HTTP/2 health check watches the connection.
type firstByteConn struct {
	net.Conn
	once sync.Once
}

func newFirstByteConn(c net.Conn, d time.Duration) net.Conn {
	_ = c.SetDeadline(time.Now().Add(d))
	return &firstByteConn{Conn: c}
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(func() { _ = c.Conn.SetDeadline(time.Time{}) })
	}
	return n, err
}

// Client bundles the clients the agent uses, for one node.
type Client struct {
	Node    string
	Core    kubernetes.Interface
	LC      *LifecycleClients
	watchLC *LifecycleClients // LC without the client-side timeout, for watches
	// claimLC is LC on the same connections with a rate limiter of its
	// own, for the claim's writes (the claim lane, see New).
	claimLC *LifecycleClients
	evicts  *evictionRecorder
	restCfg *rest.Config
	contact *Contact

	// FormerIdentities are identities this agent held Leases under before
	// (an older agent's, on the same journal): a Lease they hold is ours,
	// renewed and released under the current identity.
	FormerIdentities []string

	watchCoreOnce sync.Once
	watchCore     kubernetes.Interface // watchClients

	leaseMu   sync.Mutex
	nodeLease *v1alpha1.LifecycleLease // as our last write of it returned
	condMu    sync.Mutex
	nodeConds []corev1.NodeCondition // as our last condition patch returned

	transitions transitionsHolder // WatchTransitions
}

// LoadConfig reads a kubeconfig file (the kubelet's, by default).
func LoadConfig(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("apiclient: kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// New builds a Client for node from cfg. Requests time out after timeout
// (0 means 30 s) so an unreachable server never blocks a step for long.
func New(cfg *rest.Config, node string, timeout time.Duration) (*Client, error) {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	c := rest.CopyConfig(cfg)
	c.Timeout = timeout
	// A dead connection must be found in seconds, not the 30 s + 15 s of
	// client-go's default HTTP/2 health check: until it is, every request
	// and the event watch sit on it and the agent is deaf (the server is
	// back, the connection is not). client-go reads these at transport
	// creation; an operator's own setting wins.
	for k, v := range http2HealthCheck {
		if _, set := os.LookupEnv(k); !set {
			_ = os.Setenv(k, v)
		}
	}
	// A dialer of our own gives this client transports of its own (client-go
	// shares one per TLS configuration otherwise, created with whatever
	// health-check settings were in force then), so the requests and the
	// watch do not share one connection either: a stuck watch never stalls
	// a claim, and the other way round.
	if c.Dial == nil {
		d := &net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newFirstByteConn(conn, firstByteTimeout), nil
		}
	}
	if c.QPS == 0 {
		c.QPS, c.Burst = 20, 40
	}
	rec := &evictionRecorder{blocked: map[string]string{}}
	contact := newContact(time.Now)
	prev := c.WrapTransport
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &evictionTransport{next: &contactTransport{next: rt, c: contact}, rec: rec}
	}
	core, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("apiclient: %w", err)
	}
	lc, err := NewLifecycleClients(c)
	if err != nil {
		return nil, err
	}
	// The claim lane: the claim's writes (the slot and node Leases taken or
	// renewed, the Claimed status) get a token bucket of their own, so a
	// claim never queues behind the previous event's status, finalizer and
	// deletion writes when the main bucket has run dry (events back to
	// back: bench claim -gap 0 read p99 104 ms, each claim waiting out
	// about 50 ms a request at 20 QPS). It adds at most claimQPS to the
	// agent's ceiling, and a node gets one claim per event.
	cc := rest.CopyConfig(c)
	if cc.RateLimiter == nil {
		cc.QPS, cc.Burst = claimQPS, claimBurst
	}
	claim, err := newLifecycleClients(cc, lc.REST.(*rest.RESTClient).Client)
	if err != nil {
		return nil, err
	}
	// Watches get no client-side timeout: rest.Config.Timeout is the whole
	// http.Client's, so it would cut every watch after `timeout` and the
	// reflector would re-list and re-watch (6 requests a minute per idle
	// agent at 10 s, measured by bench idle). The reflector asks the server
	// to end each watch after 5-10 minutes (timeoutSeconds), and a dead
	// connection is found by the HTTP/2 health check (http2HealthCheck).
	wc := rest.CopyConfig(c)
	wc.Timeout = 0
	wlc, err := NewLifecycleClients(wc)
	if err != nil {
		return nil, err
	}
	return &Client{Node: node, Core: core, LC: lc, watchLC: wlc, claimLC: claim, evicts: rec, restCfg: c, contact: contact}, nil
}

// watchClients is Core without the client-side timeout, for the drain's
// PodDisruptionBudget and pod watches and the Node label watch: with it,
// rest.Config.Timeout cut each watch after apiTimeout, and every cut
// re-listed. Built at first use (most agents drain rarely).
func (c *Client) watchClients() kubernetes.Interface {
	c.watchCoreOnce.Do(func() {
		c.watchCore = c.Core // a malformed config only, which New refused
		wc := rest.CopyConfig(c.restCfg)
		wc.Timeout = 0 // as watchLC's (New)
		if cs, err := kubernetes.NewForConfig(wc); err == nil {
			c.watchCore = cs
		}
	})
	return c.watchCore
}

// claimLane is the clients for the claim's writes (claimLC; LC for a
// Client not made by New).
func (c *Client) claimLane() *LifecycleClients {
	if c.claimLC != nil {
		return c.claimLC
	}
	return c.LC
}

// Contact says when the agent last heard from the API server (see Contact).
func (c *Client) Contact() ContactState { return c.contact.State() }

// ContactRegained fires when the API server answers again after failures
// (see Contact.Regained).
func (c *Client) ContactRegained() <-chan struct{} { return c.contact.Regained() }

// Config returns the rest.Config the client was built with.
func (c *Client) Config() *rest.Config { return rest.CopyConfig(c.restCfg) }

// RestConfig is client-go's rest.Config, named here so that packages outside
// apiclient can pass one along without importing client-go.
type RestConfig = rest.Config

// IsNotFound reports whether err is the API server's 404.
func IsNotFound(err error) bool { return apierrors.IsNotFound(err) }
