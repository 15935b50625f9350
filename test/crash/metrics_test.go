package crash

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// agentMetric reads one unlabelled gauge or counter from the agent's
// /metrics, parsed by Prometheus' own text parser.
func agentMetric(a *agentProc, name string) (float64, error) {
	resp, err := (&http.Client{Timeout: 3 * time.Second}).Get("http://" + a.metrics + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("metric %s: %w", name, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("metric %s: parse %s/metrics: %w", name, a.metrics, err)
	}
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) != 1 {
		return 0, fmt.Errorf("metric %s: not on %s/metrics as one series", name, a.metrics)
	}
	m := f.GetMetric()[0]
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), nil
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), nil
	}
	return 0, fmt.Errorf("metric %s: neither a gauge nor a counter", name)
}
