package engine

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the engine's Prometheus metrics.
type Metrics struct {
	Events        *prometheus.CounterVec
	StepDuration  *prometheus.HistogramVec
	ClaimLatency  prometheus.Histogram
	OutboxDepth   prometheus.Gauge
	JournalCommit prometheus.Histogram
	Relists       prometheus.Counter
	FinishStuck   prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (if not nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifecycle_agent_events_total",
			Help: "Finished LifecycleEvents by driver and outcome."}, []string{"driver", "outcome"}),
		StepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lifecycle_agent_step_duration_seconds",
			Help: "Duration of each step run.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}, []string{"driver", "step"}),
		ClaimLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lifecycle_agent_claim_latency_seconds",
			Help: "Time from an event's creation to its claim.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		OutboxDepth: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifecycle_agent_outbox_depth",
			Help: "Status writes waiting for the API server."}),
		JournalCommit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lifecycle_agent_journal_commit_seconds",
			Help: "Duration of journal commits (fsync included).", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		Relists: prometheus.NewCounter(prometheus.CounterOpts{Name: "lifecycle_agent_event_relists_total",
			Help: "Direct lists of this node's events after the API server answered again following failures."}),
		FinishStuck: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifecycle_agent_finish_blocked",
			Help: "1 while an ended event cannot be closed out (the journal refuses its end state); the finalizer is kept."}),
	}
	if reg != nil {
		reg.MustRegister(m.Events, m.StepDuration, m.ClaimLatency, m.OutboxDepth, m.JournalCommit, m.Relists, m.FinishStuck)
	}
	return m
}
