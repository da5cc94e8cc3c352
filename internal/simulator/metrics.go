package simulator

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metric names served on /metrics. The vllm: gauges are those a vLLM server
// exports and saturation gates read; the rest are the simulator's own.
const (
	MetricRunning       = "vllm:num_requests_running"
	MetricWaiting       = "vllm:num_requests_waiting"
	MetricKVCacheUsage  = "vllm:kv_cache_usage_perc"
	MetricGPUCacheUsage = "vllm:gpu_cache_usage_perc" // older vLLM name of the same gauge
	MetricRequests      = "simulator_requests_total"
	MetricResets        = "simulator_connection_resets_total"
	MetricAborted       = "simulator_requests_aborted_total"
	MetricInflight      = "simulator_requests_inflight"
	MetricCapacity      = "simulator_capacity"
)

// collector exposes a Server's atomics to its private registry. One Collect
// reads the in-flight count once, so running, waiting and usage of a scrape
// agree with each other; nothing is updated on the request path.
type collector struct {
	s                                           *Server
	running, waiting, kvUsage, gpuUsage         *prometheus.Desc
	inflight, capacity, resets, aborted, byCode *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(s *Server) *collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &collector{
		s:        s,
		running:  desc(MetricRunning, "Number of requests running on the simulated pool."),
		waiting:  desc(MetricWaiting, "Number of requests waiting for a slot of the simulated pool."),
		kvUsage:  desc(MetricKVCacheUsage, "Simulated KV-cache usage, running/capacity, in [0,1]."),
		gpuUsage: desc(MetricGPUCacheUsage, "Simulated KV-cache usage, running/capacity, in [0,1] (older vLLM name)."),
		inflight: desc(MetricInflight, "Completion requests in progress."),
		capacity: desc(MetricCapacity, "Simulated pool capacity."),
		resets:   desc(MetricResets, "Completion requests answered by resetting the connection."),
		aborted:  desc(MetricAborted, "Completion requests whose client went away before the answer."),
		byCode:   desc(MetricRequests, "Completion requests answered, by HTTP status.", "code"),
	}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.running, c.waiting, c.kvUsage, c.gpuUsage,
		c.inflight, c.capacity, c.resets, c.aborted, c.byCode} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	inflight := s.inflight.Load()
	capacity := int64(s.cfg.Capacity)
	running := min(inflight, capacity)
	waiting := max(0, inflight-capacity)
	usage := 0.0
	if capacity > 0 {
		usage = float64(running) / float64(capacity)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	gauge(c.running, float64(running))
	gauge(c.waiting, float64(waiting))
	gauge(c.kvUsage, usage)
	gauge(c.gpuUsage, usage)
	gauge(c.inflight, float64(inflight))
	gauge(c.capacity, float64(capacity))
	ch <- prometheus.MustNewConstMetric(c.resets, prometheus.CounterValue, float64(s.resets.Load()))
	ch <- prometheus.MustNewConstMetric(c.aborted, prometheus.CounterValue, float64(s.aborted.Load()))
	for code := range s.byStatus {
		if n := s.byStatus[code].Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(c.byCode, prometheus.CounterValue, float64(n), strconv.Itoa(code))
		}
	}
}

// newMetricsHandler returns the /metrics handler of s, backed by a registry
// of its own (never the global one), so several Servers can live in one
// process.
func newMetricsHandler(s *Server) (http.Handler, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newCollector(s)); err != nil {
		return nil, err
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}), nil
}
