package gate

import (
	"errors"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// Gates own the series they export: a gate's factory builds its
// collectors and registers them on Env.Metrics (or Env.PoolMetrics), and
// the refresh loop that runs the gate unregisters them when it closes the
// gate (a reload that drops a gate leaves no series behind). The
// collectors below are the ones several gate types share: one name, one
// help text and one label set for every gate that exports it, as the
// registry requires. Each describes its series without the gate label,
// which the registerer in Env.Metrics adds.

// Register registers cs on reg, the registerer a gate got in its Env (nil:
// the gate exports nothing, as in tests and `sluice validate`). A
// collector whose series are already exported (an inner gate of a
// composite of the same type, or a second gate of the same pool: the same
// name and labels) is skipped: the first one registered keeps them.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
				continue
			}
			return err
		}
	}
	return nil
}

// The shared series, labelled by gate (added by Env.Metrics).
var (
	eventsDesc = prometheus.NewDesc("sluice_gate_events_total",
		"Events a gate counted: a plugin gate's process starts (plugin_starts), losses (plugin_losses), failed starts (plugin_start_failures) and stderr lines dropped by its log rate (plugin_log_lines_suppressed).",
		[]string{"event"}, nil)
	callSecondsDesc = prometheus.NewDesc("sluice_gate_plugin_call_seconds",
		"Duration of the calls a plugin gate makes to its plugin process, by gate and RPC (configure, budget, admit, describe), in seconds.",
		[]string{"rpc"}, nil)
	callFailuresDesc = prometheus.NewDesc("sluice_gate_plugin_call_failures_total",
		"Calls a plugin gate made to its plugin process that failed (an error, a deadline, a broken connection), by gate and RPC.",
		[]string{"rpc"}, nil)
	windowDesc = prometheus.NewDesc("sluice_gate_window",
		"A feedback gate's congestion window (aimd: one per classification × tier band): how many of the band's requests may be in flight.",
		[]string{"band"}, nil)
	windowSSThreshDesc = prometheus.NewDesc("sluice_gate_window_ssthresh",
		"A feedback gate's slow-start threshold per band: below it the window grows in slow start, above it additively.",
		[]string{"band"}, nil)
	windowInflightDesc = prometheus.NewDesc("sluice_gate_window_inflight",
		"Requests a feedback gate admitted per band and not yet released.",
		[]string{"band"}, nil)
	windowClosedDesc = prometheus.NewDesc("sluice_gate_window_closed",
		"1 while a feedback gate's band is closed by a Retry-After, else 0.",
		[]string{"band"}, nil)
)

// collector is a prometheus.Collector of descs whose metrics collect
// sends, read at scrape time.
type collector struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric)
}

// Describe implements prometheus.Collector.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// EventsCollector exports read(), a gate's own counts by event, as
// sluice_gate_events_total{gate, event}. read must be cheap and safe for
// concurrent use: it runs at every scrape.
func EventsCollector(read func() map[string]int64) prometheus.Collector {
	return collector{descs: []*prometheus.Desc{eventsDesc}, collect: func(ch chan<- prometheus.Metric) {
		events := read()
		names := make([]string, 0, len(events))
		for name := range events {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(events[name]), name)
		}
	}}
}

// CallStats are the timings of one kind of call a gate makes outside
// sluice (a plugin gate: one RPC), since the gate was built.
type CallStats struct {
	// Call names the call ("budget", "admit", ...).
	Call string
	// Count is how many calls ended; Failures how many of them failed.
	Count, Failures uint64
	// Seconds is the total time they took.
	Seconds float64
	// Buckets maps an upper bound, in seconds, to the number of calls that
	// took at most that long (cumulative, as Prometheus histograms count).
	Buckets map[float64]uint64
}

// CallsCollector exports read(), the timings of the calls a gate makes (a
// plugin gate: its RPCs to the plugin process), as
// sluice_gate_plugin_call_seconds{gate, rpc} and
// sluice_gate_plugin_call_failures_total{gate, rpc}. read must be cheap and
// safe for concurrent use.
func CallsCollector(read func() []CallStats) prometheus.Collector {
	return collector{descs: []*prometheus.Desc{callSecondsDesc, callFailuresDesc}, collect: func(ch chan<- prometheus.Metric) {
		for _, s := range read() {
			ch <- prometheus.MustNewConstHistogram(callSecondsDesc, s.Count, s.Seconds, s.Buckets, s.Call)
			ch <- prometheus.MustNewConstMetric(callFailuresDesc, prometheus.CounterValue, float64(s.Failures), s.Call)
		}
	}}
}

// Window is one congestion window of a feedback gate (aimd keeps one per
// band).
type Window struct {
	// Band names the window ("overflow-batch").
	Band string
	// Size is the window: how many of the band's requests may be in flight.
	Size float64
	// SSThresh is its slow-start threshold (Size below it: slow start).
	SSThresh float64
	// InFlight is how many requests the window holds now.
	InFlight int
	// Closed says the band is closed (a Retry-After).
	Closed bool
}

// WindowsCollector exports read(), a feedback gate's windows, as
// sluice_gate_window{gate, band} and its _ssthresh, _inflight and _closed
// companions. read must be cheap and safe for concurrent use.
func WindowsCollector(read func() []Window) prometheus.Collector {
	descs := []*prometheus.Desc{windowDesc, windowSSThreshDesc, windowInflightDesc, windowClosedDesc}
	return collector{descs: descs, collect: func(ch chan<- prometheus.Metric) {
		for _, w := range read() {
			closed := 0.0
			if w.Closed {
				closed = 1
			}
			ch <- prometheus.MustNewConstMetric(windowDesc, prometheus.GaugeValue, w.Size, w.Band)
			ch <- prometheus.MustNewConstMetric(windowSSThreshDesc, prometheus.GaugeValue, w.SSThresh, w.Band)
			ch <- prometheus.MustNewConstMetric(windowInflightDesc, prometheus.GaugeValue, float64(w.InFlight), w.Band)
			ch <- prometheus.MustNewConstMetric(windowClosedDesc, prometheus.GaugeValue, closed, w.Band)
		}
	}}
}
