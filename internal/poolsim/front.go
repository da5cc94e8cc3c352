package poolsim

import (
	"container/list"
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// Reasons of x-llm-d-request-dropped-reason the front sends.
const (
	ReasonSaturated  = "rejected-saturated"
	ReasonTTLExpired = "rejected-ttl-expired"
)

// HeaderDroppedReason carries the reason of a front rejection, as the EPP.
const HeaderDroppedReason = "X-Llm-D-Request-Dropped-Reason"

// Outcomes of llm_d_epp_flow_control_requests_total (GIE's QueueOutcome).
const (
	outcomeDispatched       = "Dispatched"
	outcomeRejectedCapacity = "RejectedCapacity"
	outcomeEvictedTTL       = "EvictedTTL"
	outcomeEvictedCancelled = "EvictedContextCancelled"
)

// snap is the front's last read of one pod.
type snap struct {
	at               time.Time // zero: never read
	running, waiting int
	kv               float64
}

// queueKey identifies one flow-control queue-size series.
type queueKey struct {
	fairness, model string
	priority        int
}

// outcomeKey identifies one llm_d_epp_flow_control_requests_total series.
type outcomeKey struct {
	outcome  string
	priority int
}

// poolAverages are the inference_pool_* gauges, written every flush.
type poolAverages struct {
	written              bool
	kv, queue, running   float64
	kvSD, queueSD, runSD float64
	ready                int
}

// fcItem is one request held by flow control.
type fcItem struct {
	req      *request
	key      queueKey
	enqueued time.Time
	expires  time.Time
	elem     *list.Element
	band     *band
	// decided is closed once pod (≥ 0, dispatched) or status (a rejection)
	// is set.
	decided chan struct{}
	pod     int
	status  int
	reason  string
}

type band struct {
	priority int
	items    *list.List // of *fcItem, FIFO
}

// front is the EPP-like front: it reads the pods' gauges, computes the
// saturation, admits and routes.
type front struct {
	cfg  FrontConfig
	pool *Pool
	kick chan struct{} // capacity 1: run a dispatch cycle

	mu           sync.Mutex
	snaps        []snap
	sinceRead    []int // requests routed to each pod since its last read
	inflight     []int // requests dispatched to each pod and not finished
	saturation   float64
	stale        int
	avg          poolAverages
	bands        []*band // by priority, highest first
	queued       map[queueKey]int
	outcomes     map[outcomeKey]uint64
	rejected     map[string]uint64 // by reason, every mode; never reset
	rejectedBase map[string]uint64 // rejected at the last Pool.ResetStats
	recent       [][]string        // texts routed to each pod lately (PrefixAware)
	rnd          rng
}

func newFront(p *Pool) *front {
	n := len(p.pods)
	return &front{
		cfg: p.cfg.Front, pool: p, kick: make(chan struct{}, 1),
		snaps: make([]snap, n), sinceRead: make([]int, n), inflight: make([]int, n), recent: make([][]string, n),
		saturation: 1, queued: map[queueKey]int{}, outcomes: map[outcomeKey]uint64{},
		rejected: map[string]uint64{}, rejectedBase: map[string]uint64{}, rnd: newRNG(p.seed, 1<<40),
	}
}

// detectorName is the detector label of the stale-endpoints series.
func (f *front) detectorName() string {
	if f.cfg.Detector == DetectorConcurrency {
		return "concurrency-detector"
	}
	return "utilization-detector"
}

// refresh reads every pod's gauges, as the EPP's 50-ms scrape.
func (f *front) refresh(now time.Time) {
	for i, d := range f.pool.pods {
		if d.stalled.Load() {
			continue // the read fails: the old snapshot ages
		}
		g := d.gauges()
		f.mu.Lock()
		f.snaps[i] = snap{at: now, running: g.Running, waiting: g.Waiting, kv: g.KVUsage}
		f.sinceRead[i] = 0
		f.mu.Unlock()
	}
	f.mu.Lock()
	f.saturation = f.saturationLocked(now)
	f.mu.Unlock()
}

// fresh reports whether pod i's read is recent enough to trust.
func (f *front) fresh(i int, now time.Time) bool {
	s := f.snaps[i]
	return !s.at.IsZero() && (f.cfg.StalenessThreshold <= 0 || now.Sub(s.at) <= f.cfg.StalenessThreshold)
}

// saturationLocked computes the detector's pool saturation and the stale
// count. Utilization: the average over pods of max(waiting/Q, kv/KV),
// stale pods scoring 1 (uncapped). Concurrency: Σ in-flight / (pods·max).
func (f *front) saturationLocked(now time.Time) float64 {
	n := len(f.snaps)
	if n == 0 {
		return 1
	}
	if f.cfg.Detector == DetectorConcurrency {
		total := 0
		for _, c := range f.inflight {
			total += c
		}
		f.stale = 0
		return float64(total) / float64(n*f.cfg.MaxConcurrency)
	}
	sum, stale := 0.0, 0
	for i, s := range f.snaps {
		if !f.fresh(i, now) {
			stale++
			sum++
			continue
		}
		sum += math.Max(float64(s.waiting)/f.cfg.QueueDepthThreshold, s.kv/f.cfg.KVCacheUtilThreshold)
	}
	f.stale = stale
	return sum / float64(n)
}

// Saturation is the pool saturation as the front's detector sees it now
// (from the last read of the pods).
func (f *front) currentSaturation(now time.Time) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.saturation = f.saturationLocked(now)
	return f.saturation
}

// routeLocked picks a pod: among those the utilization filter keeps (all,
// when it would keep none), the one with the fewest waiting (its last read
// plus the requests sent to it since), then running; ties at random.
func (f *front) pickLocked(now time.Time) int {
	n := len(f.snaps)
	cand := make([]int, 0, n)
	if f.cfg.Detector == DetectorUtilization {
		for i, s := range f.snaps {
			if f.fresh(i, now) && float64(s.waiting) < f.cfg.QueueDepthThreshold && s.kv < math.Min(1, f.cfg.KVCacheUtilThreshold) {
				cand = append(cand, i)
			}
		}
	} else {
		for i, c := range f.inflight {
			if c < f.cfg.MaxConcurrency {
				cand = append(cand, i)
			}
		}
	}
	if len(cand) == 0 {
		for i := range n {
			cand = append(cand, i)
		}
	}
	best, ties := -1, 0
	for _, i := range cand {
		if best < 0 {
			best, ties = i, 1
			continue
		}
		c := cmpLoad(f.snaps[i].waiting+f.sinceRead[i], f.snaps[i].running, f.snaps[best].waiting+f.sinceRead[best], f.snaps[best].running)
		switch {
		case c < 0:
			best, ties = i, 1
		case c == 0:
			ties++
			if f.rnd.intn(ties) == 0 { // reservoir: uniform among the tied
				best = i
			}
		}
	}
	return best
}

// routeLocked picks a pod (pickLocked) and counts the request against it.
func (f *front) routeLocked(now time.Time) int {
	return f.commitLocked(f.pickLocked(now))
}

func (f *front) commitLocked(i int) int {
	f.sinceRead[i]++
	f.inflight[i]++
	return i
}

// prefixAffinityBytes is how much of its text a request must share with
// one routed to a pod before (FrontConfig.PrefixAware) for that pod to be
// preferred: four blocks of 16 tokens at four bytes a token.
const prefixAffinityBytes = 4 * 16 * 4

// recentTexts is how many routed texts the front remembers per pod.
const recentTexts = 64

// routeTextLocked is routeLocked with, under FrontConfig.PrefixAware, the
// EPP's approximate prefix-cache scorer: the front remembers the texts it
// routed to each pod lately, and a request sharing at least
// prefixAffinityBytes of its text with one of them goes to that pod,
// unless that pod has more than one waiting request beyond the pod the
// load alone picks.
func (f *front) routeTextLocked(now time.Time, text string) int {
	pick := f.pickLocked(now)
	if !f.cfg.PrefixAware || text == "" {
		return f.commitLocked(pick)
	}
	best, bestLen := -1, prefixAffinityBytes-1
	for i, texts := range f.recent {
		for _, t := range texts {
			if n := commonPrefix(t, text); n > bestLen {
				best, bestLen = i, n
			}
		}
	}
	load := func(i int) int { return f.snaps[i].waiting + f.sinceRead[i] }
	if best >= 0 && load(best) <= load(pick)+1 {
		pick = best
	}
	r := append(f.recent[pick], text)
	if len(r) > recentTexts {
		r = r[1:]
	}
	f.recent[pick] = r
	return f.commitLocked(pick)
}

func cmpLoad(w1, r1, w2, r2 int) int {
	switch {
	case w1 != w2:
		return w1 - w2
	default:
		return r1 - r2
	}
}

// done notes the end of a request dispatched to pod i.
func (f *front) done(i int) {
	f.mu.Lock()
	if f.inflight[i] > 0 {
		f.inflight[i]--
	}
	f.mu.Unlock()
	f.poke()
}

func (f *front) poke() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// rejection is a front refusal.
type rejection struct {
	status int
	reason string // x-llm-d-request-dropped-reason, "" for none
	msg    string
}

// admit decides where req goes: a pod index, or a rejection. In
// flow-control mode it waits in its band until dispatched, rejected or
// ctx ends (then it returns -1 and a nil rejection).
func (f *front) admit(ctx context.Context, req *request) (int, *rejection) {
	now := time.Now()
	switch f.cfg.Mode {
	case ModeFlowControl:
		return f.enqueue(ctx, req, now)
	case ModeLegacyAdmission:
		f.mu.Lock()
		f.saturation = f.saturationLocked(now)
		if req.eppPriority < 0 && f.saturation >= 1 {
			f.rejected[ReasonSaturated]++
			f.mu.Unlock()
			return -1, &rejection{status: 429, reason: ReasonSaturated, msg: "pool saturated: sheddable request rejected"}
		}
		i := f.routeTextLocked(now, req.text)
		f.mu.Unlock()
		return i, nil
	default:
		f.mu.Lock()
		i := f.routeTextLocked(now, req.text)
		f.mu.Unlock()
		return i, nil
	}
}

func (f *front) bandLocked(priority int) *band {
	i, found := slices.BinarySearchFunc(f.bands, priority, func(b *band, p int) int { return p - b.priority })
	if found {
		return f.bands[i]
	}
	b := &band{priority: priority, items: list.New()}
	f.bands = slices.Insert(f.bands, i, b)
	return b
}

func (f *front) enqueue(ctx context.Context, req *request, now time.Time) (int, *rejection) {
	ttl := f.cfg.RequestTTL
	if req.sloTTFT > 0 && (ttl <= 0 || req.sloTTFT < ttl) {
		ttl = req.sloTTFT
	}
	it := &fcItem{req: req, enqueued: now, decided: make(chan struct{}), pod: -1,
		key: queueKey{fairness: req.fairness, model: req.model, priority: req.eppPriority}}
	if ttl > 0 {
		it.expires = now.Add(ttl)
	}
	f.mu.Lock()
	b := f.bandLocked(req.eppPriority)
	if b.items.Len() >= f.cfg.BandCapacity {
		f.outcomes[outcomeKey{outcomeRejectedCapacity, req.eppPriority}]++
		f.rejected["band-full"]++
		f.mu.Unlock()
		return -1, &rejection{status: 429, msg: "flow control band full"}
	}
	it.band = b
	it.elem = b.items.PushBack(it)
	f.queued[it.key]++
	f.mu.Unlock()
	f.poke()

	var gone <-chan struct{} // the client left, or the pool closed
	select {
	case <-it.decided:
	case <-ctx.Done():
		gone = ctx.Done()
	case <-f.pool.closed:
		gone = f.pool.closed
	}
	if gone != nil {
		f.mu.Lock()
		select {
		case <-it.decided: // decided meanwhile: fall through below
		default:
			f.removeLocked(it)
			close(it.decided)
			if ctx.Err() != nil {
				f.outcomes[outcomeKey{outcomeEvictedCancelled, req.eppPriority}]++
				f.mu.Unlock()
				return -1, nil
			}
			f.mu.Unlock()
			return -1, &rejection{status: 503, reason: "rejected-shutting-down", msg: "flow control: the simulator is shutting down"}
		}
		f.mu.Unlock()
	}
	if it.pod >= 0 {
		return it.pod, nil
	}
	msg := "flow control: the request waited past its TTL"
	if it.reason != ReasonTTLExpired {
		msg = "flow control: " + it.reason
	}
	return -1, &rejection{status: it.status, reason: it.reason, msg: msg}
}

func (f *front) removeLocked(it *fcItem) {
	it.band.items.Remove(it.elem)
	f.queued[it.key]--
}

// ceilingLocked is the saturation ceiling of band rank r of n.
func (f *front) ceilingLocked(r, n int) float64 {
	if f.cfg.CeilingPolicy != CeilingPriorityHoldback || n <= 1 {
		return f.cfg.Ceiling
	}
	return f.cfg.Ceiling - (f.cfg.Ceiling-f.cfg.HoldbackMin)*float64(r)/float64(n-1)
}

// cycle expires items past their TTL, then runs dispatch cycles until one
// stops: walking the bands from the highest priority, a band whose ceiling
// the saturation reaches stops the cycle (head-of-line for lower bands);
// otherwise the first non-empty band dispatches one item.
func (f *front) cycle(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.bands {
		for e := b.items.Front(); e != nil; {
			next := e.Next()
			it := e.Value.(*fcItem)
			if !it.expires.IsZero() && !now.Before(it.expires) {
				f.removeLocked(it)
				f.outcomes[outcomeKey{outcomeEvictedTTL, b.priority}]++
				f.rejected[ReasonTTLExpired]++
				it.status, it.reason = 503, ReasonTTLExpired
				close(it.decided)
			}
			e = next
		}
	}
	for {
		f.saturation = f.saturationLocked(now)
		var pick *fcItem
		for r, b := range f.bands {
			if f.saturation >= f.ceilingLocked(r, len(f.bands)) {
				break
			}
			if b.items.Len() > 0 {
				pick = b.items.Front().Value.(*fcItem)
				break
			}
		}
		if pick == nil {
			return
		}
		f.removeLocked(pick)
		f.outcomes[outcomeKey{outcomeDispatched, pick.band.priority}]++
		pick.pod = f.routeLocked(now)
		close(pick.decided)
	}
}

// flush writes the inference_pool_* averages over the pods with fresh
// reads, as the EPP's 5-s Prometheus refresh.
func (f *front) flush(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var kv, q, r []float64
	for i, s := range f.snaps {
		if f.fresh(i, now) {
			kv = append(kv, s.kv)
			q = append(q, float64(s.waiting))
			r = append(r, float64(s.running))
		}
	}
	a := poolAverages{written: true, ready: len(f.snaps)}
	a.kv, a.kvSD = meanSD(kv)
	a.queue, a.queueSD = meanSD(q)
	a.running, a.runSD = meanSD(r)
	f.avg = a
}

func meanSD(v []float64) (mean, sd float64) {
	if len(v) == 0 {
		return 0, 0
	}
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	for _, x := range v {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(v)))
}

// loop runs the front: reads every RefreshInterval, dispatch cycles on
// every change (and at least every few milliseconds for TTLs), flushes
// every FlushInterval.
func (f *front) loop(ctx context.Context) {
	now := time.Now()
	f.refresh(now)
	f.flush(now)
	refresh := time.NewTicker(f.cfg.RefreshInterval)
	defer refresh.Stop()
	flush := time.NewTicker(f.cfg.FlushInterval)
	defer flush.Stop()
	var tick <-chan time.Time
	if f.cfg.Mode == ModeFlowControl {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-refresh.C:
			f.refresh(now)
		case now := <-flush.C:
			f.flush(now)
		case <-f.kick:
		case <-tick:
		}
		if f.cfg.Mode == ModeFlowControl {
			f.cycle(time.Now())
		}
	}
}

// rejectAll ends every queued item at shutdown.
func (f *front) rejectAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.bands {
		for e := b.items.Front(); e != nil; e = e.Next() {
			it := e.Value.(*fcItem)
			f.queued[it.key]--
			it.status, it.reason = 503, "rejected-shutting-down"
			close(it.decided)
		}
		b.items.Init()
	}
}
