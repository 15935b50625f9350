package gpuhealth

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lifecycle-agent/lifecycle-agent/internal/devices"
)

// Metrics are the GPU gauges and the XID counter (see the package doc).
type Metrics struct {
	Healthy                *prometheus.GaugeVec
	RemappedRowsPending    *prometheus.GaugeVec
	RetiredPagesPending    *prometheus.GaugeVec
	ECCVolatileUncorrected *prometheus.GaugeVec
	ResetRequired          *prometheus.GaugeVec
	ReplacementRequired    *prometheus.GaugeVec
	XIDEvents              *prometheus.CounterVec
	// Expected is the number of GPUs in the baseline (Config.BaselinePath).
	Expected prometheus.Gauge

	mu     sync.Mutex
	series map[string]prometheus.Labels // per-GPU label sets currently exported, by gpu/index
}

// NewMetrics creates the metrics and registers them with reg (nil: none).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"gpu", "index"})
	}
	m := &Metrics{
		Healthy: gauge("lifecycle_agent_gpu_healthy",
			"1 when the GPU is healthy (devices.Evaluate), 0 when not."),
		RemappedRowsPending: gauge("lifecycle_agent_gpu_remapped_rows_pending",
			"1 when a row remap waits for a GPU reset; absent when not supported."),
		RetiredPagesPending: gauge("lifecycle_agent_gpu_retired_pages_pending",
			"1 when page retirement waits for a GPU reset; absent when not supported."),
		ECCVolatileUncorrected: gauge("lifecycle_agent_gpu_ecc_volatile_uncorrected",
			"Uncorrected ECC errors since the driver loaded or the GPU was reset; absent when not supported."),
		ResetRequired: gauge("lifecycle_agent_gpu_reset_required",
			"1 when the GPU asks for a reset (the GPUResetRequired need), 0 when not."),
		ReplacementRequired: gauge("lifecycle_agent_gpu_replacement_required",
			"1 when the GPU is failing and needs service (the GPUReplacementRequired need), 0 when not."),
		XIDEvents: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lifecycle_agent_gpu_xid_events_total",
			Help: "Critical XID events seen by the watcher (application XIDs excluded)."}, []string{"gpu", "xid"}),
		Expected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "lifecycle_agent_gpus_expected",
			Help: "GPUs seen on this node since the agent first saw any (the baseline); more than count(lifecycle_agent_gpu_healthy) means some are missing."}),
		series: map[string]prometheus.Labels{},
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.Healthy, m.RemappedRowsPending, m.RetiredPagesPending, m.ECCVolatileUncorrected, m.ResetRequired, m.ReplacementRequired, m.XIDEvents, m.Expected} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("gpuhealth: registering metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) gauges() []*prometheus.GaugeVec {
	return []*prometheus.GaugeVec{m.Healthy, m.RemappedRowsPending, m.RetiredPagesPending, m.ECCVolatileUncorrected, m.ResetRequired, m.ReplacementRequired}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// update sets the gauges from a snapshot and its verdict and drops the
// series of GPUs no longer present (or renumbered).
func (m *Metrics) update(s devices.Snapshot, r devices.HealthReport, needs Needs) {
	m.mu.Lock()
	defer m.mu.Unlock()
	health := map[int]devices.GPUHealth{}
	for _, h := range r.GPUs {
		health[h.Index] = h
	}
	has := func(n Need, index int) bool {
		for _, g := range needs[n] {
			if g.Index == index {
				return true
			}
		}
		return false
	}
	now := map[string]prometheus.Labels{}
	for _, g := range s.GPUs {
		l := prometheus.Labels{"gpu": g.UUID, "index": strconv.Itoa(g.Index)}
		now[g.UUID+"/"+l["index"]] = l
		m.Healthy.With(l).Set(b2f(health[g.Index].Healthy))
		m.ResetRequired.With(l).Set(b2f(has(NeedReset, g.Index)))
		m.ReplacementRequired.With(l).Set(b2f(has(NeedReplace, g.Index)))
		set := func(v *prometheus.GaugeVec, known bool, val float64) {
			if known {
				v.With(l).Set(val)
			} else {
				v.Delete(l)
			}
		}
		set(m.RemappedRowsPending, g.RemappedRows.Known, b2f(g.RemappedRows.Pending))
		set(m.RetiredPagesPending, g.RetiredPagesPending != devices.TriUnknown, b2f(g.RetiredPagesPending == devices.TriTrue))
		set(m.ECCVolatileUncorrected, g.ECC.Known, float64(g.ECC.VolatileUncorrected))
	}
	for k, l := range m.series {
		if _, ok := now[k]; !ok {
			for _, v := range m.gauges() {
				v.Delete(l)
			}
		}
	}
	m.series = now
}

// forgetAll drops every per-GPU gauge series (NVML unreadable: unknown).
func (m *Metrics) forgetAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range m.gauges() {
		v.Reset()
	}
	m.series = map[string]prometheus.Labels{}
}
