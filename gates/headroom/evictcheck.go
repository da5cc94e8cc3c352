package headroom

import (
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// The eviction check's modes (gate_params.evict_check).
const (
	// EvictCheckAuto judges only once the pods were seen counting an abort
	// (the default): vLLM V1 declares finished_reason="abort" but does not
	// count aborts, so a counter that never rose tells nothing.
	EvictCheckAuto = "auto"
	// EvictCheckStrict judges from the start: the pods must count every
	// call taken back (an absent counter counts nothing).
	EvictCheckStrict = "strict"
	// EvictCheckOff does not check.
	EvictCheckOff = "off"
)

// Defaults of the eviction check.
const (
	DefaultAbortMetric        = "vllm:request_success_total"
	DefaultEvictCheckReadings = 10
	DefaultEvictCheckBackoff  = 30 * time.Second
	// maxBackoffFactor bounds the back-off's doubling after failed retries.
	maxBackoffFactor = 8
)

// DefaultAbortLabels select the aborted requests of AbortMetric.
var DefaultAbortLabels = map[string]string{"finished_reason": "abort"}

// evictCheck tells whether the calls the pipeline takes back leave the
// pool (gate.EvictionChecker), from the pods' abort counter: after the
// pipeline aborted k calls, the counter summed over the pods must rise by
// at least ceil(k/2) within `readings` readings. If it does not, eviction
// is suspended for the back-off (doubled after each failed retry, up to
// 8×; a check that passes resets it). While one check is open and the
// pods are known to count aborts, nothing more is taken back, so that a
// pool that ignores hang-ups costs at most one check's calls per retry.
//
// In auto mode a check judges only once the pods were seen counting an
// abort (any: one of sluice's, a client of the other traffic that hung
// up): until then a check without a rise is logged once and eviction goes
// on. It is guarded by the gate's lock.
type evictCheck struct {
	mode     string
	readings int
	backoff0 time.Duration
	log      *slog.Logger
	pods     string // the pool, for messages
	series   string // the counter read, for messages

	last      []float64 // per pod: the counter at its last reading (NaN: never read)
	seen      float64   // aborts the pods counted since the gate started, pod restarts included
	counts    bool      // the pods were seen counting an abort
	read      bool      // a reading happened
	load      int       // running + waiting of the last reading
	win       *checkWindow
	until     time.Time // eviction suspended until then
	backoff   time.Duration
	reason    string
	unjudged  bool // the line about an unjudged check was logged
	suspended int  // checks failed since the gate started
}

// checkWindow is one open check: k calls aborted after the reading whose
// count was base.
type checkWindow struct {
	k, readings int
	base        float64
	load        int // running + waiting at the reading before the aborts
}

func newEvictCheck(cfg Config) *evictCheck {
	labels := make([]string, 0, len(cfg.AbortLabels))
	for _, k := range slices.Sorted(maps.Keys(cfg.AbortLabels)) {
		labels = append(labels, fmt.Sprintf("%s=%q", k, cfg.AbortLabels[k]))
	}
	c := &evictCheck{mode: cfg.EvictCheck, readings: cfg.EvictCheckReadings, backoff0: cfg.EvictCheckBackoff,
		backoff: cfg.EvictCheckBackoff, log: cfg.Logger, pods: strings.Join(cfg.Endpoints, ","),
		series: cfg.AbortMetric + "{" + strings.Join(labels, ",") + "}", last: make([]float64, len(cfg.Endpoints)),
		counts: cfg.EvictCheck == EvictCheckStrict}
	for i := range c.last {
		c.last[i] = math.NaN()
	}
	return c
}

// judging reports whether a check without a rise suspends eviction.
func (c *evictCheck) judging() bool { return c.mode == EvictCheckStrict || c.counts }

// observe takes one reading: the pods' abort counters (ok false: the pod
// exports no such series) and running + waiting.
func (c *evictCheck) observe(now time.Time, aborts []float64, ok []bool, load int) {
	exported := false
	var delta float64
	for i, v := range aborts {
		if !ok[i] {
			continue
		}
		exported = true
		if prev := c.last[i]; !math.IsNaN(prev) {
			if v >= prev {
				delta += v - prev
			} else {
				delta += v // the pod restarted: its counter began again
			}
		}
		c.last[i] = v
	}
	if !c.read && !exported {
		what := "eviction goes on unchecked until they count one"
		if c.mode == EvictCheckStrict {
			what = "evict_check is strict: every check will fail and suspend eviction"
		}
		c.log.Warn("pool-headroom eviction check: no pod exports the abort counter; "+what, "pods", c.pods, "series", c.series)
	}
	c.read = true
	c.seen += delta
	if delta > 0 {
		c.counts = true
	}
	defer func() { c.load = load }()
	w := c.win
	if w == nil {
		return
	}
	w.readings++
	rise := c.seen - w.base
	if rise >= float64((w.k+1)/2) {
		c.win, c.backoff = nil, c.backoff0
		return
	}
	if w.readings < c.readings {
		return
	}
	c.win = nil
	if !c.judging() {
		if !c.unjudged {
			c.unjudged = true
			c.log.Info("pool-headroom eviction check cannot judge: the pods counted none of the calls sluice took back and no abort "+
				"since the gate started (vLLM V1 declares the counter but does not count aborts); eviction goes on. "+
				"Set evict_check to strict for servers that count them", "pods", c.pods, "series", c.series, "aborted", w.k,
				"readings", w.readings)
		}
		return
	}
	c.suspended++
	c.until = now.Add(c.backoff)
	c.reason = fmt.Sprintf("pods %s counted %g of the %d calls sluice aborted within %d readings (%s); running+waiting %d before the aborts, %d after",
		c.pods, rise, w.k, w.readings, c.series, w.load, load)
	c.backoff = min(2*c.backoff, maxBackoffFactor*c.backoff0)
}

// evicted opens a check for n calls aborted after the last reading (or
// adds them to the open one).
func (c *evictCheck) evicted(now time.Time, n int) {
	if c.mode == EvictCheckOff || n <= 0 || now.Before(c.until) {
		return
	}
	if c.win != nil {
		c.win.k += n
		return
	}
	c.win = &checkWindow{k: n, base: c.seen, load: c.load}
}

// state answers the evictor at now: suspended until c.until; pending
// while a check that judges is open.
func (c *evictCheck) state(now time.Time) (suspended, pending bool, until time.Time, reason string) {
	if now.Before(c.until) {
		return true, false, c.until, c.reason
	}
	return false, c.win != nil && c.judging(), time.Time{}, ""
}
