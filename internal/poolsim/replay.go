package poolsim

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Arrival is one request of a Replay.
type Arrival struct {
	// At is the arrival time, from the start of the replay.
	At time.Duration
	// Class is the request's class.
	Class Class
	// PromptTokens and MaxTokens are its sizes (MaxTokens tokens are
	// generated, whatever EngineConfig.OutputLength says).
	PromptTokens, MaxTokens int
	// Priority is the engine priority; nil means the class's default.
	Priority *int
}

// Trace is what happened to one request of a Replay; times are from the
// start of the replay.
type Trace struct {
	// Pod is the pod the front routed it to.
	Pod int
	// FirstScheduled is when the engine first scheduled it.
	FirstScheduled time.Duration
	// Tokens are the times of its tokens, in order.
	Tokens []time.Duration
	// Preemptions is how often it was preempted.
	Preemptions int
}

// TTFT is the first token's time minus arrival, or 0 without tokens.
func (t Trace) TTFT(a Arrival) time.Duration {
	if len(t.Tokens) == 0 {
		return 0
	}
	return t.Tokens[0] - a.At
}

// Replay runs the pool on a virtual clock: the arrivals (in any order) are
// routed as the front's passthrough mode routes (on the pods' live gauges)
// and every pod steps exactly as in real time, with no wall time involved.
// It returns one trace per arrival, in the order given. With a non-zero
// Config.Seed the result is a function of cfg and arrivals alone.
func Replay(cfg Config, arrivals []Arrival) ([]Trace, error) {
	traces, _, err := ReplayBacklog(cfg, arrivals, Backlog{})
	return traces, err
}

// Backlog is a closed-loop batch for ReplayBacklog: the batch an ideal
// dispatcher keeps in the pool, with no delay of its own. At every event
// of the replay (an arrival, a step's end) it holds Limit(now, others)
// batch requests in the pool (others: the arrivals in the pool then),
// adding new ones (or resuming parked ones) when there are fewer and
// parking the youngest of the most crowded pod when there are more. A parked
// request leaves its engine at once, keeps every token it had made and
// resumes later with no prefill to redo, on the pod the front routes it
// to: an eviction that costs nothing, which no real dispatcher has.
type Backlog struct {
	// Limit is the batch's size in the pool at a time since the start,
	// given the replay's arrivals in the pool then; nil: no backlog.
	Limit func(at time.Duration, others Others) int
	// PromptTokens and MaxTokens are every batch request's sizes.
	PromptTokens, MaxTokens int
	// Until is when the backlog stops adding and resuming requests; the
	// replay then runs until the pool is empty.
	Until time.Duration
	// Recompute makes a parked request lose its computed tokens, as an
	// aborted call's KV is lost without a prefix cache: it keeps its
	// output but prefills prompt and output again when it resumes (what
	// sluice's resume costs on this simulator).
	Recompute bool
	// ParkYoungest parks the youngest batch request whatever its pod, as a
	// dispatcher that cannot tell its calls' pods does (default: the
	// youngest of the most crowded pod).
	ParkYoungest bool
	// PodLimit, when set, replaces Limit with a dispatcher that places
	// the batch on the pods itself (pool-headroom's dispatch "pods"): it
	// reads every pod each ReadEvery (at the first event after), takes
	// PodLimit(at, pod, that pod's others) as the pod's limit and parks
	// the youngest requests of a pod over it. Between readings it places
	// a request (a parked one first, oldest first) on a pod only while
	// the pod is under its limit, no arrival waited there at the last
	// reading, and fewer than PendingPrefills were placed there since: a
	// parked request on the pod it left when that pod qualifies (its
	// tokens are there), any other on the qualifying pod with the most
	// room. A parked request placed on another pod than the one it left
	// prefills again (its KV stayed behind), whatever Recompute says.
	PodLimit func(at time.Duration, pod int, others Others) int
	// ReadEvery is the readings' period with PodLimit (0: every event).
	ReadEvery time.Duration
	// PendingPrefills bounds the placements on one pod between two
	// readings with PodLimit (0: 1).
	PendingPrefills int
	// Stay, with PodLimit, keeps a parked request for the pod it left:
	// it waits for room there instead of prefilling again elsewhere.
	Stay bool
	// PaceTokens, with PodLimit, paces the placements on each pod by the
	// prefill they bring (pool-headroom's pace_tokens): after a placement
	// of P uncached prompt tokens on a pod, the next placement there waits
	// P ÷ PaceTokens seconds. A request resuming on the pod it left brings
	// none (its tokens are cached there). 0: no pace in tokens.
	PaceTokens float64
	// PodPace, with PodLimit, when set, is the pace in tokens of a pod at
	// a time instead of PaceTokens (pool-headroom's burst_pace_tokens: a
	// slower pace while the pod's interactive traffic is in a burst); 0:
	// no pace then.
	PodPace func(at time.Duration, pod int) float64
}

// Others are the replay's arrivals in the pool at an event.
type Others struct {
	// Running and Waiting count them in the engines' running lists and
	// waiting queues.
	Running, Waiting int
	// Batch counts the backlog's requests in the pool.
	Batch int
}

// In is every arrival in the pool.
func (o Others) In() int { return o.Running + o.Waiting }

// BatchTrace is what happened to one request of a Backlog.
type BatchTrace struct {
	// Start is when it first entered the pool.
	Start time.Duration
	// Tokens are the times of its tokens, in order.
	Tokens []time.Duration
	// Parked is how often the backlog took it out of the pool.
	Parked int
	// Done reports whether it made all its tokens.
	Done bool
	// Pods are the pods it was placed on, in order (one per placement).
	Pods []int
	// Placed are the times of its placements (one per pod in Pods), Left
	// the times the backlog took it out of the pool (one per park): with
	// its last token when Done, they give the batch's occupancy of the
	// pool over time.
	Placed, Left []time.Duration
}

// ReplayBacklog is Replay with a closed-loop batch beside the arrivals
// (b.Limit nil: none). It returns the arrivals' traces in the order given
// and the batch's in the order its requests first entered the pool.
func ReplayBacklog(cfg Config, arrivals []Arrival, b Backlog) ([]Trace, []BatchTrace, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	cfg = p.cfg
	if b.Limit != nil && (b.PromptTokens < 1 || b.MaxTokens < 1 || b.PromptTokens+b.MaxTokens > cfg.Engine.MaxModelLen) {
		return nil, nil, fmt.Errorf("poolsim replay: backlog prompt %d + max tokens %d must be in [2, max-model-len %d]",
			b.PromptTokens, b.MaxTokens, cfg.Engine.MaxModelLen)
	}
	t0 := time.Unix(0, 0)
	order := make([]int, len(arrivals))
	seqs := make([]*seq, len(arrivals))
	pods := make([]int, len(arrivals))
	for i, a := range arrivals {
		order[i] = i
		if a.PromptTokens < 1 || a.MaxTokens < 1 || a.PromptTokens+a.MaxTokens > cfg.Engine.MaxModelLen {
			return nil, nil, fmt.Errorf("poolsim replay: arrival %d: prompt %d + max tokens %d must be in [2, max-model-len %d]",
				i, a.PromptTokens, a.MaxTokens, cfg.Engine.MaxModelLen)
		}
		if a.Class >= numClasses || a.At < 0 {
			return nil, nil, fmt.Errorf("poolsim replay: arrival %d: bad class %d or negative time %v", i, a.Class, a.At)
		}
	}
	slices.SortStableFunc(order, func(x, y int) int { return cmp.Compare(arrivals[x].At, arrivals[y].At) })

	type inFlight struct {
		st   step
		end  time.Time
		busy bool
	}
	steps := make([]inFlight, len(p.pods))
	next := 0
	now := t0
	route := func() int {
		f := p.front
		for j, d := range p.pods {
			// the gauges routing reads, without the per-class counts
			f.snaps[j] = snap{at: now, running: len(d.eng.running), waiting: d.eng.waiting.len(), kv: d.eng.usage()}
			f.sinceRead[j] = 0
		}
		return f.routeLocked(now)
	}
	newSeq := func(id uint64, class Class, prompt, maxTokens int, prio *int) *seq {
		req := &request{id: id, class: class, prompt: prompt, maxTokens: maxTokens,
			genTokens: maxTokens, arrival: now, enginePriority: cfg.Engine.InteractivePriority}
		if class == ClassBatch {
			req.enginePriority = cfg.Engine.BatchPriority
		}
		if prio != nil {
			req.enginePriority = *prio
		}
		return &seq{id: req.id, class: class, priority: req.enginePriority, arrival: now, prompt: prompt,
			maxTokens: maxTokens, heapIndex: -1, req: req, tokenTimes: make([]time.Time, 0, maxTokens)}
	}

	// The backlog: its requests in the pool (youngest last), parked ones
	// (oldest first) and every one's trace.
	type member struct {
		s      *seq
		pod    int
		trace  int
		parked int
	}
	var inPool, parked []*member
	var batch []BatchTrace
	var batchSeqs []*seq
	nextID := uint64(len(arrivals)) + 1
	isBacklog := func(s *seq) bool { return s.id > uint64(len(arrivals)) }
	others := func() Others {
		var o Others
		for _, d := range p.pods {
			for _, s := range d.eng.running {
				if !isBacklog(s) {
					o.Running++
				}
			}
			d.eng.waiting.each(func(s *seq) {
				if !isBacklog(s) {
					o.Waiting++
				}
			})
		}
		return o
	}
	// park takes inPool[k] out of its pod.
	park := func(k int) {
		m := inPool[k]
		inPool = slices.Delete(inPool, k, k+1)
		if p.pods[m.pod].eng.park(m.s) {
			if b.Recompute {
				m.s.computed = 0
			}
			if p.front.inflight[m.pod] > 0 {
				p.front.inflight[m.pod]--
			}
			m.parked++
			batch[m.trace].Left = append(batch[m.trace].Left, now.Sub(t0))
			parked = append(parked, m)
		}
	}
	// fresh returns a new backlog request, traced from at.
	fresh := func(at time.Duration) *member {
		s := newSeq(nextID, ClassBatch, b.PromptTokens, b.MaxTokens, nil)
		nextID++
		m := &member{s: s, trace: len(batch), pod: -1}
		batch = append(batch, BatchTrace{Start: at})
		batchSeqs = append(batchSeqs, s)
		return m
	}
	// The per-pod dispatcher's state (PodLimit): each pod's limit and
	// whether an arrival waited there at the last reading, and the
	// placements on it since.
	podWant := make([]int, len(p.pods))
	podBusy := make([]bool, len(p.pods))
	podPlaced := make([]int, len(p.pods))
	lastRead := time.Duration(-1)
	pending := max(b.PendingPrefills, 1)
	// podPaced is when each pod may take its next placement (PaceTokens)
	podPaced := make([]time.Duration, len(p.pods))
	podOthers := func(i int) Others {
		var o Others
		d := p.pods[i]
		for _, s := range d.eng.running {
			if !isBacklog(s) {
				o.Running++
			}
		}
		d.eng.waiting.each(func(s *seq) {
			if !isBacklog(s) {
				o.Waiting++
			}
		})
		for _, m := range inPool {
			if m.pod == i {
				o.Batch++
			}
		}
		return o
	}
	podBalance := func() {
		at := now.Sub(t0)
		if lastRead < 0 || at-lastRead >= b.ReadEvery {
			lastRead = at
			for i := range p.pods {
				o := podOthers(i)
				podWant[i], podBusy[i], podPlaced[i] = max(0, b.PodLimit(at, i, o)), o.Waiting > 0, 0
				for n := o.Batch; n > podWant[i]; n-- {
					k := len(inPool) - 1 // the pod's youngest
					for k >= 0 && inPool[k].pod != i {
						k--
					}
					park(k)
				}
			}
		}
		if at >= b.Until {
			return // nothing new, nothing resumed
		}
		count := make([]int, len(p.pods))
		for _, m := range inPool {
			count[m.pod]++
		}
		ok := func(i int) bool {
			return count[i] < podWant[i] && !podBusy[i] && podPlaced[i] < pending && at >= podPaced[i]
		}
		waitingFor := 0 // parked requests skipped: they wait for their pod (Stay)
		for {
			var m *member
			if b.Stay {
				for waitingFor < len(parked) && parked[waitingFor].pod >= 0 && !ok(parked[waitingFor].pod) {
					waitingFor++
				}
			}
			if waitingFor < len(parked) {
				m = parked[waitingFor]
			}
			pod := -1
			if m != nil && m.pod >= 0 && ok(m.pod) {
				pod = m.pod
			} else {
				for i := range p.pods {
					if ok(i) && (pod < 0 || podWant[i]-count[i] > podWant[pod]-count[pod]) {
						pod = i
					}
				}
			}
			if pod < 0 {
				return
			}
			uncached := b.PromptTokens
			if m != nil {
				parked = slices.Delete(parked, waitingFor, waitingFor+1)
				switch {
				case m.pod >= 0 && m.pod != pod:
					m.s.computed = 0 // its KV stayed on the pod it left
					uncached += len(m.s.tokenTimes)
				case m.pod == pod && !b.Recompute:
					uncached = 0
				}
			} else {
				m = fresh(at)
			}
			pace := b.PaceTokens
			if b.PodPace != nil {
				pace = b.PodPace(at, pod)
			}
			if pace > 0 {
				podPaced[pod] = at + time.Duration(float64(uncached)/pace*float64(time.Second))
			}
			m.pod = pod
			batch[m.trace].Pods = append(batch[m.trace].Pods, pod)
			batch[m.trace].Placed = append(batch[m.trace].Placed, at)
			p.pods[pod].eng.add(m.s)
			p.front.inflight[pod]++ // as routing counts it, so that arrivals' routing sees it
			inPool = append(inPool, m)
			count[pod]++
			podPlaced[pod]++
		}
	}
	poolBalance := func() {
		at := now.Sub(t0)
		o := others()
		o.Batch = len(inPool)
		want := b.Limit(at, o)
		if at >= b.Until {
			want = min(want, len(inPool)) // nothing new, nothing resumed
		}
		for len(inPool) > max(want, 0) {
			// the youngest on the most crowded pod (requests beyond its
			// seats), so the seat it frees is where a request waits
			crowd := func(i int) int {
				e := p.pods[i].eng
				return len(e.running) + e.waiting.len() - e.cfg.MaxNumSeqs
			}
			k := len(inPool) - 1
			for j := len(inPool) - 2; j >= 0 && !b.ParkYoungest; j-- {
				if crowd(inPool[j].pod) > crowd(inPool[k].pod) {
					k = j
				}
			}
			park(k)
		}
		for len(inPool) < want {
			var m *member
			if len(parked) > 0 {
				m, parked = parked[0], parked[1:]
			} else {
				m = fresh(at)
			}
			m.pod = route()
			batch[m.trace].Pods = append(batch[m.trace].Pods, m.pod)
			batch[m.trace].Placed = append(batch[m.trace].Placed, at)
			p.pods[m.pod].eng.add(m.s)
			inPool = append(inPool, m)
		}
	}
	balance := func() {
		switch {
		case b.PodLimit != nil:
			podBalance()
		case b.Limit != nil:
			poolBalance()
		default:
			return
		}
		for _, m := range parked {
			batch[m.trace].Parked = m.parked
		}
		for _, m := range inPool {
			batch[m.trace].Parked = m.parked
		}
	}
	startIdle := func() {
		for i, d := range p.pods {
			if !steps[i].busy && d.eng.hasWork() {
				st := d.eng.schedule(now)
				if len(st.seqs) == 0 {
					continue
				}
				steps[i] = inFlight{st: st, end: now.Add(st.duration), busy: true}
			}
		}
	}
	balance()
	startIdle()
	for {
		// The next event: the earliest step end (lowest pod first), or the
		// next arrival if it comes strictly before.
		podNext := -1
		for i := range steps {
			if steps[i].busy && (podNext < 0 || steps[i].end.Before(steps[podNext].end)) {
				podNext = i
			}
		}
		arrNext := time.Time{}
		if next < len(order) {
			// an arrival reaches its pod's queue after the pod's API
			// server's overhead (EngineConfig.RequestOverhead)
			arrNext = t0.Add(arrivals[order[next]].At + cfg.Engine.RequestOverhead)
		}
		switch {
		case podNext < 0 && next >= len(order):
			traces := make([]Trace, len(arrivals))
			for i, s := range seqs {
				tr := Trace{Pod: pods[i], FirstScheduled: s.firstSched.Sub(t0), Preemptions: s.preemptions}
				for _, t := range s.tokenTimes {
					tr.Tokens = append(tr.Tokens, t.Sub(t0))
				}
				traces[i] = tr
			}
			for i, s := range batchSeqs {
				for _, t := range s.tokenTimes {
					batch[i].Tokens = append(batch[i].Tokens, t.Sub(t0))
				}
				batch[i].Done = s.output >= s.maxTokens
			}
			return traces, batch, nil
		case podNext >= 0 && (next >= len(order) || !arrNext.Before(steps[podNext].end)):
			now = steps[podNext].end
			d := p.pods[podNext]
			for _, s := range d.finishStep(steps[podNext].st, now, 0, nil) {
				p.front.inflight[podNext]--
				if isBacklog(s) {
					inPool = slices.DeleteFunc(inPool, func(m *member) bool { return m.s == s })
				}
			}
			steps[podNext].busy = false
		default:
			now = arrNext
			i := order[next]
			next++
			a := arrivals[i]
			s := newSeq(uint64(i+1), a.Class, a.PromptTokens, a.MaxTokens, a.Priority)
			s.arrival, s.req.arrival = t0.Add(a.At), t0.Add(a.At)
			pods[i] = route()
			seqs[i] = s
			p.pods[pods[i]].eng.add(s)
		}
		balance()
		startIdle()
	}
}
