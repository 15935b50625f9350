package maintenance

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/lifecycle-agent/lifecycle-agent/internal/host"
)

// A Gate says whether a disruptive event may start now. Check returns the
// blockers, one short line each (nil: the gate passes), or an error when the
// gate cannot be evaluated, which blocks too: an unreachable Prometheus
// must not let a reboot through.
type Gate interface {
	Name() string
	Check(ctx context.Context) (blockers []string, err error)
}

// Blockers runs every gate and returns what blocks, each line prefixed with
// its gate's name; a gate that cannot be evaluated says so.
func Blockers(ctx context.Context, gates []Gate) []string {
	var out []string
	for _, g := range gates {
		b, err := g.Check(ctx)
		if err != nil {
			out = append(out, fmt.Sprintf("%s gate cannot be evaluated: %v", g.Name(), err))
			continue
		}
		for _, line := range b {
			out = append(out, g.Name()+": "+line)
		}
	}
	return out
}

// --- Prometheus alerts --------------------------------------------------

// PrometheusConfig is gates.prometheus.*.
type PrometheusConfig struct {
	URL string
	// Names: an alert blocks only when its alertname matches (nil: any).
	Names *regexp.Regexp
	// Ignore: alerts whose alertname matches never block, as kured's
	// --alert-filter-regexp.
	Ignore  *regexp.Regexp
	Timeout time.Duration
}

// Prometheus blocks while a firing alert matches, read from Prometheus'
// HTTP API (/api/v1/alerts) with client_golang's API client.
type Prometheus struct {
	cfg PrometheusConfig
	api promv1.API
}

// NewPrometheus checks cfg and builds the client (no request is made).
func NewPrometheus(cfg PrometheusConfig) (*Prometheus, error) {
	if cfg.URL == "" {
		return nil, errors.New("maintenance: prometheus gate without a URL")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	c, err := promapi.NewClient(promapi.Config{Address: cfg.URL})
	if err != nil {
		return nil, fmt.Errorf("maintenance: prometheus gate %s: %w", cfg.URL, err)
	}
	return &Prometheus{cfg: cfg, api: promv1.NewAPI(c)}, nil
}

func (p *Prometheus) Name() string { return "prometheus" }

func (p *Prometheus) Check(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	res, err := p.api.Alerts(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.cfg.URL, err)
	}
	var names []string
	for _, a := range res.Alerts {
		if a.State != promv1.AlertStateFiring {
			continue
		}
		name := string(a.Labels[model.AlertNameLabel])
		if p.cfg.Names != nil && !p.cfg.Names.MatchString(name) {
			continue
		}
		if p.cfg.Ignore != nil && p.cfg.Ignore.MatchString(name) {
			continue
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var out []string
	for _, n := range names {
		out = append(out, fmt.Sprintf("alert %s is firing", n))
	}
	return out, nil
}

// --- blocking pods ------------------------------------------------------

// PodLister lists the pods on this node that match a label selector and
// have not finished, as "namespace/name" (apiclient.Client).
type PodLister interface {
	PodsOnNode(ctx context.Context, selector string) ([]string, error)
}

// Pods blocks while a pod matching Selector runs on this node, as kured's
// --blocking-pod-selector.
type Pods struct {
	Selector string
	API      PodLister
}

func (p *Pods) Name() string { return "pods" }

func (p *Pods) Check(ctx context.Context) ([]string, error) {
	pods, err := p.API.PodsOnNode(ctx, p.Selector)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range pods {
		out = append(out, fmt.Sprintf("pod %s matches %s", n, p.Selector))
	}
	return out, nil
}

// --- a command ----------------------------------------------------------

// Command blocks unless a local command (/bin/sh -c, from root-owned
// config) exits 0. A read-only probe: it runs in host.mode simulate too.
type Command struct {
	Command string
	Timeout time.Duration
	Runner  *host.Runner
}

func (c *Command) Name() string { return "command" }

func (c *Command) Check(ctx context.Context) ([]string, error) {
	_, err := c.Runner.Run(ctx, host.Cmd{Path: "/bin/sh", Args: []string{"-c", c.Command}, Timeout: c.Timeout})
	var ee *host.ExitError
	switch {
	case err == nil:
		return nil, nil
	case errors.As(err, &ee) && !ee.TimedOut && ee.ExitCode > 0:
		return []string{fmt.Sprintf("`%s` exited %d%s", c.Command, ee.ExitCode, lastLine(ee.Stdout+ee.Stderr))}, nil
	case errors.As(err, &ee) && ee.TimedOut:
		return nil, fmt.Errorf("`%s` did not finish within %s (killed)", c.Command, c.Timeout)
	default:
		return nil, fmt.Errorf("`%s`: %w", c.Command, err)
	}
}

func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		return ": " + l
	}
	return ""
}
