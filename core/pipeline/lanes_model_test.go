package pipeline

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// laneModel is the executable model of a worker pool's lanes (lanes.go):
// the waiters of each lane by source in arrival order, the workers each
// source's requests hold, each source's in-flight limit and whether the
// pool is open. It is fed the real lanes' grants (LaneGranted events) and
// the test's own steps, and states the invariants the real lanes must keep:
//
//   - workers are conserved: free + Σ running = workers, free ≥ 0;
//   - no source holds more workers than its limit because of a grant;
//   - work-conserving: after every step, while the pool is open and a
//     worker is free, no waiter that may start is left waiting;
//   - each source's waiters are granted in arrival order (FIFO);
//   - without shares, each grant goes to the lowest lane that had a waiter
//     that may start (strict priority);
//   - with shares, a lane with share s that has had a waiter that may start
//     at each of the last N grants received at least s×N − (k+1) of them
//     (k lanes with a share).
type laneModel struct {
	workers int
	free    int
	open    bool
	limit   map[string]int
	running map[string]int
	waiting [NumLanes]map[string][]uint64 // seqs in arrival order
	share   [NumLanes]float64
	k       int // lanes with a share
	// window[l], served[l]: grants since lane l last had no startable
	// waiter at a grant, and how many of them went to l.
	window, served [NumLanes]int
	grants         [NumLanes]int // all grants by lane
	errs           []error
}

func newLaneModel(workers int, share [NumLanes]float64) *laneModel {
	m := &laneModel{workers: workers, free: workers, open: true, limit: map[string]int{}, running: map[string]int{}, share: share}
	for i := range m.waiting {
		m.waiting[i] = map[string][]uint64{}
	}
	for _, s := range share {
		if s > 0 {
			m.k++
		}
	}
	return m
}

func (m *laneModel) failf(format string, args ...any) {
	m.errs = append(m.errs, fmt.Errorf(format, args...))
}

// startable reports whether lane has a waiter whose source may start.
func (m *laneModel) startable(lane int) bool {
	for src, ws := range m.waiting[lane] {
		if len(ws) > 0 && m.running[src] < m.limit[src] {
			return true
		}
	}
	return false
}

// granted checks and applies one grant the real lanes made.
func (m *laneModel) granted(ev LaneEvent) {
	if !m.open || m.free <= 0 {
		m.failf("grant of seq %d with the pool closed or no worker free (free %d)", ev.Seq, m.free)
	}
	if m.running[ev.Queue] >= m.limit[ev.Queue] {
		m.failf("grant to %s at its limit %d", ev.Queue, m.limit[ev.Queue])
	}
	ws := m.waiting[ev.Lane][ev.Queue]
	if len(ws) == 0 || ws[0] != ev.Seq {
		m.failf("grant of seq %d in lane %d/%s, first waiter %v (not FIFO)", ev.Seq, ev.Lane, ev.Queue, ws)
	}
	var ready [NumLanes]bool
	lowest := -1
	for l := range ready {
		ready[l] = m.startable(l)
		if ready[l] && lowest < 0 {
			lowest = l
		}
	}
	if !ready[ev.Lane] {
		m.failf("grant to lane %d, which had no waiter that may start", ev.Lane)
	}
	if m.k == 0 && ev.Lane != lowest {
		m.failf("strict priority: grant to lane %d while lane %d had a waiter that may start", ev.Lane, lowest)
	}
	for l := range ready {
		if !ready[l] {
			m.window[l], m.served[l] = 0, 0
			continue
		}
		m.window[l]++
		if l == ev.Lane {
			m.served[l]++
		}
		if s := m.share[l]; s > 0 && float64(m.served[l]) < s*float64(m.window[l])-float64(m.k+1)-1e-9 {
			m.failf("lane %d, share %v: %d of the last %d grants", l, s, m.served[l], m.window[l])
		}
	}
	if len(ws) > 0 {
		m.waiting[ev.Lane][ev.Queue] = ws[1:]
	}
	m.grants[ev.Lane]++
	m.free--
	m.running[ev.Queue]++
}

// check compares the model with the real lanes after a step.
func (m *laneModel) check(t *rapid.T, l *lanes) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := errors.Join(m.errs...); err != nil {
		t.Fatal(err)
	}
	if l.free != m.free || m.free < 0 {
		t.Fatalf("free workers: lanes %d, model %d", l.free, m.free)
	}
	sum := 0
	for src, n := range m.running {
		sum += n
		if got := l.sources[src].running; got != n {
			t.Fatalf("%s running: lanes %d, model %d", src, got, n)
		}
	}
	if sum+m.free != m.workers {
		t.Fatalf("workers not conserved: %d running + %d free != %d", sum, m.free, m.workers)
	}
	for lane := range m.waiting {
		n := 0
		for _, ws := range m.waiting[lane] {
			n += len(ws)
		}
		if l.queues[lane].nwaiting != n {
			t.Fatalf("lane %d waiting: lanes %d, model %d", lane, l.queues[lane].nwaiting, n)
		}
		if m.open && m.free > 0 && m.startable(lane) {
			t.Fatalf("a worker is free and lane %d has a waiter that may start", lane)
		}
	}
}

// laneRig drives the real lanes and the model side by side.
type laneRig struct {
	l       *lanes
	m       *laneModel
	sources []string
	follow  map[string]sourceFollower
	waiters map[uint64]laneHandle // waiting, by seq
	holders []string              // the source of each request holding a worker
}

type laneHandle struct {
	w    *laneWaiter
	lane int
	src  string
}

func newLaneRig(workers int, share [NumLanes]float64, sources []string, max int) *laneRig {
	p := &Priority{MinShare: share}
	r := &laneRig{l: newLanes(workers, p), m: newLaneModel(workers, share), sources: sources,
		follow: map[string]sourceFollower{}, waiters: map[uint64]laneHandle{}}
	r.l.observe = func(ev LaneEvent) {
		if ev.Kind == LaneGranted {
			r.m.granted(ev)
			delete(r.waiters, ev.Seq)
			r.holders = append(r.holders, ev.Queue)
		}
	}
	for _, s := range sources {
		r.follow[s] = r.l.addSource(s, max)
		r.m.limit[s] = 0
		r.m.running[s] = 0
	}
	return r
}

func (r *laneRig) setBudget(src string, b float64) {
	r.m.limit[src] = int(math.Ceil(float64(r.l.sources[src].max) * b))
	r.follow[src].SetBudget(b)
}

func (r *laneRig) arrive(lane int, src string) {
	r.l.mu.Lock()
	seq := r.l.seq + 1 // the seq enqueue gives it (observed)
	r.l.mu.Unlock()
	r.m.waiting[lane][src] = append(r.m.waiting[lane][src], seq)
	w, granted := r.l.enqueue(lane, src)
	if w.seq != seq {
		panic(fmt.Sprintf("seq %d, want %d", w.seq, seq))
	}
	if !granted {
		r.waiters[seq] = laneHandle{w, lane, src}
	}
}

func (r *laneRig) finish(i int) {
	src := r.holders[i]
	r.holders = append(r.holders[:i:i], r.holders[i+1:]...)
	r.m.free++
	r.m.running[src]--
	r.l.release(src)
}

func (r *laneRig) abandon(seq uint64) {
	h := r.waiters[seq]
	delete(r.waiters, seq)
	ws := r.m.waiting[h.lane][h.src]
	for i, s := range ws {
		if s == seq {
			r.m.waiting[h.lane][h.src] = append(ws[:i:i], ws[i+1:]...)
		}
	}
	_ = r.l.abandon(h.w, h.lane, h.src, errDraining)
}

func (r *laneRig) setOpen(open bool) {
	r.m.open = open
	b := 0.0
	if open {
		b = 1
	}
	r.l.SetBudget(b)
}

// drawShares draws minimum shares summing to at most 1 for a few lanes
// (all zero when off).
func drawShares(t *rapid.T, on bool) (share [NumLanes]float64) {
	if !on {
		return share
	}
	left := 1.0
	for _, lane := range rapid.SliceOfNDistinct(rapid.IntRange(0, NumLanes-1), 1, 3, rapid.ID).Draw(t, "share lanes") {
		s := rapid.Float64Range(0.01, left).Draw(t, fmt.Sprintf("share %d", lane))
		share[lane] = s
		left -= s
		if left < 0.01 {
			break
		}
	}
	return share
}

// TestModelLanes runs random interleavings of arrivals, ends, abandons,
// budget changes and pool closes against the real lanes, with and without
// minimum shares, and checks the model's invariants after every step.
func TestModelLanes(t *testing.T) {
	for _, shares := range []bool{false, true} {
		t.Run(fmt.Sprintf("shares=%v", shares), func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				workers := rapid.IntRange(1, 4).Draw(t, "workers")
				r := newLaneRig(workers, drawShares(t, shares), []string{"q1", "q2", "q3"}, rapid.IntRange(1, 3).Draw(t, "max"))
				for _, s := range r.sources {
					r.setBudget(s, 1)
				}
				src := rapid.SampledFrom(r.sources)
				t.Repeat(map[string]func(*rapid.T){
					"arrive": func(t *rapid.T) {
						r.arrive(rapid.IntRange(0, NumLanes-1).Draw(t, "lane"), src.Draw(t, "src"))
					},
					"finish": func(t *rapid.T) {
						if len(r.holders) == 0 {
							t.Skip("none running")
						}
						r.finish(rapid.IntRange(0, len(r.holders)-1).Draw(t, "holder"))
					},
					"abandon": func(t *rapid.T) {
						if len(r.waiters) == 0 {
							t.Skip("none waiting")
						}
						var seqs []uint64
						for s := range r.waiters {
							seqs = append(seqs, s)
						}
						slices.Sort(seqs) // drawn reproducibly
						r.abandon(rapid.SampledFrom(seqs).Draw(t, "seq"))
					},
					"budget": func(t *rapid.T) {
						r.setBudget(src.Draw(t, "src"), rapid.SampledFrom([]float64{0, 0.5, 1}).Draw(t, "budget"))
					},
					"pool": func(t *rapid.T) {
						r.setOpen(rapid.Bool().Draw(t, "open"))
					},
					"": func(t *rapid.T) { r.m.check(t, r.l) },
				})
			})
		})
	}
}

// starve runs a pool of workers under continuous load in lane 0 (always
// as many waiters as workers) with one waiter always in lane 5, for n
// request ends, and returns how many grants lane 5 got.
func starve(t *rapid.T, workers, n int, share [NumLanes]float64) int {
	r := newLaneRig(workers, share, []string{"hi", "lo"}, workers)
	r.setBudget("hi", 1)
	r.setBudget("lo", 1)
	refill := func() {
		for r.m.waitingIn(0) < workers {
			r.arrive(0, "hi")
		}
		if r.m.waitingIn(5) == 0 {
			r.arrive(5, "lo")
		}
	}
	refill()
	for range n {
		r.finish(rapid.IntRange(0, len(r.holders)-1).Draw(t, "holder"))
		refill()
		r.m.check(t, r.l)
	}
	return r.m.grants[5]
}

func (m *laneModel) waitingIn(lane int) int {
	n := 0
	for _, ws := range m.waiting[lane] {
		n += len(ws)
	}
	return n
}

// TestModelLanesStrictPriorityStarves: without a share, under continuous load
// in the top lane, the bottom lane never gets a worker (upstream's
// MergePriority, as its TLA+ model shows).
func TestModelLanesStrictPriorityStarves(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		workers := rapid.IntRange(1, 4).Draw(t, "workers")
		n := rapid.IntRange(50, 300).Draw(t, "ends")
		if got := starve(t, workers, n, [NumLanes]float64{}); got != 0 {
			t.Fatalf("lane 5 got %d grants under strict priority, want 0", got)
		}
	})
}

// TestModelLanesMinShareServesLowLane: with a minimum share for the bottom lane,
// under the same load, it gets at least its share of the grants.
func TestModelLanesMinShareServesLowLane(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		workers := rapid.IntRange(1, 4).Draw(t, "workers")
		n := rapid.IntRange(50, 300).Draw(t, "ends")
		s := rapid.Float64Range(0.05, 0.5).Draw(t, "share")
		var share [NumLanes]float64
		share[5] = s
		got := starve(t, workers, n, share)
		// The first `workers` grants were made with lane 5 empty or
		// fresh; n more were made while it waited.
		if want := int(s*float64(n)) - 2; got < want {
			t.Fatalf("lane 5 got %d of %d grants with share %v, want at least %d", got, n+workers, s, want)
		}
	})
}

func TestPriorityValidate(t *testing.T) {
	for _, tc := range []struct {
		share [NumLanes]float64
		err   string
	}{
		{[NumLanes]float64{}, ""},
		{[NumLanes]float64{5: 0.2, 2: 0.8}, ""},
		{[NumLanes]float64{5: -0.1}, "not in [0,1]"},
		{[NumLanes]float64{5: math.NaN()}, "not in [0,1]"},
		{[NumLanes]float64{1: 0.6, 5: 0.6}, "sum to"},
	} {
		err := (&Priority{MinShare: tc.share}).Validate()
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: error %v, want %q", tc.share, err, tc.err)
		}
	}
}
