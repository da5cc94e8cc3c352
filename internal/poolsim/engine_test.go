package poolsim

import (
	"testing"
	"time"
)

// testEngine returns an engine with the default config changed by edit.
func testEngine(edit func(*EngineConfig)) *engine {
	var c Config
	c.SetDefaults()
	if edit != nil {
		edit(&c.Engine)
	}
	return newEngine(c.Engine, newRNG(1, 0))
}

var t0 = time.Unix(1000, 0)

func mkSeq(id uint64, prompt, maxTokens, priority int, at time.Duration) *seq {
	return &seq{id: id, prompt: prompt, maxTokens: maxTokens, priority: priority, arrival: t0.Add(at),
		heapIndex: -1, req: &request{id: id}}
}

// run completes one step of e at now and returns it.
func runStep(e *engine, now time.Time) step {
	st := e.schedule(now)
	e.complete(st, now.Add(st.duration), func(*seq) {})
	return st
}

func scheduled(st step) map[uint64]int {
	m := map[uint64]int{}
	for i, s := range st.seqs {
		m[s.id] = st.n[i]
	}
	return m
}

func ids(ss []*seq) []uint64 {
	out := make([]uint64, len(ss))
	for i, s := range ss {
		out[i] = s.id
	}
	return out
}

func waitingIDs(e *engine) []uint64 {
	var out []uint64
	for e.waiting.len() > 0 {
		out = append(out, e.waiting.pop().id)
	}
	return out
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestScheduleTokenBudget(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*EngineConfig)
		prompts []int
		// want is the tokens each sequence (id = index+1) gets in steps 1
		// and 2; absent means not scheduled.
		want [2]map[uint64]int
	}{
		{
			name:    "a prompt larger than the budget is chunked over two steps",
			prompts: []int{3000},
			want:    [2]map[uint64]int{{1: 2048}, {1: 952}},
		},
		{
			name:    "the second prompt gets what the first leaves, then the first decodes",
			prompts: []int{1500, 1000},
			want:    [2]map[uint64]int{{1: 1500, 2: 548}, {1: 1, 2: 452}},
		},
		{
			name:    "long_prefill_token_threshold caps each request's chunk",
			edit:    func(c *EngineConfig) { c.LongPrefillThreshold = 512 },
			prompts: []int{1500, 1000},
			want:    [2]map[uint64]int{{1: 512, 2: 512}, {1: 512, 2: 488}},
		},
		{
			name:    "without chunked prefill a prompt that does not fit waits",
			edit:    func(c *EngineConfig) { c.DisableChunkedPrefill = true; c.MaxModelLen = 2048 },
			prompts: []int{1500, 1000},
			want:    [2]map[uint64]int{{1: 1500}, {1: 1, 2: 1000}},
		},
		{
			name:    "seats: max_num_seqs bounds the running set",
			edit:    func(c *EngineConfig) { c.MaxNumSeqs = 2 },
			prompts: []int{10, 10, 10},
			want:    [2]map[uint64]int{{1: 10, 2: 10}, {1: 1, 2: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := testEngine(tc.edit)
			for i, p := range tc.prompts {
				e.add(mkSeq(uint64(i+1), p, 100, 0, time.Duration(i)))
			}
			now := t0
			for stepN, want := range tc.want {
				st := runStep(e, now)
				now = now.Add(st.duration)
				got := scheduled(st)
				if len(got) != len(want) {
					t.Fatalf("step %d: scheduled %v, want %v", stepN+1, got, want)
				}
				for id, n := range want {
					if got[id] != n {
						t.Fatalf("step %d: scheduled %v, want %v", stepN+1, got, want)
					}
				}
			}
		})
	}
}

func TestChunkedPrefillFirstToken(t *testing.T) {
	e := testEngine(nil)
	s := mkSeq(1, 3000, 2, 0, 0)
	e.add(s)
	st := runStep(e, t0)
	if s.output != 0 || s.computed != 2048 || !s.firstToken.IsZero() {
		t.Fatalf("after a partial chunk: output %d computed %d first token %v, want 0, 2048, none", s.output, s.computed, s.firstToken)
	}
	if st.prefillTokens != 2048 || st.newPrefills != 1 {
		t.Fatalf("step 1: prefill tokens %d new prefills %d, want 2048 and 1", st.prefillTokens, st.newPrefills)
	}
	st2 := runStep(e, t0.Add(st.duration))
	if s.output != 1 || s.firstToken != t0.Add(st.duration+st2.duration) {
		t.Fatalf("after the last chunk: output %d first token %v, want 1 at the end of step 2", s.output, s.firstToken)
	}
	if st2.newPrefills != 0 {
		t.Fatalf("step 2 counted %d new prefills, want 0 (the prefill started in step 1)", st2.newPrefills)
	}
	runStep(e, t0.Add(time.Second))
	if s.state != stateDone || e.freeBlocks != e.numBlocks || len(e.running) != 0 {
		t.Fatalf("finished sequence: state %d, free blocks %d of %d, running %d", s.state, e.freeBlocks, e.numBlocks, len(e.running))
	}
}

func TestHeadOfLineBlocking(t *testing.T) {
	// 10 blocks of 16 tokens. The first request holds 7; the head of the
	// queue needs 5 and waits, and so does a 1-block request behind it.
	e := testEngine(func(c *EngineConfig) { c.KVTokens = 160; c.MaxModelLen = 160 })
	e.add(mkSeq(1, 100, 50, 0, 0))
	runStep(e, t0)
	e.add(mkSeq(2, 80, 10, 0, 1))
	e.add(mkSeq(3, 10, 10, 0, 2))
	st := runStep(e, t0.Add(time.Second))
	if got := scheduled(st); len(got) != 1 || got[1] != 1 {
		t.Fatalf("scheduled %v, want only the decode of 1 (2 cannot get its blocks, 3 waits behind it)", got)
	}
	if w := waitingIDs(e); !equalIDs(w, []uint64{2, 3}) {
		t.Fatalf("waiting %v, want [2 3]", w)
	}
}

func TestPreemption(t *testing.T) {
	tests := []struct {
		name      string
		policy    string
		prompts   [2]int
		prios     [2]int
		stagger   bool // the second arrives after the first step
		steps     int  // steps before the one checked
		victimOut int  // tokens the victim had generated
		wantRun   []uint64
		wantWait  []uint64
		wantStep  map[uint64]int
	}{
		{
			// 4 blocks: both take 2; in step 3 the first needs a third block
			// and FCFS preempts the last admitted.
			name: "fcfs preempts the last admitted", policy: PolicyFCFS,
			prompts: [2]int{31, 31}, prios: [2]int{0, 0}, steps: 2, victimOut: 2,
			wantRun: []uint64{1}, wantWait: []uint64{2}, wantStep: map[uint64]int{1: 1},
		},
		{
			// The priority queue admits 2 first; 2 needs a block and the
			// victim is 1, the lowest priority, not the last admitted.
			name: "priority preempts the lowest priority, not the last admitted", policy: PolicyPriority,
			prompts: [2]int{31, 31}, prios: [2]int{10, 0}, steps: 2, victimOut: 2,
			wantRun: []uint64{2}, wantWait: []uint64{1}, wantStep: map[uint64]int{2: 1},
		},
		{
			// 1 (priority 10) runs first and needs a block: it is its own
			// victim, so it is not scheduled and the running pass ends.
			name: "priority: the request being scheduled can be its own victim", policy: PolicyPriority,
			prompts: [2]int{31, 31}, prios: [2]int{10, 0}, stagger: true, steps: 2, victimOut: 2,
			wantRun: []uint64{2}, wantWait: []uint64{1}, wantStep: map[uint64]int{},
		},
		{
			// 1 (priority 10) was already scheduled in this step when 2
			// needs a block: 1's tokens are given back.
			name: "priority undoes a victim scheduled earlier in the step", policy: PolicyPriority,
			prompts: [2]int{17, 31}, prios: [2]int{10, 0}, stagger: true, steps: 3, victimOut: 3,
			wantRun: []uint64{2}, wantWait: []uint64{1}, wantStep: map[uint64]int{2: 1},
		},
		{
			name: "priority, equal priorities: the later arrival is the victim", policy: PolicyPriority,
			prompts: [2]int{31, 31}, prios: [2]int{5, 5}, steps: 2, victimOut: 2,
			wantRun: []uint64{1}, wantWait: []uint64{2}, wantStep: map[uint64]int{1: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := testEngine(func(c *EngineConfig) { c.KVTokens = 64; c.MaxModelLen = 64; c.Policy = tc.policy })
			e.add(mkSeq(1, tc.prompts[0], 20, tc.prios[0], 0))
			second := mkSeq(2, tc.prompts[1], 20, tc.prios[1], 1)
			if !tc.stagger {
				e.add(second)
			}
			now := t0
			for i := range tc.steps {
				st := runStep(e, now)
				now = now.Add(st.duration)
				if i == 0 && tc.stagger {
					second.arrival = now
					e.add(second)
				}
			}
			if len(e.running) != 2 || e.preemptions != 0 {
				t.Fatalf("setup: %d running, %d preemptions; want 2 and 0", len(e.running), e.preemptions)
			}
			st := e.schedule(now)
			if st.preempted != 1 || e.preemptions != 1 {
				t.Fatalf("preempted %d (total %d), want 1", st.preempted, e.preemptions)
			}
			if got := ids(e.running); !equalIDs(got, tc.wantRun) {
				t.Fatalf("running %v, want %v", got, tc.wantRun)
			}
			got := scheduled(st)
			if len(got) != len(tc.wantStep) {
				t.Fatalf("scheduled %v, want %v", got, tc.wantStep)
			}
			for id, n := range tc.wantStep {
				if got[id] != n {
					t.Fatalf("scheduled %v, want %v", got, tc.wantStep)
				}
			}
			if st.tokens != len(tc.wantStep) {
				t.Fatalf("step tokens %d, want %d (a preempted victim's tokens are given back)", st.tokens, len(tc.wantStep))
			}
			victim := e.waiting.peek()
			if victim.computed != 0 || victim.blocks != 0 || victim.preemptions != 1 || victim.output != tc.victimOut {
				t.Fatalf("victim: computed %d blocks %d preemptions %d output %d; want 0, 0, 1 and its %d tokens kept",
					victim.computed, victim.blocks, victim.preemptions, victim.output, tc.victimOut)
			}
			used := 0
			for _, s := range e.running {
				used += s.blocks
			}
			if used+e.freeBlocks != e.numBlocks {
				t.Fatalf("blocks: %d used + %d free != %d", used, e.freeBlocks, e.numBlocks)
			}
			if w := waitingIDs(e); !equalIDs(w, tc.wantWait) {
				t.Fatalf("waiting %v, want %v", w, tc.wantWait)
			}
		})
	}
}

func TestPreemptedRecomputesAndResumes(t *testing.T) {
	e := testEngine(func(c *EngineConfig) { c.KVTokens = 64; c.MaxModelLen = 64 })
	a, b := mkSeq(1, 31, 3, 0, 0), mkSeq(2, 31, 20, 0, 1)
	e.add(a)
	e.add(b)
	now := t0
	for range 3 {
		st := runStep(e, now)
		now = now.Add(st.duration)
	}
	// Step 3 preempted b (no admission in that step); a finished in it.
	if b.preemptions != 1 || a.state != stateDone {
		t.Fatalf("b preemptions %d, a state %d; want 1 and done", b.preemptions, a.state)
	}
	st := runStep(e, now)
	if got := scheduled(st); got[2] != 33 {
		t.Fatalf("resume: scheduled %v, want b to recompute prompt + 2 output tokens (33)", got)
	}
	if b.output != 3 {
		t.Fatalf("b output %d after its recompute, want 3 (the recompute samples a token)", b.output)
	}
}

func TestPriorityQueueOrder(t *testing.T) {
	e := testEngine(func(c *EngineConfig) { c.Policy = PolicyPriority; c.MaxNumSeqs = 1 })
	e.add(mkSeq(1, 10, 5, 10, 0))
	e.add(mkSeq(2, 10, 5, 10, 1))
	e.add(mkSeq(3, 10, 5, 0, 2))
	e.add(mkSeq(4, 10, 5, 0, 3))
	if w := waitingIDs(e); !equalIDs(w, []uint64{3, 4, 1, 2}) {
		t.Fatalf("priority queue order %v, want [3 4 1 2]", w)
	}
}

func TestStepTime(t *testing.T) {
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	tests := []struct {
		name    string
		edit    func(*EngineConfig)
		n, p, k int
		d       int // decode tokens
		want    time.Duration
	}{
		{"empty step", nil, 0, 0, 0, 0, 0},
		{"one decode", nil, 1, 0, 0, 1, ms(10)},
		{"full batch of decodes: ITL0·F", nil, 16, 0, 0, 16, ms(20)},
		{"half the seats", nil, 8, 0, 0, 8, ms(10 * (1 + 7.0/15))},
		{"idle 256-token prefill: ITL0 + 256·c_p + o_p", nil, 1, 256, 1, 0, ms(10 + 12.8 + 10)},
		{"a full budget of prefill beside 15 decodes", nil, 16, 2033, 1, 15, ms(20 + 2033*0.05 + 10)},
		{"max_num_seqs 1: no load factor", func(c *EngineConfig) { c.MaxNumSeqs = 1 }, 1, 0, 0, 1, ms(10)},
		{"inference-sim's 8B profile", func(c *EngineConfig) {
			c.ITL, c.LoadFactor, c.PrefillPerToken, c.PrefillOverhead = ms(12), 2, 250*time.Microsecond, ms(30)
		}, 16, 256, 1, 0, ms(24 + 64 + 30)},
		{"BLIS's form: β0 + β1·uncached prefill + β2·decode", func(c *EngineConfig) {
			c.StepModel, c.MaxNumSeqs, c.ITL, c.PrefillPerToken, c.DecodePerToken =
				StepModelLinear, 1024, 5753*time.Microsecond, 17250*time.Nanosecond, 6*time.Microsecond
		}, 601, 2048, 4, 600, ms(5.753 + 2048*0.01725 + 600*0.006)},
		{"decode cost in the load form", func(c *EngineConfig) { c.DecodePerToken = time.Millisecond }, 16, 0, 0, 16, ms(20 + 16)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := testEngine(tc.edit)
			got := e.stepTime(tc.n, tc.p, tc.k, tc.d)
			if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
				t.Fatalf("stepTime(%d, %d, %d, %d) = %v, want %v", tc.n, tc.p, tc.k, tc.d, got, tc.want)
			}
		})
	}
	// Jitter stays within ±StepJitter.
	e := testEngine(func(c *EngineConfig) { c.StepJitter = 0.2 })
	lo, hi := time.Hour, time.Duration(0)
	for range 1000 {
		d := e.stepTime(1, 0, 0, 1)
		lo, hi = min(lo, d), max(hi, d)
	}
	if lo < ms(8) || hi > ms(12) || hi-lo < ms(3) {
		t.Fatalf("jittered step times in [%v, %v], want a spread within [8ms, 12ms]", lo, hi)
	}
}

func TestCancel(t *testing.T) {
	e := testEngine(nil)
	a, b := mkSeq(1, 100, 10, 0, 0), mkSeq(2, 100, 10, 0, 1)
	e.add(a)
	st := e.schedule(t0)
	e.add(b)
	if !e.cancel(a) || !e.cancel(b) {
		t.Fatal("cancel of a running and a waiting sequence failed")
	}
	if e.cancel(a) {
		t.Fatal("a second cancel succeeded")
	}
	e.complete(st, t0.Add(st.duration), func(s *seq) { t.Fatalf("a cancelled sequence got token %d", s.output) })
	if e.freeBlocks != e.numBlocks || e.hasWork() {
		t.Fatalf("after cancels: %d of %d blocks free, work %v", e.freeBlocks, e.numBlocks, e.hasWork())
	}
}

func TestSeatPreempt(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := testEngine(func(c *EngineConfig) { c.Policy = PolicyPriority; c.MaxNumSeqs = 1; c.SeatPreempt = on })
		batch, inter := mkSeq(1, 100, 50, 10, 0), mkSeq(2, 100, 5, 0, 1)
		e.add(batch)
		now := t0.Add(runStep(e, t0).duration)
		e.add(inter)
		st := e.schedule(now)
		got := scheduled(st)
		if !on {
			if got[1] != 1 || len(got) != 1 || st.preempted != 0 {
				t.Fatalf("without seat preemption: scheduled %v, preempted %d; want the batch decode only", got, st.preempted)
			}
			continue
		}
		if got[2] != 100 || len(got) != 1 || st.preempted != 1 || batch.preemptions != 1 || batch.blocks != 0 {
			t.Fatalf("with seat preemption: scheduled %v, preempted %d, batch preemptions %d blocks %d; want the interactive prefill in the batch's seat",
				got, st.preempted, batch.preemptions, batch.blocks)
		}
		if st.tokens != 100 {
			t.Fatalf("step tokens %d, want 100 (the victim's decode given back)", st.tokens)
		}
		// An equal priority does not preempt.
		e2 := testEngine(func(c *EngineConfig) { c.Policy = PolicyPriority; c.MaxNumSeqs = 1; c.SeatPreempt = true })
		e2.add(mkSeq(1, 100, 50, 5, 0))
		now = t0.Add(runStep(e2, t0).duration)
		e2.add(mkSeq(2, 100, 5, 5, 1))
		if st := e2.schedule(now); st.preempted != 0 {
			t.Fatal("an equal-priority request preempted a running one")
		}
	}
}

func TestPreemptKeepResumesWithoutRecompute(t *testing.T) {
	e := testEngine(func(c *EngineConfig) { c.KVTokens = 64; c.MaxModelLen = 64; c.PreemptKeep = true })
	a, b := mkSeq(1, 31, 3, 0, 0), mkSeq(2, 31, 20, 0, 1)
	e.add(a)
	e.add(b)
	now := t0
	for range 3 {
		st := runStep(e, now)
		now = now.Add(st.duration)
	}
	// As in TestPreemptedRecomputesAndResumes, step 3 preempted b; here it
	// keeps what it had computed.
	if b.preemptions != 1 || a.state != stateDone {
		t.Fatalf("b preemptions %d, a state %d; want 1 and done", b.preemptions, a.state)
	}
	if b.computed == 0 {
		t.Fatal("b lost its computed tokens on preemption")
	}
	st := runStep(e, now)
	if got := scheduled(st); got[2] != 1 || st.prefillTokens != 0 || st.newPrefills != 0 {
		t.Fatalf("resume: scheduled %v, prefill tokens %d, new prefills %d; want b to decode one token with no prefill", got, st.prefillTokens, st.newPrefills)
	}
}
