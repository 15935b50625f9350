package apiclient

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Client bundles the clients the agent uses, for one node.
type Client struct {
	Node    string
	Core    kubernetes.Interface
	LC      *LifecycleClients
	evicts  *evictionRecorder
	restCfg *rest.Config
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
	if c.QPS == 0 {
		c.QPS, c.Burst = 20, 40
	}
	rec := &evictionRecorder{blocked: map[string]string{}}
	prev := c.WrapTransport
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return &evictionTransport{next: rt, rec: rec}
	}
	core, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("apiclient: %w", err)
	}
	lc, err := NewLifecycleClients(c)
	if err != nil {
		return nil, err
	}
	return &Client{Node: node, Core: core, LC: lc, evicts: rec, restCfg: c}, nil
}

// Config returns the rest.Config the client was built with.
func (c *Client) Config() *rest.Config { return rest.CopyConfig(c.restCfg) }

// RestConfig is client-go's rest.Config, named here so that packages outside
// apiclient can pass one along without importing client-go.
type RestConfig = rest.Config

// IsNotFound reports whether err is the API server's 404.
func IsNotFound(err error) bool { return apierrors.IsNotFound(err) }
