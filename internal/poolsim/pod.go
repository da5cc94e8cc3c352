package poolsim

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Histogram buckets of the vLLM series (vllm/v1/metrics/loggers.py).
var (
	bucketsTTFT = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	bucketsTPOT = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
		2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	bucketsRequest = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	bucketsIteration = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	bucketsStep      = []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1}
	bucketsLag       = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1}
)

// hist is a histogram kept under its owner's lock and exported as a
// constant metric.
type hist struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; the last is +Inf
	sum    float64
	n      uint64
}

func newHist(bounds []float64) hist {
	return hist{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *hist) observe(v float64) {
	h.counts[sort.SearchFloat64s(h.bounds, v)]++
	h.sum += v
	h.n++
}

// cumulative returns the buckets as Prometheus wants them.
func (h *hist) cumulative() map[float64]uint64 {
	m := make(map[float64]uint64, len(h.bounds))
	var c uint64
	for i, b := range h.bounds {
		c += h.counts[i]
		m[b] = c
	}
	return m
}

// podMetrics are one pod's vLLM counters and histograms, guarded by the
// pod's lock.
type podMetrics struct {
	promptTokens, generationTokens uint64
	success                        map[string]uint64 // by finished_reason
	ttft, itl, e2e, queue          hist
	prefill, decode, inference     hist
	iterTokens, stepSec, lagSec    hist
	steps                          uint64
}

func newPodMetrics() podMetrics {
	return podMetrics{
		success:    map[string]uint64{finishStop: 0, finishLength: 0, finishAbort: 0},
		ttft:       newHist(bucketsTTFT),
		itl:        newHist(bucketsTPOT),
		e2e:        newHist(bucketsRequest),
		queue:      newHist(bucketsRequest),
		prefill:    newHist(bucketsRequest),
		decode:     newHist(bucketsRequest),
		inference:  newHist(bucketsRequest),
		iterTokens: newHist(bucketsIteration),
		stepSec:    newHist(bucketsStep),
		lagSec:     newHist(bucketsLag),
	}
}

// PodGauges is a live reading of one pod.
type PodGauges struct {
	// Running and Waiting are vllm:num_requests_running and _waiting.
	Running, Waiting int
	// KVUsage is vllm:kv_cache_usage_perc, in [0,1].
	KVUsage float64
	// RunningByClass and WaitingByClass split them by class (index: Class).
	RunningByClass, WaitingByClass [numClasses]int
	// Preemptions is vllm:num_preemptions_total.
	Preemptions uint64
	// PrefixHits is vllm:prefix_cache_hits_total: prompt tokens the prefix
	// cache served.
	PrefixHits uint64
}

// stream is how an engine tells the handler of one request about its
// progress. Its fields are guarded by mu; notify (capacity 1) is signalled
// after each change.
type stream struct {
	notify chan struct{}
	every  bool // signal every token (streamed answers); else the first and the last only

	mu          sync.Mutex
	tokens      int
	preemptions int
	done        bool
	reason      string
	firstSched  time.Time
	firstToken  time.Time
}

func newStream() *stream { return &stream{notify: make(chan struct{}, 1)} }

func (st *stream) signal() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

// progress is a copy of a stream's fields.
type progress struct {
	tokens, preemptions   int
	done                  bool
	reason                string
	firstSched, firstTick time.Time
}

func (st *stream) read() progress {
	st.mu.Lock()
	defer st.mu.Unlock()
	return progress{st.tokens, st.preemptions, st.done, st.reason, st.firstSched, st.firstToken}
}

// pod is one engine and its step loop.
type pod struct {
	idx  int
	name string
	pool *Pool

	wake chan struct{} // capacity 1: work arrived

	mu  sync.Mutex
	eng *engine
	m   podMetrics

	stalled atomic.Bool // the front's reads of this pod fail (tests, chaos)
}

func newPod(p *Pool, idx int, eng *engine) *pod {
	return &pod{idx: idx, name: podName(idx), pool: p, wake: make(chan struct{}, 1), eng: eng, m: newPodMetrics()}
}

func podName(i int) string { return "pod-" + strconv.Itoa(i) }

// gauges reads the pod's gauges.
func (d *pod) gauges() PodGauges {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gaugesLocked()
}

func (d *pod) gaugesLocked() PodGauges {
	g := PodGauges{Running: len(d.eng.running), Waiting: d.eng.waiting.len(), KVUsage: d.eng.usage(), Preemptions: d.eng.preemptions,
		PrefixHits: d.eng.prefixHits}
	g.RunningByClass, g.WaitingByClass = d.eng.classCounts()
	return g
}

// submit queues s and wakes the loop.
func (d *pod) submit(s *seq) {
	d.mu.Lock()
	d.eng.add(s)
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// cancel removes s (its client went away) and reports whether it was still
// in the engine.
func (d *pod) cancel(s *seq, now time.Time) bool {
	d.mu.Lock()
	ok := d.eng.cancel(s)
	if ok {
		s.finished = now
		s.reason = finishAbort
		d.m.success[finishAbort]++
	}
	d.mu.Unlock()
	return ok
}

// run is the step loop. Steps are scheduled on absolute deadlines: a step
// starts when the previous one was due to end, so a late wake-up does not
// push every later step back; the lateness is recorded as step lag.
func (d *pod) run(ctx context.Context) {
	var next time.Time // when the next step is due; zero after idling
	var done []*seq
	for {
		d.mu.Lock()
		if !d.eng.hasWork() {
			d.mu.Unlock()
			next = time.Time{}
			select {
			case <-d.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		if next.IsZero() {
			next = time.Now()
		}
		st := d.eng.schedule(next)
		d.mu.Unlock()
		if len(st.seqs) == 0 {
			// Everything was preempted, or the head cannot get blocks while
			// nothing runs (impossible with valid config): try again at once
			// if preemptions freed room, else wait for a change.
			if st.preempted > 0 {
				continue
			}
			select {
			case <-d.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		end := next.Add(st.duration)
		if !sleepUntil(ctx, end) {
			return
		}
		lag := time.Since(end)
		d.mu.Lock()
		done = d.finishStep(st, end, lag, done[:0])
		d.mu.Unlock()
		for _, s := range done {
			d.pool.finished(d, s)
		}
		next = end
	}
}

// finishStep completes st at end under the pod's lock, updates the metrics
// and the streams, and appends the finished sequences to done.
func (d *pod) finishStep(st step, end time.Time, lag time.Duration, done []*seq) []*seq {
	m := &d.m
	m.steps++
	m.iterTokens.observe(float64(st.tokens))
	m.stepSec.observe(st.duration.Seconds())
	m.lagSec.observe(max(0, lag).Seconds())
	d.pool.lag.record(lag, st.duration)
	d.eng.complete(st, end, func(s *seq) {
		m.generationTokens++
		if s.output == 1 {
			m.promptTokens += uint64(s.prompt)
			m.ttft.observe(end.Sub(s.arrival).Seconds())
		} else {
			m.itl.observe(end.Sub(s.prevToken).Seconds())
		}
		if s.state == stateDone {
			if s.reason == "" {
				s.reason = finishLength
			}
			m.success[s.reason]++
			m.e2e.observe(end.Sub(s.arrival).Seconds())
			m.queue.observe(s.firstSched.Sub(s.arrival).Seconds())
			m.prefill.observe(s.firstToken.Sub(s.firstSched).Seconds())
			m.decode.observe(end.Sub(s.firstToken).Seconds())
			m.inference.observe(end.Sub(s.firstSched).Seconds())
			done = append(done, s)
		}
		if sk := s.sink; sk != nil {
			sk.mu.Lock()
			sk.tokens = s.output
			sk.preemptions = s.preemptions
			sk.firstSched = s.firstSched
			sk.firstToken = s.firstToken
			if s.state == stateDone {
				sk.done = true
				sk.reason = s.reason
			}
			sk.mu.Unlock()
			if sk.every || s.output == 1 || s.state == stateDone {
				sk.signal()
			}
		}
	})
	return done
}

// sleepUntil waits until t or until ctx ends, and reports whether t came.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// maxLagSamples bounds the step-lag samples kept for percentiles.
const maxLagSamples = 1 << 20

// lagRecorder keeps step-lag samples of every pod.
type lagRecorder struct {
	mu      sync.Mutex
	samples []time.Duration // a ring once full
	next    int
	steps   uint64
	max     time.Duration
	stepSum time.Duration // the steps' own durations, for MeanStep
}

func (l *lagRecorder) record(d, step time.Duration) {
	d = max(0, d)
	l.mu.Lock()
	l.steps++
	l.stepSum += step
	l.max = max(l.max, d)
	if len(l.samples) < maxLagSamples {
		l.samples = append(l.samples, d)
	} else {
		l.samples[l.next] = d
		l.next = (l.next + 1) % maxLagSamples
	}
	l.mu.Unlock()
}

// LagStats summarises the step lag: how late steps ended against their
// absolute deadlines. A run whose P99 is more than a few milliseconds was
// not kept up with by the machine and its latencies are suspect.
type LagStats struct {
	// Steps is the number of steps measured.
	Steps uint64
	// P50, P99 and Max are exact over the last 2^20 steps (Max over all).
	P50, P99, Max time.Duration
	// MeanStep is the steps' mean duration: the scale the lag is judged
	// against (a lag p99 under 5 % of it kept the model in time).
	MeanStep time.Duration
}

func (l *lagRecorder) snapshot(reset bool) LagStats {
	l.mu.Lock()
	s := slices.Clone(l.samples)
	st := LagStats{Steps: l.steps, Max: l.max}
	if l.steps > 0 {
		st.MeanStep = l.stepSum / time.Duration(l.steps)
	}
	if reset {
		l.samples, l.next, l.steps, l.max, l.stepSum = l.samples[:0], 0, 0, 0, 0
	}
	l.mu.Unlock()
	if len(s) == 0 {
		return st
	}
	slices.Sort(s)
	st.P50 = s[rank(len(s), 0.50)]
	st.P99 = s[rank(len(s), 0.99)]
	return st
}

// rank is the nearest-rank index of quantile q among n sorted samples.
func rank(n int, q float64) int {
	i := int(q*float64(n)+0.999999999) - 1
	return min(max(i, 0), n-1)
}
