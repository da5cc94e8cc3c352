// Package aimd is the gate of type "aimd": a feedback gate that sizes how
// many requests may be in flight from the gateway's answers instead of from
// scraped metrics, after upstream's specification (llm-d-async
// docs/aimd-gate.md, proposal #379, PR #382).
//
//	{"gate_type":"aimd","gate_params":{"min_window":1,"max_window":256,
//	  "increase":1,"decrease_factor":0.5,"hold_duration":"1s"}}
//
// It keeps one congestion window per band, the (classification × tier)
// pair of the tier-priority lanes: reserved or overflow (unclassified
// counts as overflow) crossed with interactive, async or batch (an unknown
// or missing tier counts as batch), in priority order from
// reserved-interactive (0) to overflow-batch (5). Admit lets a request
// through while its band has fewer requests in flight than its window;
// otherwise a reserved request waits (Wait) and any other is deferred
// (Defer), as upstream parks reserved workers and refuses overflow
// requests back to the broker.
//
// Each admission's Observe (gate.Decision.Observe) learns the gateway's
// answer, once, when it comes back (no cache, no polling):
//
//   - 2xx: the window grows: by increase while below ssthresh (slow start,
//     about doubling per window's worth of answers), by increase/window
//     above it (additive increase);
//   - reason rejected-saturated, or a 429 without a reason: multiplicative
//     decrease, ssthresh = window × decrease_factor and window = ssthresh,
//     at most once per flight: a rejection of a request sent before the
//     band's last decrease belongs to the congestion event already acted on
//     and is ignored. With Retry-After the band closes until then and its
//     window drops to min_window (it reopens in slow start towards the
//     ssthresh set at the close). The decrease, and the close, apply to
//     every band below too (a band idle for activeFor only has its window
//     shrunk, keeping its ssthresh and so its slow start); the bands above
//     hold their growth for hold_duration;
//   - reason rejected-ttl-expired: a gentle decrease (×0.9), and the bands
//     above hold;
//   - evicted*, any other reason, a transport failure, a 5xx or another
//     4xx: no change.
//
// An accepted answer clears the holds of the bands above its own that were
// set before it was sent, and grows a window only when it was sent after
// that band's last decrease. The optional flow headers refine this: a band
// headroom h caps the window at in-flight + h; with queue_duration_target
// set, an accepted answer that queued past the target holds the window and
// one past twice the target decreases it gently.
//
// Budget is the sum of the windows of the open bands in use (a band is in
// use while it saw a request in the last activeFor), over the queue's
// max_concurrency, so the queue's credits follow the windows and the claim
// loop takes about what the bands admit; the Refresher reads it every 10ms
// by default (an in-memory sum). State is per gate instance: each queue
// and each worker pool gets its own, replicas converge without sharing
// (AIMD's fairness).
package aimd

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
)

// Type is the gate's registry name.
const Type = "aimd"

// NumBands is the number of bands.
const NumBands = 6

// bandNames are the bands in priority order, index = class×3 + tier.
var bandNames = [NumBands]string{
	"reserved-interactive", "reserved-async", "reserved-batch",
	"overflow-interactive", "overflow-async", "overflow-batch",
}

// BandName returns the name of band i (0…NumBands-1).
func BandName(i int) string { return bandNames[i] }

// activeFor is how long after its last request a band still counts in the
// budget.
const activeFor = 5 * time.Second

// The dropped reasons the gate tells apart (llm-d-router's error.go).
const (
	reasonSaturated  = "rejected-saturated"
	reasonTTLExpired = "rejected-ttl-expired"
)

// Event names counted by the gate (sluice_gate_events_total{event}).
const (
	// EventDecreaseSaturated: a band's window decreased on its own capacity rejection.
	EventDecreaseSaturated = "aimd_decrease_rejected_saturated"
	// EventDecreaseCoupled: a band's window decreased for a rejection in a band above it.
	EventDecreaseCoupled = "aimd_decrease_coupled"
	// EventDecreaseTTL: a gentle decrease on rejected-ttl-expired.
	EventDecreaseTTL = "aimd_decrease_ttl_expired"
	// EventDecreaseQueueDuration: a gentle decrease on a queue duration past twice the target.
	EventDecreaseQueueDuration = "aimd_decrease_queue_duration"
	// EventCloseRetryAfter: a band closed by a capacity rejection's Retry-After (its own or, coupled, one above it).
	EventCloseRetryAfter = "aimd_close_retry_after"
	// EventCoalesced: a capacity rejection of a flight already acted on, ignored.
	EventCoalesced = "aimd_rejection_coalesced"
	// EventHeadroomCap: a window capped by the band headroom header.
	EventHeadroomCap = "aimd_headroom_cap"
)

// band is one congestion window. Guarded by Gate.mu.
type band struct {
	lo, hi, init float64 // window bounds and start
	w, ssthresh  float64
	inflight     int
	closedUntil  time.Time
	// decreasedAt is the recovery point: the gate's send count at the
	// band's last decrease; answers to requests sent before it (seq <
	// decreasedAt) neither grow the window nor decrease it again.
	decreasedAt uint64
	heldUntil   time.Time
	holdSeq     uint64 // the send count when the hold was set
	lastSeen    time.Time
	decreases   uint64

	fullReason, closedReason string
}

// Gate is the feedback gate. It is safe for concurrent use.
type Gate struct {
	cfg Config

	mu     sync.Mutex
	sent   uint64 // admissions so far: each one's seq is the count before it
	bands  [NumBands]band
	events map[string]int64
}

var (
	_ gate.Gate       = (*Gate)(nil)
	_ gate.Admitter   = (*Gate)(nil)
	_ gate.Describer  = (*Gate)(nil)
	_ gate.Intervaler = (*Gate)(nil)
)

// New returns the gate.
func New(cfg Config) (*Gate, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Gate{cfg: cfg, events: map[string]int64{}}
	for i := range g.bands {
		b := &g.bands[i]
		b.lo, b.hi, b.init = cfg.bandBounds(i)
		b.w = b.init
		b.ssthresh = max(cfg.SlowStartThreshold, b.lo)
		b.fullReason = "aimd: band " + bandNames[i] + " window full"
		b.closedReason = "aimd: band " + bandNames[i] + " closed by Retry-After"
	}
	return g, nil
}

// BandOf returns the band of req: class×3 + tier, as the tier-priority lanes.
func (g *Gate) BandOf(req *wire.Request) int {
	class := 1
	if req.Classification() == wire.ClassReserved {
		class = 0
	}
	tier := 2
	switch req.Label(g.cfg.TierLabel) {
	case wire.TierInteractive:
		tier = 0
	case wire.TierAsync:
		tier = 1
	}
	return class*3 + tier
}

// RefreshInterval is how often the credits follow the windows.
func (g *Gate) RefreshInterval() time.Duration { return g.cfg.RefreshInterval }

// Budget is the windows of the open bands in use over max_concurrency, in
// [0,1]; before any request, the initial window's share.
func (g *Gate) Budget(ctx context.Context) (float64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	mc := float64(g.cfg.MaxConcurrency)
	if mc <= 0 {
		mc = math.Ceil(g.cfg.MaxWindow)
	}
	now := g.cfg.Now()
	g.mu.Lock()
	allowance, inUse := 0.0, false
	for i := range g.bands {
		b := &g.bands[i]
		if !active(b, now) {
			continue
		}
		inUse = true
		if !now.Before(b.closedUntil) {
			allowance += math.Floor(b.w)
		}
	}
	g.mu.Unlock()
	if !inUse {
		allowance = math.Floor(g.cfg.InitialWindow)
	}
	return min(1, allowance/mc), nil
}

// Admit admits req while its band has fewer requests in flight than its
// window; otherwise a reserved request waits and any other is deferred,
// for the band's Retry-After when it is closed, else DeferDelay.
func (g *Gate) Admit(_ context.Context, req *wire.Request) (gate.Decision, error) {
	i := g.BandOf(req)
	now := g.cfg.Now()
	g.mu.Lock()
	b := &g.bands[i]
	b.lastSeen = now
	var delay time.Duration
	var reason string
	switch {
	case now.Before(b.closedUntil):
		delay, reason = b.closedUntil.Sub(now), b.closedReason
	case float64(b.inflight+1) > b.w:
		delay, reason = g.cfg.DeferDelay, b.fullReason
	default:
		b.inflight++
		t := &ticket{g: g, band: i, seq: g.sent}
		g.sent++
		g.mu.Unlock()
		return gate.Decision{Verdict: gate.Admit, Release: t.release, Observe: t.observe}, nil
	}
	g.mu.Unlock()
	v := gate.Defer
	if req.Classification() == wire.ClassReserved {
		v = gate.Wait
	}
	return gate.Decision{Verdict: v, Delay: delay, Reason: reason}, nil
}

// ticket is one admission: its band, its place in the send order, and
// whether it was released and observed.
type ticket struct {
	g        *Gate
	band     int
	seq      uint64
	released atomic.Bool
	observed atomic.Bool
}

// release gives the band's slot back, once.
func (t *ticket) release() {
	if t.released.Swap(true) {
		return
	}
	t.g.mu.Lock()
	t.g.bands[t.band].inflight--
	t.g.mu.Unlock()
}

// observe learns the gateway's answer, once.
func (t *ticket) observe(fb gate.Feedback) {
	if t.observed.Swap(true) {
		return
	}
	t.g.learn(t.band, t.seq, fb)
}

// outcome is what an answer says about the pool's capacity.
type outcome int

const (
	accepted   outcome = iota
	capacity           // rejected-saturated, or a bare 429
	ttlExpired         // rejected-ttl-expired
	neutral            // evicted, another reason, an error
)

// classify reads an answer as upstream's table does.
func (g *Gate) classify(fb gate.Feedback) outcome {
	if fb.StatusCode >= 200 && fb.StatusCode <= 299 {
		return accepted
	}
	reason := ""
	if fb.Header != nil {
		reason = strings.TrimSpace(fb.Header.Get(g.cfg.DroppedReasonHeader))
	}
	switch {
	case reason == reasonSaturated:
		return capacity
	case reason == reasonTTLExpired:
		return ttlExpired
	case reason == "" && fb.StatusCode == 429:
		return capacity
	}
	return neutral // evicted*, any other reason, errors, 5xx, other 4xx
}

// headerNumber reads a numeric header; ok is false when it is absent or
// not a number.
func headerNumber(fb gate.Feedback, name string) (float64, bool) {
	if fb.Header == nil {
		return 0, false
	}
	v := fb.Header.Get(name)
	if v == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	return f, true
}

// learn applies one answer of a request of band i sent as the seq-th.
func (g *Gate) learn(i int, seq uint64, fb gate.Feedback) {
	out := g.classify(fb)
	now := g.cfg.Now()
	headroom, hasHeadroom := 0.0, false
	queued, hasQueued := 0.0, false
	if !g.cfg.NoFlowHeaders {
		headroom, hasHeadroom = headerNumber(fb, g.cfg.HeadroomHeader)
		if g.cfg.QueueDurationTarget > 0 {
			queued, hasQueued = headerNumber(fb, g.cfg.QueueDurationHeader)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.react(i, seq, out, fb.RetryAfter, queued, hasQueued, now)
	if b := &g.bands[i]; hasHeadroom {
		// The band cannot hold more than the gateway says is free plus
		// what this gate has in flight in it.
		if limit := max(b.lo, float64(b.inflight)+math.Floor(headroom)); b.w > limit {
			b.w = limit
			g.events[EventHeadroomCap]++
		}
	}
}

// react applies an answer's outcome to band i and its neighbours. Caller holds mu.
func (g *Gate) react(i int, seq uint64, out outcome, retryAfter time.Duration, queued float64, hasQueued bool, now time.Time) {
	b := &g.bands[i]
	switch out {
	case accepted:
		// Evidence that the pool had margin at and below band i: clear the
		// holds above it set before this request was sent.
		for j := range i {
			if a := &g.bands[j]; seq >= a.holdSeq {
				a.heldUntil = time.Time{}
			}
		}
		if hasQueued {
			target := float64(g.cfg.QueueDurationTarget) / float64(time.Millisecond)
			switch {
			case queued > 2*target:
				if g.decrease(i, seq, g.cfg.GentleDecreaseFactor) {
					g.events[EventDecreaseQueueDuration]++
				}
				return
			case queued > target:
				return // hold: no growth
			}
		}
		g.grow(b, seq, now)
	case capacity:
		if retryAfter > 0 {
			until := now.Add(retryAfter)
			for j := i; j < NumBands; j++ {
				g.close(j, seq, until, j == i || active(&g.bands[j], now))
			}
		} else {
			if g.decrease(i, seq, g.cfg.DecreaseFactor) {
				g.events[EventDecreaseSaturated]++
			} else {
				g.events[EventCoalesced]++
			}
			for j := i + 1; j < NumBands; j++ {
				if g.coupledDecrease(j, seq, now) {
					g.events[EventDecreaseCoupled]++
				}
			}
		}
		g.holdAbove(i, now)
	case ttlExpired:
		if g.decrease(i, seq, g.cfg.GentleDecreaseFactor) {
			g.events[EventDecreaseTTL]++
		}
		g.holdAbove(i, now)
	}
}

// grow applies an accepted answer to b: slow start below ssthresh, then
// additive increase, unless b is held, closed, or decreased after the
// request was sent.
func (g *Gate) grow(b *band, seq uint64, now time.Time) {
	if seq < b.decreasedAt || now.Before(b.heldUntil) || now.Before(b.closedUntil) {
		return
	}
	if b.w < b.ssthresh {
		b.w += g.cfg.Increase
	} else {
		b.w += g.cfg.Increase / b.w
	}
	b.w = min(b.w, b.hi)
}

// decrease multiplies band j's window by f, once per flight: not when the
// request (seq) was sent before j's last decrease. It reports whether it
// decreased.
func (g *Gate) decrease(j int, seq uint64, f float64) bool {
	b := &g.bands[j]
	if seq < b.decreasedAt {
		return false
	}
	b.ssthresh = max(b.lo, b.w*f)
	b.w = b.ssthresh
	b.decreasedAt = g.sent
	b.decreases++
	return true
}

// coupledDecrease decreases band j, below a band whose request was
// rejected. A band in use decreases as on its own rejection; an idle band
// (no request for activeFor) only has its window shrunk, keeping its
// ssthresh, so that when its traffic starts it still opens in slow start
// (as TCP restarts an idle connection) instead of creeping up from the
// minimum in additive increase.
func (g *Gate) coupledDecrease(j int, seq uint64, now time.Time) bool {
	b := &g.bands[j]
	if active(b, now) {
		return g.decrease(j, seq, g.cfg.DecreaseFactor)
	}
	if b.w <= b.lo {
		return false
	}
	b.w = max(b.lo, b.w*g.cfg.DecreaseFactor)
	return true
}

// active says b saw a request in the last activeFor.
func active(b *band, now time.Time) bool {
	return !b.lastSeen.IsZero() && now.Sub(b.lastSeen) <= activeFor
}

// close closes band j until until (a Retry-After is a server instruction:
// it applies whenever the request was sent) and drops its window to its
// minimum; lower says whether ssthresh is lowered too (the rejecting band
// and the bands in use below it, once per flight, as a decrease; an idle
// band keeps its slow start).
func (g *Gate) close(j int, seq uint64, until time.Time, lower bool) {
	b := &g.bands[j]
	if lower && seq >= b.decreasedAt {
		b.ssthresh = max(b.lo, b.w*g.cfg.DecreaseFactor)
		b.decreases++
	}
	b.w = b.lo
	b.decreasedAt = g.sent
	if until.After(b.closedUntil) {
		b.closedUntil = until
	}
	g.events[EventCloseRetryAfter]++
}

// holdAbove holds the growth of every band above i for HoldDuration.
func (g *Gate) holdAbove(i int, now time.Time) {
	if g.cfg.HoldDuration <= 0 {
		return
	}
	until := now.Add(g.cfg.HoldDuration)
	for j := range i {
		a := &g.bands[j]
		if until.After(a.heldUntil) {
			a.heldUntil = until
		}
		a.holdSeq = g.sent
	}
}

// BandState is one band's controller state, for metrics and tests.
type BandState struct {
	// Name is the band's name.
	Name string
	// Window is the congestion window; SSThresh the slow-start threshold.
	Window, SSThresh float64
	// InFlight is how many admitted requests of the band are not released.
	InFlight int
	// Closed says a Retry-After closes the band now; Held that its growth is held.
	Closed, Held bool
	// Decreases counts the band's decreases and closes.
	Decreases uint64
}

// Bands returns the state of every band, in priority order.
func (g *Gate) Bands() []BandState {
	now := g.cfg.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]BandState, NumBands)
	for i := range g.bands {
		b := &g.bands[i]
		out[i] = BandState{Name: bandNames[i], Window: b.w, SSThresh: b.ssthresh, InFlight: b.inflight,
			Closed: now.Before(b.closedUntil), Held: now.Before(b.heldUntil), Decreases: b.decreases}
	}
	return out
}

// Windows returns the bands' windows, for sluice_gate_window{gate, band}.
func (g *Gate) Windows() []gate.Window {
	bs := g.Bands()
	out := make([]gate.Window, len(bs))
	for i, b := range bs {
		out[i] = gate.Window{Band: b.Name, Size: b.Window, SSThresh: b.SSThresh, InFlight: b.InFlight, Closed: b.Closed}
	}
	return out
}

// RegisterMetrics registers the gate's series on reg (gate.Env.Metrics,
// which labels them with the gate's name; nil: none): its windows,
// sluice_gate_window{gate, band} and companions, and its counters,
// sluice_gate_events_total{gate, event}.
func (g *Gate) RegisterMetrics(reg prometheus.Registerer) error {
	return gate.Register(reg, gate.WindowsCollector(g.Windows), gate.EventsCollector(g.Events))
}

// Events returns the gate's counters: decreases by reason, closes,
// coalesced rejections, headroom caps.
func (g *Gate) Events() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int64, len(g.events))
	for k, v := range g.events {
		out[k] = v
	}
	return out
}

// Describe says how the gate sizes its windows.
func (g *Gate) Describe() string {
	c := g.cfg
	mc := c.MaxConcurrency
	if mc <= 0 {
		mc = int(math.Ceil(c.MaxWindow))
	}
	return fmt.Sprintf("sizes one window per (classification × tier) band from the gateway's answers: windows %g…%g (start %g), "+
		"+%g per answer in slow start then +%g/window, ×%g once per flight on %s or a bare 429 (and on the bands below), "+
		"Retry-After closes a band; budget = open windows / %d in flight",
		c.MinWindow, c.MaxWindow, c.InitialWindow, c.Increase, c.Increase, c.DecreaseFactor, reasonSaturated, mc)
}
