package poolsim

import (
	"container/heap"
	"fmt"
	"slices"
	"time"
)

// Class is a request's traffic class.
type Class uint8

// Traffic classes.
const (
	ClassInteractive Class = iota
	ClassBatch
	numClasses
)

// Classes lists every class, in order.
var Classes = [numClasses]Class{ClassInteractive, ClassBatch}

// String returns "interactive" or "batch".
func (c Class) String() string {
	switch c {
	case ClassInteractive:
		return "interactive"
	case ClassBatch:
		return "batch"
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ParseClass parses "interactive" or "batch".
func ParseClass(s string) (Class, error) {
	switch s {
	case "interactive":
		return ClassInteractive, nil
	case "batch":
		return ClassBatch, nil
	}
	return 0, fmt.Errorf("class %q: want interactive or batch", s)
}

// seqState is where a sequence is.
type seqState uint8

const (
	stateWaiting seqState = iota
	stateRunning
	stateDone
)

// Finish reasons, as vLLM's finished_reason label.
const (
	finishLength = "length"
	finishStop   = "stop"
	finishAbort  = "abort"
)

// seq is one request inside an engine. Its fields are guarded by the lock of
// the engine's pod.
type seq struct {
	id        uint64
	class     Class
	priority  int       // engine priority: lower runs first (PolicyPriority)
	arrival   time.Time // arrival at the engine
	prompt    int
	maxTokens int // tokens to generate (already drawn for OutputUniform)
	reason    string

	state       seqState
	computed    int // vLLM's num_computed_tokens
	output      int // tokens generated
	blocks      int // KV blocks held
	preemptions int
	heapIndex   int // in the priority queue; -1 elsewhere

	firstSched time.Time // first time scheduled (end of queueing)
	firstToken time.Time
	prevToken  time.Time // the token before lastToken
	lastToken  time.Time
	finished   time.Time

	stepTokens int  // tokens scheduled in the step in flight
	stepNew    bool // the step in flight starts its prefill

	// key is the text the prefix cache compares (its prompt's; "" when the
	// prompt is not text or the engine has no prefix cache).
	key    string
	looked bool // the prefix cache was asked since it was last added or preempted

	// eng is the engine it was last added to: a step in flight on another
	// (a replay's backlog resumes a parked sequence elsewhere) skips it.
	eng *engine

	req  *request // what the front knows; never nil
	sink *stream  // nil in replays
	// tokenTimes records every token's time when non-nil (replays).
	tokenTimes []time.Time
}

// numTokens is vLLM's num_tokens: prompt plus generated tokens; a
// sequence's step catches computed up with it.
func (s *seq) numTokens() int { return s.prompt + s.output }

// waitQueue is an engine's waiting queue.
type waitQueue interface {
	push(*seq)    // a new arrival
	prepend(*seq) // a preempted sequence
	peek() *seq
	pop() *seq
	remove(*seq) bool
	len() int
	each(func(*seq))
}

// fcfsQueue is a FIFO; prepend puts a sequence at its head.
type fcfsQueue struct{ q []*seq }

func (f *fcfsQueue) push(s *seq)    { f.q = append(f.q, s) }
func (f *fcfsQueue) prepend(s *seq) { f.q = slices.Insert(f.q, 0, s) }
func (f *fcfsQueue) peek() *seq     { return f.q[0] }
func (f *fcfsQueue) len() int       { return len(f.q) }
func (f *fcfsQueue) pop() *seq {
	s := f.q[0]
	f.q[0] = nil
	f.q = f.q[1:]
	return s
}
func (f *fcfsQueue) remove(s *seq) bool {
	i := slices.Index(f.q, s)
	if i < 0 {
		return false
	}
	f.q = slices.Delete(f.q, i, i+1)
	return true
}
func (f *fcfsQueue) each(fn func(*seq)) {
	for _, s := range f.q {
		fn(s)
	}
}

// prioQueue is a heap on (priority, arrival, id); prepend is a push, so a
// preempted sequence keeps its place by priority and arrival, as vLLM's
// PriorityRequestQueue.
type prioQueue struct{ h seqHeap }

func (p *prioQueue) push(s *seq)    { heap.Push(&p.h, s) }
func (p *prioQueue) prepend(s *seq) { heap.Push(&p.h, s) }
func (p *prioQueue) peek() *seq     { return p.h[0] }
func (p *prioQueue) pop() *seq      { return heap.Pop(&p.h).(*seq) }
func (p *prioQueue) len() int       { return len(p.h) }
func (p *prioQueue) remove(s *seq) bool {
	if s.heapIndex < 0 || s.heapIndex >= len(p.h) || p.h[s.heapIndex] != s {
		return false
	}
	heap.Remove(&p.h, s.heapIndex)
	return true
}
func (p *prioQueue) each(fn func(*seq)) {
	for _, s := range p.h {
		fn(s)
	}
}

type seqHeap []*seq

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return before(h[i], h[j]) }
func (h seqHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex, h[j].heapIndex = i, j
}
func (h *seqHeap) Push(x any) {
	s := x.(*seq)
	s.heapIndex = len(*h)
	*h = append(*h, s)
}
func (h *seqHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.heapIndex = -1
	*h = old[:len(old)-1]
	return s
}

// before orders sequences by (priority, arrival), ids breaking ties.
func before(a, b *seq) bool {
	if a.priority != b.priority {
		return a.priority < b.priority
	}
	if !a.arrival.Equal(b.arrival) {
		return a.arrival.Before(b.arrival)
	}
	return a.id < b.id
}

// step is one engine step: the sequences scheduled and what they cost.
type step struct {
	seqs          []*seq // scheduled (stepTokens > 0), in schedule order
	n             []int  // tokens of each of seqs
	tokens        int    // tokens scheduled
	prefillTokens int    // of which prompt (prefill or recompute) tokens
	newPrefills   int    // sequences whose prefill starts in this step
	preempted     int    // sequences preempted while scheduling
	duration      time.Duration
}

// engine is one pod's vLLM-V1-like scheduler and KV pool. It is not safe for
// concurrent use: its pod's lock guards it. It knows nothing of wall time:
// the caller passes the times.
type engine struct {
	cfg        EngineConfig
	numBlocks  int
	freeBlocks int
	waiting    waitQueue
	running    []*seq
	rnd        rng // step jitter

	// the prefix cache (prefix.go): entries oldest first, and the free
	// blocks they hold
	cache        []cacheEntry
	cachedBlocks int

	// counters for the metrics
	preemptions               uint64
	prefixQueries, prefixHits uint64
}

func newEngine(cfg EngineConfig, rnd rng) *engine {
	e := &engine{cfg: cfg, numBlocks: cfg.KVTokens / cfg.BlockSize, rnd: rnd}
	e.freeBlocks = e.numBlocks
	if cfg.Policy == PolicyPriority {
		e.waiting = &prioQueue{}
	} else {
		e.waiting = &fcfsQueue{}
	}
	return e
}

// hasWork reports whether a step would schedule anything.
func (e *engine) hasWork() bool { return len(e.running) > 0 || e.waiting.len() > 0 }

// add queues a new sequence.
func (e *engine) add(s *seq) {
	s.eng = e
	s.looked = false
	s.state = stateWaiting
	s.heapIndex = -1
	e.waiting.push(s)
}

// seatPreempt models vLLM PRs #45561/#54530 (EngineConfig.SeatPreempt):
// with every seat taken, a waiting head of strictly higher priority preempts
// the lowest-priority running sequence. It reports whether it did; a victim
// scheduled earlier in the step gives its tokens back to *budget.
func (e *engine) seatPreempt(budget *int) bool {
	if !e.cfg.SeatPreempt || e.cfg.Policy != PolicyPriority || len(e.running) == 0 {
		return false
	}
	v := e.victim()
	victim := e.running[v]
	if e.waiting.peek().priority >= victim.priority {
		return false
	}
	*budget += victim.stepTokens
	e.preempt(v)
	return true
}

// blocksFor is the number of KV blocks that hold n tokens.
func (e *engine) blocksFor(n int) int { return (n + e.cfg.BlockSize - 1) / e.cfg.BlockSize }

// allocate gives s the blocks for its computed tokens plus n, and reports
// whether there were enough.
func (e *engine) allocate(s *seq, n int) bool {
	need := e.blocksFor(s.computed+n) - s.blocks
	e.evictFor(need)
	if need > e.freeBlocks {
		return false
	}
	if need > 0 {
		e.freeBlocks -= need
		s.blocks += need
	}
	return true
}

func (e *engine) free(s *seq) {
	e.freeBlocks += s.blocks
	s.blocks = 0
}

// usage is the KV usage in [0,1].
func (e *engine) usage() float64 {
	if e.numBlocks == 0 {
		return 0
	}
	return float64(e.numBlocks-e.freeBlocks) / float64(e.numBlocks)
}

// want is the number of tokens s asks for in a step with budget left.
func (e *engine) want(s *seq, budget int) int {
	n := s.numTokens() - s.computed
	if t := e.cfg.LongPrefillThreshold; t > 0 && n > t {
		n = t
	}
	return min(n, budget)
}

// victim picks the running sequence to preempt: the last admitted (FCFS),
// or the max by (priority, arrival) (priority policy).
func (e *engine) victim() int {
	if e.cfg.Policy != PolicyPriority {
		return len(e.running) - 1
	}
	v := 0
	for i, s := range e.running[1:] {
		if before(e.running[v], s) {
			v = i + 1
		}
	}
	return v
}

// preempt frees the blocks of running[i], resets its computed tokens
// (unless EngineConfig.PreemptKeep) and puts it back at the head of the
// waiting queue.
func (e *engine) preempt(i int) *seq {
	s := e.running[i]
	e.running = slices.Delete(e.running, i, i+1)
	e.free(s)
	if !e.cfg.PreemptKeep {
		e.release(s)
		s.computed, s.looked = 0, false
	}
	s.preemptions++
	s.state = stateWaiting
	s.stepTokens, s.stepNew = 0, false
	e.preemptions++
	e.waiting.prepend(s)
	return s
}

// schedule plans one step, as vLLM V1's Scheduler.schedule: running
// sequences first, in order, preempting under KV pressure; then, only if
// nothing was preempted, waiting ones while seats, budget and blocks last.
// start is the step's start time (the first scheduling time of admitted
// sequences).
func (e *engine) schedule(start time.Time) step {
	var st step
	budget := e.cfg.MaxNumBatchedTokens
	for i := 0; i < len(e.running) && budget > 0; {
		s := e.running[i]
		n := e.want(s, budget)
		if n <= 0 {
			i++
			continue
		}
		scheduled := true
		for !e.allocate(s, n) {
			v := e.victim()
			victim := e.running[v]
			if victim.stepTokens > 0 { // scheduled earlier in this step: undo
				budget += victim.stepTokens
				i--
			}
			e.preempt(v)
			st.preempted++
			if victim == s {
				scheduled = false
				break
			}
		}
		if !scheduled {
			break
		}
		s.stepTokens = n
		s.stepNew = s.computed == 0
		budget -= n
		i++
	}
	if st.preempted == 0 {
		for e.waiting.len() > 0 && budget > 0 {
			if len(e.running) >= e.cfg.MaxNumSeqs {
				if !e.seatPreempt(&budget) {
					break
				}
				st.preempted++
				continue
			}
			s := e.waiting.peek()
			fresh := s.computed == 0
			e.lookup(s)
			n := s.numTokens() - s.computed
			if t := e.cfg.LongPrefillThreshold; t > 0 && n > t {
				n = t
			}
			if e.cfg.DisableChunkedPrefill && n > budget {
				break
			}
			n = min(n, budget)
			if !e.allocate(s, n) {
				break // head-of-line: the queue waits for its head
			}
			e.waiting.pop()
			s.state = stateRunning
			if s.firstSched.IsZero() {
				// A step catching up after lag may start before the arrival.
				s.firstSched = maxTime(start, s.arrival)
			}
			s.stepTokens = n
			s.stepNew = fresh
			e.running = append(e.running, s)
			budget -= n
		}
	}
	for _, s := range e.running {
		if s.stepTokens == 0 {
			continue
		}
		st.seqs = append(st.seqs, s)
		st.n = append(st.n, s.stepTokens)
		st.tokens += s.stepTokens
		if s.numTokens()-s.computed > 1 || s.output == 0 {
			st.prefillTokens += s.stepTokens
		}
		if s.stepNew {
			st.newPrefills++
		}
	}
	st.duration = e.stepTime(len(st.seqs), st.prefillTokens, st.newPrefills, st.tokens-st.prefillTokens)
	return st
}

// stepTime is the duration of a step with n sequences, p prompt tokens
// (uncached: a prefix-cache hit's tokens are never scheduled), k starting
// prefills and d decode tokens:
//
//	ITL0·(1 + (F−1)·(n−1)/(max_num_seqs−1)) + c_p·p + o_p·k + c_d·d
//
// spread by ±StepJitter. An empty step takes no time. With F = 1 and
// o_p = 0 it is BLIS's step model: β0 + β1·p + β2·d.
func (e *engine) stepTime(n, p, k, d int) time.Duration {
	if n == 0 {
		return 0
	}
	load := 1.0
	if e.cfg.StepModel == StepModelLinear {
		p0 := float64(e.cfg.ITL) + float64(e.cfg.PrefillPerToken)*float64(p) + float64(e.cfg.DecodePerToken)*float64(d)
		return time.Duration(e.jitter(p0))
	}
	if m := e.cfg.MaxNumSeqs; m > 1 {
		load += (e.cfg.LoadFactor - 1) * float64(n-1) / float64(m-1)
	}
	t := float64(e.cfg.ITL)*load + float64(e.cfg.PrefillPerToken)*float64(p) + float64(e.cfg.PrefillOverhead)*float64(k) +
		float64(e.cfg.DecodePerToken)*float64(d)
	return time.Duration(e.jitter(t))
}

// jitter spreads a step time t by ±StepJitter of itself.
func (e *engine) jitter(t float64) float64 {
	if j := e.cfg.StepJitter; j > 0 {
		t *= 1 + j*(2*e.rnd.float64()-1)
	}
	return t
}

// complete ends step st at end: scheduled tokens are computed; a sequence
// that caught up samples a token; one that reached its length finishes and
// frees its blocks. It calls emit for every sequence that got a token or
// finished, in schedule order, and returns the finished ones.
func (e *engine) complete(st step, end time.Time, emit func(s *seq)) {
	finished := false
	for _, s := range st.seqs {
		if s.eng != e {
			continue // parked and resumed on another engine since
		}
		if s.state != stateRunning || s.stepTokens == 0 {
			s.stepTokens, s.stepNew = 0, false
			continue // cancelled or preempted since
		}
		s.computed += s.stepTokens
		s.stepTokens, s.stepNew = 0, false
		if s.computed < s.numTokens() {
			continue // a prefill chunk: no token yet
		}
		s.output++
		if s.firstToken.IsZero() {
			s.firstToken = maxTime(end, s.arrival)
		}
		s.prevToken, s.lastToken = s.lastToken, end
		if s.tokenTimes != nil {
			s.tokenTimes = append(s.tokenTimes, end)
		}
		if s.output >= s.maxTokens {
			s.state = stateDone
			s.finished = end
			e.free(s)
			e.release(s)
			finished = true
		}
		emit(s)
	}
	if finished {
		e.running = slices.DeleteFunc(e.running, func(s *seq) bool { return s.state == stateDone })
	}
}

// detach takes s out of the waiting queue or the running list and frees
// its blocks (a waiting one may hold some a prefix-cache hit gave it); it
// reports whether s was in either.
func (e *engine) detach(s *seq) bool {
	switch s.state {
	case stateWaiting:
		if !e.waiting.remove(s) {
			return false
		}
	case stateRunning:
		i := slices.Index(e.running, s)
		if i < 0 {
			return false
		}
		e.running = slices.Delete(e.running, i, i+1)
	default:
		return false
	}
	e.free(s)
	return true
}

// cancel removes s wherever it is and frees its blocks (caching them,
// with a prefix cache); it reports whether s was still in the engine.
func (e *engine) cancel(s *seq) bool {
	if !e.detach(s) {
		return false
	}
	e.release(s)
	s.state = stateDone
	s.stepTokens = 0
	return true
}

// park takes s out of the engine keeping its computed tokens and output
// (a Backlog's costless eviction): it frees its blocks and leaves the
// running list or the waiting queue. It reports whether s was there.
func (e *engine) park(s *seq) bool {
	if !e.detach(s) {
		return false
	}
	s.state = stateWaiting
	s.stepTokens, s.stepNew = 0, false
	return true
}

// classCounts returns running and waiting sequences by class.
func (e *engine) classCounts() (running, waiting [numClasses]int) {
	for _, s := range e.running {
		running[s.class]++
	}
	e.waiting.each(func(s *seq) { waiting[s.class]++ })
	return running, waiting
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
