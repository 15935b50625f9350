package e2e

import (
	"context"
	"fmt"
	"time"

	"github.com/lifecycle-agent/lifecycle-agent/internal/drivers"
)

// gateDriver is a test driver whose steps need no API and wait for the
// test to open their gate; it records when each step ran.
type gateDriver struct {
	short      string
	steps      []string
	disruptive bool
	gates      map[string]chan struct{}
	ran        chan string
}

func newGateDriver(short string, disruptive bool, steps ...string) *gateDriver {
	g := &gateDriver{short: short, steps: steps, disruptive: disruptive, gates: map[string]chan struct{}{}, ran: make(chan string, 64)}
	for _, s := range steps {
		g.gates[s] = make(chan struct{})
	}
	return g
}

func (g *gateDriver) open(step string) { close(g.gates[step]) }

func (g *gateDriver) Name() string       { return "e2e.lifecycle-agent.x-k8s.io/" + g.short }
func (g *gateDriver) Short() string      { return g.short }
func (g *gateDriver) Start() string      { return "GateStarted" }
func (g *gateDriver) End() string        { return "GateComplete" }
func (g *gateDriver) SLA() time.Duration { return 10 * time.Minute }

func (g *gateDriver) Plan(map[string]string) ([]drivers.Step, error) {
	var out []drivers.Step
	for _, s := range g.steps {
		s := s
		out = append(out, drivers.Step{Name: s, Disruptive: g.disruptive, Run: func(ctx context.Context, rt drivers.Runtime) error {
			select {
			case <-g.gates[s]:
			case <-ctx.Done():
				return fmt.Errorf("gate %s: %w", s, ctx.Err())
			}
			g.ran <- s
			return nil
		}})
	}
	return out, nil
}
