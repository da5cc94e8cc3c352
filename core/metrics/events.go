package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// eventsDesc describes sluice_transport_events_total.
var eventsDesc = prometheus.NewDesc("sluice_transport_events_total",
	"Events a transport counted: late results discarded, requests nobody heard, leases reclaimed, ...",
	[]string{"transport", "event"}, nil)

// EventsCollector exports a transport's own counters, read at scrape time.
type EventsCollector struct {
	transport string
	read      func() map[string]int64
}

// NewEventsCollector returns a collector of read() for the named transport.
func NewEventsCollector(transport string, read func() map[string]int64) *EventsCollector {
	return &EventsCollector{transport: transport, read: read}
}

// Describe implements prometheus.Collector.
func (c *EventsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- eventsDesc }

// Collect implements prometheus.Collector.
func (c *EventsCollector) Collect(ch chan<- prometheus.Metric) {
	events := c.read()
	names := make([]string, 0, len(events))
	for name := range events {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(events[name]), c.transport, name)
	}
}
