package poolsim

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// mixedLoad is a seeded mix of interactive and long batch requests, enough
// to fill the default pool's seats and KV: 16 seats of 512/1024 batch need
// twice a pod's 12,288 KV tokens, so preemptions happen. (With 512/256
// batch, 16 seats need exactly 12,288 tokens and nothing is preempted.)
func mixedLoad(n int) []Arrival {
	r := newRNG(42, 0)
	var out []Arrival
	at := time.Duration(0)
	for i := range n {
		a := Arrival{At: at, Class: ClassBatch, PromptTokens: 512, MaxTokens: 1024}
		if i%4 == 0 {
			a = Arrival{At: at, Class: ClassInteractive, PromptTokens: 128 + r.intn(256), MaxTokens: 32 + r.intn(64)}
		}
		out = append(out, a)
		at += time.Duration(r.intn(40)) * time.Millisecond
	}
	return out
}

func TestReplayDeterministic(t *testing.T) {
	cfg := Config{Seed: 7}
	cfg.Engine.StepJitter = 0.2
	load := mixedLoad(200)
	a, err := Replay(cfg, load)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Replay(cfg, load)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two replays with the same seed differ")
	}
	preempted, pods := 0, map[int]int{}
	for i, tr := range a {
		if len(tr.Tokens) != load[i].MaxTokens {
			t.Fatalf("request %d: %d tokens, want %d", i, len(tr.Tokens), load[i].MaxTokens)
		}
		for j := 1; j < len(tr.Tokens); j++ {
			if tr.Tokens[j] <= tr.Tokens[j-1] {
				t.Fatalf("request %d: token %d at %v, not after token %d at %v", i, j, tr.Tokens[j], j-1, tr.Tokens[j-1])
			}
		}
		if tr.TTFT(load[i]) <= 0 || tr.FirstScheduled < load[i].At {
			t.Fatalf("request %d: ttft %v, first scheduled %v before arrival %v", i, tr.TTFT(load[i]), tr.FirstScheduled, load[i].At)
		}
		preempted += tr.Preemptions
		pods[tr.Pod]++
	}
	if preempted == 0 {
		t.Fatal("the mixed load caused no preemption: the test does not exercise the KV path")
	}
	if len(pods) != 2 {
		t.Fatalf("requests went to pods %v, want both", pods)
	}
	cfg.Seed = 8
	c, err := Replay(cfg, load)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(a, c) {
		t.Fatal("replays with seeds 7 and 8 (and step jitter) are identical")
	}
}

// TestReplayIdleLatencies checks the model's idle figures against the
// design notes (section 5.4): a 256/64 interactive request's TTFT is
// ITL0 + 256·c_p + o_p = 32.8 ms, and a 512/256 batch request takes
// 45.6 ms to its first token plus 255 decode steps of 10 ms.
func TestReplayIdleLatencies(t *testing.T) {
	load := []Arrival{
		{At: 0, Class: ClassInteractive, PromptTokens: 256, MaxTokens: 64},
		{At: 10 * time.Second, Class: ClassBatch, PromptTokens: 512, MaxTokens: 256},
	}
	tr, err := Replay(Config{Seed: 1}, load)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tr[0].TTFT(load[0]), 32800*time.Microsecond; got != want {
		t.Fatalf("idle interactive TTFT %v, want %v", got, want)
	}
	if got, want := tr[0].Tokens[63]-load[0].At, 32800*time.Microsecond+63*10*time.Millisecond; got != want {
		t.Fatalf("idle interactive service %v, want %v", got, want)
	}
	if got, want := tr[1].Tokens[255]-load[1].At, 45600*time.Microsecond+255*10*time.Millisecond; got != want {
		t.Fatalf("idle batch service %v, want %v", got, want)
	}
}

func TestReplayRejectsBadArrivals(t *testing.T) {
	for _, a := range []Arrival{
		{PromptTokens: 0, MaxTokens: 1},
		{PromptTokens: 4000, MaxTokens: 200},
		{PromptTokens: 1, MaxTokens: 1, At: -1},
	} {
		if _, err := Replay(Config{Seed: 1}, []Arrival{a}); err == nil {
			t.Errorf("Replay accepted %+v", a)
		}
	}
}

// TestReplayBacklog: the closed-loop batch keeps its limit in the pool,
// parks the youngest when the limit falls and resumes them where they
// stopped when it rises.
func TestReplayBacklog(t *testing.T) {
	limit := func(at time.Duration, _ Others) int {
		if at >= 2*time.Second && at < 4*time.Second {
			return 1
		}
		return 4
	}
	b := Backlog{Limit: limit, PromptTokens: 64, MaxTokens: 100, Until: 6 * time.Second}
	_, batch, err := ReplayBacklog(Config{Seed: 3}, nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(batch) < 4 {
		t.Fatalf("%d batch requests, want at least the 4 of the start", len(batch))
	}
	parked, resumed := 0, 0
	for i, tr := range batch {
		if tr.Done && len(tr.Tokens) != b.MaxTokens {
			t.Fatalf("batch %d done with %d tokens, want %d", i, len(tr.Tokens), b.MaxTokens)
		}
		for j := 1; j < len(tr.Tokens); j++ {
			if tr.Tokens[j] <= tr.Tokens[j-1] {
				t.Fatalf("batch %d: token %d not after token %d", i, j, j-1)
			}
		}
		// in the 1-limit phase at most one request makes tokens
		if tr.Parked > 0 {
			parked++
			if tr.Done {
				resumed++
			}
		}
	}
	if parked != 3 || resumed == 0 {
		t.Fatalf("%d requests parked (want the 3 youngest when the limit fell to 1), %d of them resumed to the end (want some)", parked, resumed)
	}
	// In the 1-limit phase (after the park at its start), the spans over
	// which requests make tokens do not overlap: one request at a time.
	type span struct{ from, to time.Duration }
	var spans []span
	for _, tr := range batch {
		sp := span{-1, 0}
		for _, tok := range tr.Tokens {
			if tok > 2050*time.Millisecond && tok < 4*time.Second {
				if sp.from < 0 {
					sp.from = tok
				}
				sp.to = tok
			}
		}
		if sp.from >= 0 {
			spans = append(spans, sp)
		}
	}
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if a.from <= b.to && b.from <= a.to {
				t.Fatalf("two batch requests made tokens at once under a limit of 1: %v and %v", a, b)
			}
		}
	}
	again, batch2, err := ReplayBacklog(Config{Seed: 3}, nil, b)
	if err != nil || len(again) != 0 || !reflect.DeepEqual(batch, batch2) {
		t.Fatalf("two backlog replays differ (err %v)", err)
	}
}

// TestReplayBacklogPods: the per-pod dispatcher keeps each pod at its own
// limit (never over it after a reading), parks the youngest of the pod
// whose limit fell, resumes a parked request on the pod it left while that
// pod has room (even when another has more), places new requests on the
// pod with the most room, and places nothing on a pod where an arrival
// waited at the last reading.
func TestReplayBacklogPods(t *testing.T) {
	limits := func(at time.Duration) [2]int {
		switch {
		case at < 2*time.Second:
			return [2]int{2, 2}
		case at < 3*time.Second:
			return [2]int{2, 0}
		}
		return [2]int{6, 2}
	}
	var over []string
	lim := func(at time.Duration, pod int, o Others) int {
		if l := limits(at - 50*time.Millisecond)[pod]; o.Batch > l && at >= 50*time.Millisecond {
			over = append(over, fmt.Sprintf("pod %d held %d at %v, over its limit %d", pod, o.Batch, at, l))
		}
		return limits(at)[pod]
	}
	b := Backlog{PodLimit: lim, ReadEvery: 50 * time.Millisecond, PendingPrefills: 8, PromptTokens: 64, MaxTokens: 300, Until: 5 * time.Second}
	_, batch, err := ReplayBacklog(Config{Seed: 3}, nil, b)
	if err != nil {
		t.Fatal(err)
	}
	if len(over) > 0 {
		t.Fatalf("placed over a pod's limit: %v", over)
	}
	parked := 0
	for i, tr := range batch {
		if tr.Parked == 0 {
			continue
		}
		parked++
		if len(tr.Pods) < 2 || tr.Pods[0] != 1 || tr.Pods[1] != 1 {
			t.Errorf("batch %d parked from pod 1 was placed on %v, want back on pod 1", i, tr.Pods)
		}
	}
	if parked != 2 {
		t.Errorf("%d requests parked, want pod 1's 2 when its limit fell to 0", parked)
	}
	// after 3 s the new requests go to pod 0, which has the most room
	newOn := [2]int{}
	for _, tr := range batch {
		if tr.Start >= 3*time.Second && tr.Start < 3100*time.Millisecond {
			newOn[tr.Pods[0]]++
		}
	}
	if newOn[0] != 4 || newOn[1] != 0 {
		t.Errorf("new requests placed at 3 s: %v per pod, want the 4 of pod 0's new room there", newOn)
	}

	// an arrival waiting on a pod at a reading: nothing placed there
	arrivals := []Arrival{}
	for i := range 40 { // more than a pod's 16 seats, at once: some wait
		arrivals = append(arrivals, Arrival{At: time.Second + time.Duration(i)*time.Microsecond, PromptTokens: 64, MaxTokens: 200})
	}
	type read struct {
		at      time.Duration
		waiting bool
	}
	reads := [2][]read{}
	lim2 := func(at time.Duration, pod int, o Others) int {
		reads[pod] = append(reads[pod], read{at, o.Waiting > 0})
		return 16
	}
	b2 := Backlog{PodLimit: lim2, ReadEvery: 50 * time.Millisecond, PendingPrefills: 16, PromptTokens: 64, MaxTokens: 50, Until: 4 * time.Second}
	traces, batch2, err := ReplayBacklog(Config{Seed: 3}, arrivals, b2)
	if err != nil || len(traces) != len(arrivals) {
		t.Fatal(err)
	}
	waitedReads := 0
	for pod := range reads {
		for _, r := range reads[pod] {
			if r.waiting {
				waitedReads++
			}
		}
	}
	if waitedReads == 0 {
		t.Fatal("no reading saw an arrival waiting: the case tests nothing")
	}
	for i, tr := range batch2 {
		pod := tr.Pods[0]
		var last read
		for _, r := range reads[pod] {
			if r.at <= tr.Start {
				last = r
			}
		}
		if last.waiting {
			t.Errorf("batch %d placed on pod %d at %v, after a reading at %v that saw an arrival waiting there", i, pod, tr.Start, last.at)
		}
	}
}
