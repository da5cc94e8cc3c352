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
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	cfg = p.cfg
	t0 := time.Unix(0, 0)
	order := make([]int, len(arrivals))
	seqs := make([]*seq, len(arrivals))
	pods := make([]int, len(arrivals))
	for i, a := range arrivals {
		order[i] = i
		if a.PromptTokens < 1 || a.MaxTokens < 1 || a.PromptTokens+a.MaxTokens > cfg.Engine.MaxModelLen {
			return nil, fmt.Errorf("poolsim replay: arrival %d: prompt %d + max tokens %d must be in [2, max-model-len %d]",
				i, a.PromptTokens, a.MaxTokens, cfg.Engine.MaxModelLen)
		}
		if a.Class >= numClasses || a.At < 0 {
			return nil, fmt.Errorf("poolsim replay: arrival %d: bad class %d or negative time %v", i, a.Class, a.At)
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
			arrNext = t0.Add(arrivals[order[next]].At)
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
			return traces, nil
		case podNext >= 0 && (next >= len(order) || !arrNext.Before(steps[podNext].end)):
			now = steps[podNext].end
			d := p.pods[podNext]
			for range d.finishStep(steps[podNext].st, now, 0, nil) {
				p.front.inflight[podNext]--
			}
			steps[podNext].busy = false
		default:
			now = arrNext
			i := order[next]
			next++
			a := arrivals[i]
			req := &request{id: uint64(i + 1), class: a.Class, prompt: a.PromptTokens, maxTokens: a.MaxTokens,
				genTokens: a.MaxTokens, arrival: now, enginePriority: cfg.Engine.InteractivePriority}
			if a.Class == ClassBatch {
				req.enginePriority = cfg.Engine.BatchPriority
			}
			if a.Priority != nil {
				req.enginePriority = *a.Priority
			}
			s := &seq{id: req.id, class: a.Class, priority: req.enginePriority, arrival: now, prompt: a.PromptTokens,
				maxTokens: a.MaxTokens, heapIndex: -1, req: req, tokenTimes: []time.Time{}}
			f := p.front
			for j, d := range p.pods {
				g := d.gaugesLocked()
				f.snaps[j] = snap{at: now, running: g.Running, waiting: g.Waiting, kv: g.KVUsage}
				f.sinceRead[j] = 0
			}
			pods[i] = f.routeLocked(now)
			seqs[i] = s
			p.pods[pods[i]].eng.add(s)
		}
		startIdle()
	}
}
