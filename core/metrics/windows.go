package metrics

import "github.com/prometheus/client_golang/prometheus"

// The feedback gates' window series, by gate and band.
var (
	gateWindowDesc = prometheus.NewDesc("sluice_gate_window",
		"A feedback gate's congestion window (aimd: one per classification × tier band): how many of the band's requests may be in flight.",
		[]string{"gate", "band"}, nil)
	gateWindowSSThreshDesc = prometheus.NewDesc("sluice_gate_window_ssthresh",
		"A feedback gate's slow-start threshold per band: below it the window grows in slow start, above it additively.",
		[]string{"gate", "band"}, nil)
	gateWindowInflightDesc = prometheus.NewDesc("sluice_gate_window_inflight",
		"Requests a feedback gate admitted per band and not yet released.",
		[]string{"gate", "band"}, nil)
	gateWindowClosedDesc = prometheus.NewDesc("sluice_gate_window_closed",
		"1 while a feedback gate's band is closed by a Retry-After, else 0.",
		[]string{"gate", "band"}, nil)
)

// GateWindow is one window of one gate.
type GateWindow struct {
	Gate, Band     string
	Size, SSThresh float64
	InFlight       int
	Closed         bool
}

// GateWindowsCollector exports the feedback gates' windows, read at scrape time.
type GateWindowsCollector struct {
	read func() []GateWindow
}

// NewGateWindowsCollector returns a collector of read().
func NewGateWindowsCollector(read func() []GateWindow) *GateWindowsCollector {
	return &GateWindowsCollector{read: read}
}

// Describe implements prometheus.Collector.
func (c *GateWindowsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- gateWindowDesc
	ch <- gateWindowSSThreshDesc
	ch <- gateWindowInflightDesc
	ch <- gateWindowClosedDesc
}

// Collect implements prometheus.Collector.
func (c *GateWindowsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.read() {
		closed := 0.0
		if w.Closed {
			closed = 1
		}
		ch <- prometheus.MustNewConstMetric(gateWindowDesc, prometheus.GaugeValue, w.Size, w.Gate, w.Band)
		ch <- prometheus.MustNewConstMetric(gateWindowSSThreshDesc, prometheus.GaugeValue, w.SSThresh, w.Gate, w.Band)
		ch <- prometheus.MustNewConstMetric(gateWindowInflightDesc, prometheus.GaugeValue, float64(w.InFlight), w.Gate, w.Band)
		ch <- prometheus.MustNewConstMetric(gateWindowClosedDesc, prometheus.GaugeValue, closed, w.Gate, w.Band)
	}
}
