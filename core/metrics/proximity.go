package metrics

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ProximityBounds are the upper bounds of async_deadline_proximity_millis,
// upstream's: a request counts in the first bucket whose bound its time
// left before the deadline is below (le="0" holds the expired ones).
var ProximityBounds = []time.Duration{0, time.Second, 5 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute, time.Hour,
	2 * time.Hour, 6 * time.Hour, 24 * time.Hour}

// proximityDesc describes async_deadline_proximity_millis.
var proximityDesc = prometheus.NewDesc(Upstream+"deadline_proximity_millis",
	"Requests waiting in the broker by time left before their deadline, in milliseconds: a snapshot per backlog poll (not monotonic); le=\"0\" counts the expired ones.",
	queueLabels, nil)

// Proximity is one snapshot of a queue's waiting requests: Cumulative[i]
// counts those whose time left is below ProximityBounds[i] (upstream reads
// ZCOUNT <q> -inf (<now + bound + 1 s>, an exclusive bound), and Total all
// of them (the +Inf bucket).
type Proximity struct {
	Cumulative []uint64
	Total      uint64
}

// ProximityCollector exports the last snapshot of each queue as a constant
// histogram, as upstream does. It is safe for concurrent use.
type ProximityCollector struct {
	mu    sync.Mutex
	snaps map[Labels]Proximity
}

func newProximityCollector() *ProximityCollector {
	return &ProximityCollector{snaps: map[Labels]Proximity{}}
}

// Set records queue l's snapshot. A snapshot with the wrong number of
// buckets is ignored. On a read error upstream exports every bucket at 0:
// pass the zero Proximity with Cumulative of the right length.
func (c *ProximityCollector) Set(l Labels, p Proximity) {
	if len(p.Cumulative) != len(ProximityBounds) {
		return
	}
	c.mu.Lock()
	c.snaps[l] = p
	c.mu.Unlock()
}

// Delete forgets queue l's snapshot: its series are no longer exported.
func (c *ProximityCollector) Delete(l Labels) {
	c.mu.Lock()
	delete(c.snaps, l)
	c.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *ProximityCollector) Describe(ch chan<- *prometheus.Desc) { ch <- proximityDesc }

// Collect implements prometheus.Collector: per queue, the buckets and a sum
// estimated from the buckets' midpoints (upstream's estimate; the +Inf
// bucket counts at the last bound).
func (c *ProximityCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]Labels, 0, len(c.snaps))
	for l := range c.snaps {
		keys = append(keys, l)
	}
	key := func(l Labels) string { return l.QueueID + "\x00" + l.QueueName + "\x00" + l.Pool }
	sort.Slice(keys, func(i, j int) bool { return key(keys[i]) < key(keys[j]) })
	for _, l := range keys {
		p := c.snaps[l]
		buckets := make(map[float64]uint64, len(ProximityBounds))
		sum, prev, lower := 0.0, uint64(0), 0.0
		for i, b := range ProximityBounds {
			ms := float64(b.Milliseconds())
			buckets[ms] = p.Cumulative[i]
			sum += float64(p.Cumulative[i]-min(prev, p.Cumulative[i])) * (lower + ms) / 2
			prev, lower = p.Cumulative[i], ms
		}
		if p.Total > prev {
			sum += float64(p.Total-prev) * lower
		}
		ch <- prometheus.MustNewConstHistogram(proximityDesc, p.Total, sum, buckets, l.values()...)
	}
}
