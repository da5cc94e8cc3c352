package metrics

import "github.com/prometheus/client_golang/prometheus"

// The plugin call series: a histogram of call durations and a counter of
// failed calls, by gate and RPC.
var (
	gateCallSecondsDesc = prometheus.NewDesc("sluice_gate_plugin_call_seconds",
		"Duration of the calls a plugin gate makes to its plugin process, by gate and RPC (configure, budget, admit, describe), in seconds.",
		[]string{"gate", "rpc"}, nil)
	gateCallFailuresDesc = prometheus.NewDesc("sluice_gate_plugin_call_failures_total",
		"Calls a plugin gate made to its plugin process that failed (an error, a deadline, a broken connection), by gate and RPC.",
		[]string{"gate", "rpc"}, nil)
)

// GateCalls are the timings of one RPC of one gate.
type GateCalls struct {
	Gate, RPC       string
	Count, Failures uint64
	Seconds         float64
	// Buckets maps an upper bound in seconds to the cumulative count.
	Buckets map[float64]uint64
}

// GateCallsCollector exports the gates' call timings, read at scrape time.
type GateCallsCollector struct {
	read func() []GateCalls
}

// NewGateCallsCollector returns a collector of read().
func NewGateCallsCollector(read func() []GateCalls) *GateCallsCollector {
	return &GateCallsCollector{read: read}
}

// Describe implements prometheus.Collector.
func (c *GateCallsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gateCallSecondsDesc
	ch <- gateCallFailuresDesc
}

// Collect implements prometheus.Collector.
func (c *GateCallsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.read() {
		ch <- prometheus.MustNewConstHistogram(gateCallSecondsDesc, s.Count, s.Seconds, s.Buckets, s.Gate, s.RPC)
		ch <- prometheus.MustNewConstMetric(gateCallFailuresDesc, prometheus.CounterValue, float64(s.Failures), s.Gate, s.RPC)
	}
}
