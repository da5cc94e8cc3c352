package simulator

import (
	"net/http"
	"strconv"
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

// metrics serves the Prometheus text exposition (format 0.0.4) of the
// current load. It is written by hand rather than with client_golang: the
// handful of series needs no registry, and the scrape stays allocation-light.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	inflight := s.inflight.Load()
	capacity := int64(s.cfg.Capacity)
	running := min(inflight, capacity)
	waiting := max(0, inflight-capacity)
	usage := 0.0
	if capacity > 0 {
		usage = float64(running) / float64(capacity)
	}

	b := make([]byte, 0, 2048)
	b = appendSample(b, MetricRunning, "gauge", "Number of requests running on the simulated pool.", float64(running))
	b = appendSample(b, MetricWaiting, "gauge", "Number of requests waiting for a slot of the simulated pool.", float64(waiting))
	b = appendSample(b, MetricKVCacheUsage, "gauge", "Simulated KV-cache usage, running/capacity, in [0,1].", usage)
	b = appendSample(b, MetricGPUCacheUsage, "gauge", "Simulated KV-cache usage, running/capacity, in [0,1] (older vLLM name).", usage)
	b = appendSample(b, MetricInflight, "gauge", "Completion requests in progress.", float64(inflight))
	b = appendSample(b, MetricCapacity, "gauge", "Simulated pool capacity.", float64(capacity))
	b = appendSample(b, MetricResets, "counter", "Completion requests answered by resetting the connection.", float64(s.resets.Load()))
	b = appendSample(b, MetricAborted, "counter", "Completion requests whose client went away before the answer.", float64(s.aborted.Load()))

	b = appendHeader(b, MetricRequests, "counter", "Completion requests answered, by HTTP status.")
	for code := range s.byStatus {
		n := s.byStatus[code].Load()
		if n == 0 {
			continue
		}
		b = append(b, MetricRequests+`{code="`...)
		b = strconv.AppendInt(b, int64(code), 10)
		b = append(b, `"} `...)
		b = strconv.AppendUint(b, n, 10)
		b = append(b, '\n')
	}

	w.Header()["Content-Type"] = s.ctProm
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}

func appendHeader(b []byte, name, typ, help string) []byte {
	b = append(b, "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, help...)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, typ...)
	return append(b, '\n')
}

func appendSample(b []byte, name, typ, help string, v float64) []byte {
	b = appendHeader(b, name, typ, help)
	b = append(b, name...)
	b = append(b, ' ')
	b = strconv.AppendFloat(b, v, 'g', -1, 64)
	return append(b, '\n')
}
