package headroom_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/headroom"
)

// podsGate is a gate with dispatch "pods" on p, its clock held.
func podsGate(t *testing.T, p *pods, extra string) (*headroom.Gate, *time.Time) {
	t.Helper()
	g := mustBuild(t, p.params(`,"dispatch":"pods","reserve":2,"hold":"-1ns"`+extra), 64)
	clock := time.Now()
	g.SetClock(func() time.Time { return clock })
	return g, &clock
}

// admitOn admits req and returns the pod it was placed on ("" when it was
// not admitted) and the decision.
func admitOn(t *testing.T, g *headroom.Gate, req *wire.Request) (string, gate.Decision) {
	t.Helper()
	d, err := g.Admit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if d.Verdict != gate.Admit {
		return "", d
	}
	if d.Pod == "" || req.Label(headroom.PodLabel) != d.Pod {
		t.Fatalf("admitted without a pod, or the label %q is not the pod %q", req.Label(headroom.PodLabel), d.Pod)
	}
	return d.Pod, d
}

func base(p *pods, i int) string { return p.srv[i].URL }

// podLimits is each pod's limit of g's last reading, by pod URL (nil:
// g reports no pods), as the pipeline's evictor reads them.
func podLimits(g *headroom.Gate) map[string]int {
	rs := g.PodReadings()
	if rs == nil {
		return nil
	}
	out := map[string]int{}
	for _, r := range rs {
		out[r.Pod] = r.Limit
	}
	return out
}

// Every rule applies per pod: each pod's limit is its seats less its own
// reserve and its other traffic; a request goes to the pod with the most
// room, at most pending_prefills per pod between two readings of it.
func TestPodsPlacement(t *testing.T) {
	p := newPods(t, 2)
	g, _ := podsGate(t, p, "")
	ctx := context.Background()
	if pod, d := admitOn(t, g, &wire.Request{}); pod != "" || d.Verdict != gate.Wait {
		t.Fatalf("before the first reading: placed on %q (%+v), want a wait", pod, d)
	}
	p.set(0, 10, 0) // 10 others on pod 0: 16-2-10 = 4 left; pod 1: 14
	b, err := g.Budget(ctx)
	if err != nil || b != 18.0/64 {
		t.Fatalf("budget %v, %v; want 18/64 (%+v)", b, err, g.Last())
	}
	if lim := podLimits(g); lim[base(p, 0)] != 4 || lim[base(p, 1)] != 14 || len(lim) != 2 {
		t.Fatalf("PodLimits = %v, want 4 and 14", lim)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != base(p, 1) {
		t.Errorf("first placement on %q, want pod 1 (most room)", pod)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != base(p, 0) {
		t.Errorf("second placement on %q, want pod 0 (pod 1 has one not read yet)", pod)
	}
	pod, d := admitOn(t, g, &wire.Request{})
	if pod != "" || d.Verdict != gate.Wait || !strings.Contains(d.Reason, "2 with a placement not read yet") {
		t.Errorf("third placement on %q (%+v), want a wait naming the pending placements", pod, d)
	}
	// the next reading shows them running: the pods take one more each
	p.set(0, 11, 0)
	p.set(1, 1, 0)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if r := g.Last(); len(r.Pods) != 2 || r.Pods[0].Own != 1 || r.Pods[0].Others != 10 || r.Pods[1].Others != 0 || r.Own != 2 || r.Others != 10 {
		t.Errorf("reading %+v, want pod 0 own 1 others 10, pod 1 own 1 others 0", r)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != base(p, 1) {
		t.Errorf("placement after the reading on %q, want pod 1", pod)
	}
}

// A pod where a request waits (interactive traffic queued behind the
// batch) takes no batch; a request taken back goes back to the pod it ran
// on, and waits for it (deferred) while that pod does not qualify: moved,
// it would prefill its prompt and tokens again (the replay measured that
// cost: docs/gates.md, per-pod dispatch).
func TestPodsWaitingAndAffinity(t *testing.T) {
	p := newPods(t, 2)
	g, clock := podsGate(t, p, `,"pending_prefills":4`)
	ctx := context.Background()
	p.set(1, 0, 1)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != base(p, 0) {
		t.Errorf("placed on %q with a request waiting on pod 1, want pod 0", pod)
	}
	// the request just placed waits at pod 0 for its next step: the
	// gauge counts it, but it is the gate's own, not an interactive
	// request queued behind the batch
	p.set(0, 1, 1)
	*clock = clock.Add(time.Second)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if got := g.Last().Pods[0].Queued; got != 0 {
		t.Errorf("pod 0 queued %d with only the gate's own placement waiting, want 0", got)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != base(p, 0) {
		t.Errorf("placed on %q with only the gate's own placement waiting on pod 0, want pod 0", pod)
	}
	// that one and another request wait at pod 0
	p.set(0, 1, 2)
	*clock = clock.Add(time.Second)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	pod, d := admitOn(t, g, &wire.Request{})
	if pod != "" || d.Verdict != gate.Wait || !strings.Contains(d.Reason, "2 with requests waiting") {
		t.Errorf("placed on %q (%+v) with requests waiting on both pods, want a wait saying so", pod, d)
	}
	// pod 1 has more room, but the request's tokens are on pod 0
	p.set(0, 3, 0)
	p.set(1, 0, 0)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	resumed := &wire.Request{}
	resumed.SetLabel(headroom.PodLabel, base(p, 0))
	if pod, _ := admitOn(t, g, resumed); pod != base(p, 0) {
		t.Errorf("a request taken back from pod 0 placed on %q, want pod 0", pod)
	}
	// pod 0 full of other traffic: the request waits for it rather than
	// prefill again on pod 1, and pod 0 keeps its next place for it
	p.set(0, 16, 0)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	again := &wire.Request{ID: "again"}
	again.SetLabel(headroom.PodLabel, base(p, 0))
	if pod, d := admitOn(t, g, again); pod != "" || d.Verdict != gate.Wait || d.Delay <= 0 || !strings.Contains(d.Reason, base(p, 0)) {
		t.Errorf("a request of a full pod 0 placed on %q (%+v), want a wait naming pod 0", pod, d)
	}
	// pod 0 has room for one more (16 − reserve 2 − 10 others − its own
	// 3), pod 1 none: that place is the taken-back request's
	p.set(0, 13, 0)
	p.set(1, 16, 0)
	*clock = clock.Add(10 * time.Millisecond)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if pod, d := admitOn(t, g, &wire.Request{ID: "fresh"}); pod != "" || !strings.Contains(d.Reason, "1 kept for requests taken back") {
		t.Errorf("a fresh request placed on %q (%+v) while pod 0's one place is kept for the request taken back from it", pod, d)
	}
	if pod, _ := admitOn(t, g, again); pod != base(p, 0) {
		t.Errorf("the request taken back from pod 0 placed on %q once pod 0 has room, want pod 0", pod)
	}
	// once it is placed the pod is anyone's
	p.set(0, 4, 0)
	*clock = clock.Add(10 * time.Millisecond)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if pod, _ := admitOn(t, g, &wire.Request{ID: "fresh"}); pod != base(p, 0) {
		t.Errorf("a fresh request placed on %q after the claim was served, want pod 0", pod)
	}
	// a pod the gate no longer reads: placed where there is room
	gone := &wire.Request{}
	gone.SetLabel(headroom.PodLabel, "http://gone:8000")
	if pod, _ := admitOn(t, g, gone); pod != base(p, 0) {
		t.Errorf("a request of a pod no longer read placed on %q, want pod 0 (the one with room)", pod)
	}
}

// The per-pod limit falls on the pod whose other traffic grows: that
// pod's limit drops below what the queue holds there (the evictor takes
// back there), the other pod's does not move.
func TestPodsLimitsFallPerPod(t *testing.T) {
	p := newPods(t, 2)
	g, clock := podsGate(t, p, `,"pending_prefills":100`)
	ctx := context.Background()
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	on := map[string]int{}
	for range 20 {
		pod, _ := admitOn(t, g, &wire.Request{})
		on[pod]++
	}
	if on[base(p, 0)] != 10 || on[base(p, 1)] != 10 {
		t.Fatalf("20 placements split %v, want 10 and 10 (the most room first)", on)
	}
	p.set(0, 10+6, 0) // 6 interactive requests on pod 0
	p.set(1, 10, 0)
	*clock = clock.Add(time.Second)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	lim := podLimits(g)
	if lim[base(p, 0)] != 16-2-6 || lim[base(p, 1)] != 14 {
		t.Errorf("PodLimits = %v, want pod 0 at 8 (below its 10) and pod 1 at 14", lim)
	}
}

// Bad dispatch settings are refused with what to set.
func TestPodsConfigErrors(t *testing.T) {
	p := newPods(t, 2)
	for _, c := range []struct{ params, want string }{
		{`{"endpoints":"http://a:1/stats,http://b:1/stats","seats_per_pod":16,"dispatch":"pods"}`, "set gate_params.pod_urls"},
		{fmt.Sprintf(`{"endpoints":%q,"seats_per_pod":16,"dispatch":"pods","pod_urls":["http://a:1"]}`, strings.Join(p.urls(), ",")), "1 URLs for 2 endpoints"},
		{p.params(`,"dispatch":"pods","pod_urls":"http://a:1,ftp://b"`), `"ftp://b" is not an http(s)`},
		{p.params(`,"pod_urls":"http://a:1,http://b:1"`), `used only with dispatch "pods"`},
		{p.params(`,"dispatch":"pod"`), `gate_params.dispatch: "pod"`},
		{p.params(`,"dispatch":"pods","pending_prefills":0`), "pending_prefills: -1, want ≥ 1"},
		{p.params(`,"dispatch":"pods","pace_tokens":-5`), "pace_tokens: -5, want prompt tokens per second per pod ≥ 0"},
		{p.params(`,"pace_tokens":1000`), `pace_tokens: 1000 needs dispatch "pods"`},
		{p.params(`,"dispatch":"pods","pace_tokens":1000,"bytes_per_token":0`), "bytes_per_token: -1, want > 0"},
		{p.params(`,"dispatch":"pods","pace_tokens":"fast"`), "pace_tokens"},
		{p.params(`,"dispatch":"pods","pace_tokens":1000,"burst_threshold":3,"burst_pace_tokens":-1`), "burst_pace_tokens: -1, want prompt tokens per second per pod ≥ 0"},
		{p.params(`,"dispatch":"pods","burst_threshold":3,"burst_pace_tokens":500`), "burst_pace_tokens: 500 needs pace_tokens"},
		{p.params(`,"dispatch":"pods","pace_tokens":1000,"burst_pace_tokens":500`), "burst_pace_tokens: 500 needs burst_threshold > 0"},
	} {
		if _, err := build(t, c.params, 8); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.params, err, c.want)
		}
	}
	// pod_urls given: used as they are
	g := mustBuild(t, fmt.Sprintf(`{"endpoints":%q,"seats_per_pod":4,"reserve":0,"dispatch":"pods","pod_urls":["http://a:1/v","http://b:2"]}`,
		strings.Join(p.urls(), ",")), 8)
	if _, err := g.Budget(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lim := podLimits(g); lim["http://a:1/v"] != 4 || lim["http://b:2"] != 4 {
		t.Errorf("PodLimits = %v, want the pod_urls as keys", lim)
	}
	if !strings.Contains(g.Describe(), "per pod, dispatching to the pods itself") {
		t.Errorf("Describe() = %q", g.Describe())
	}
	// dispatch "gateway": no pods, no limits per pod
	if lim := podLimits(mustBuild(t, p.params(``), 8)); lim != nil {
		t.Errorf("gateway PodLimits = %v, want nil", lim)
	}
}

// The pace in tokens spaces the placements on a pod by the prefill each
// brings (its payload at bytes_per_token); a request resuming on its own
// pod brings none; a request held by the pace only is asked again when the
// pace lets it, not a whole reading later.
func TestPodsPaceTokens(t *testing.T) {
	p := newPods(t, 1)
	// 1,000 tokens a second, 4 bytes a token, many placements a reading
	g, clock := podsGate(t, p, `,"pace_tokens":1000,"pending_prefills":50`) // read every 50 ms
	if _, err := g.Budget(context.Background()); err != nil {
		t.Fatal(err)
	}
	req := func() *wire.Request { return &wire.Request{Payload: []byte(strings.Repeat("x", 400))} } // 100 tokens
	if pod, _ := admitOn(t, g, req()); pod != base(p, 0) {
		t.Fatalf("first placement on %q, want pod 0", pod)
	}
	// 100 tokens at 1,000 a second: the next one 100 ms later, asked
	// again at the next reading (50 ms) at the latest
	pod, d := admitOn(t, g, req())
	if pod != "" || d.Verdict != gate.Wait || d.Delay != 50*time.Millisecond || !strings.Contains(d.Reason, "1 paced") {
		t.Fatalf("second placement at once: pod %q, %+v; want a wait of 50ms (paced)", pod, d)
	}
	*clock = clock.Add(60 * time.Millisecond)
	if _, d := admitOn(t, g, req()); d.Verdict != gate.Wait || d.Delay != 40*time.Millisecond {
		t.Fatalf("60 ms later: %+v, want a wait of the 40 ms left", d)
	}
	*clock = clock.Add(40 * time.Millisecond)
	big := &wire.Request{Payload: []byte(strings.Repeat("x", 4000))} // 1,000 tokens
	if pod, _ := admitOn(t, g, big); pod != base(p, 0) {
		t.Fatalf("100 ms later: not placed (%q)", pod)
	}
	*clock = clock.Add(999 * time.Millisecond)
	if _, d := admitOn(t, g, req()); d.Verdict != gate.Wait || d.Delay != time.Millisecond {
		t.Fatalf("999 ms after 1,000 tokens: %+v, want a wait of 1ms", d)
	}
	*clock = clock.Add(time.Millisecond)
	// a request taken back from this pod resumes here: its prompt is
	// cached, so it does not hold the next placement
	back := req()
	back.SetLabel(headroom.PodLabel, base(p, 0))
	if pod, _ := admitOn(t, g, back); pod != base(p, 0) {
		t.Fatalf("resumed request not placed on its pod (%q)", pod)
	}
	if pod, _ := admitOn(t, g, req()); pod != base(p, 0) {
		t.Fatalf("placement after a resumed one: %q, want pod 0 at once", pod)
	}
	if !strings.Contains(g.Describe(), "1000 prompt tokens a second") {
		t.Errorf("Describe() = %q, want the pace named", g.Describe())
	}
}

// Among the requests waiting for a pod, the one due first is placed
// first, whoever asks first; a waiter that stops asking is forgotten after
// three refresh intervals and holds nobody back after that.
func TestPodsEarliestDeadlineFirst(t *testing.T) {
	p := newPods(t, 1)
	g, clock := podsGate(t, p, `,"pace_tokens":1000,"pending_prefills":50`)
	if _, err := g.Budget(context.Background()); err != nil {
		t.Fatal(err)
	}
	at := *clock
	req := func(id string, due time.Duration) *wire.Request {
		return &wire.Request{ID: id, Deadline: at.Add(due), Payload: []byte(strings.Repeat("x", 400))} // 100 tokens
	}
	if pod, _ := admitOn(t, g, req("first", time.Hour)); pod == "" {
		t.Fatal("first request not placed")
	}
	// the pod is paced for 100 ms: a late and an early request wait
	late, early := req("late", time.Hour), req("early", time.Minute)
	for _, r := range []*wire.Request{late, early} {
		if pod, d := admitOn(t, g, r); pod != "" || d.Verdict != gate.Wait {
			t.Fatalf("%s placed on %q while the pod is paced (%+v)", r.ID, pod, d)
		}
	}
	*clock = clock.Add(100 * time.Millisecond)
	// the late one asks first when the pace lets a request in: the early
	// one is due before it
	pod, d := admitOn(t, g, late)
	if pod != "" || d.Verdict != gate.Wait || !strings.Contains(d.Reason, "due earlier") {
		t.Fatalf("late request placed on %q before the early one (%+v)", pod, d)
	}
	if pod, _ := admitOn(t, g, early); pod != base(p, 0) {
		t.Fatalf("early request not placed (%q)", pod)
	}
	// the pod is paced again; then the early request's place is free and
	// the late one goes
	*clock = clock.Add(100 * time.Millisecond)
	if pod, _ := admitOn(t, g, late); pod != base(p, 0) {
		t.Fatalf("late request not placed once it is the first waiting (%q)", pod)
	}
	// a waiter due first that stops asking holds the others back for at
	// most three refresh intervals (150 ms)
	gone, next := req("gone", time.Second), req("next", time.Hour)
	if pod, _ := admitOn(t, g, gone); pod != "" {
		t.Fatalf("gone placed on %q while the pod is paced", pod)
	}
	*clock = clock.Add(100 * time.Millisecond)
	if pod, d := admitOn(t, g, next); pod != "" || !strings.Contains(d.Reason, "due earlier") {
		t.Fatalf("next placed on %q ahead of a waiter that asked 100 ms ago (%+v)", pod, d)
	}
	*clock = clock.Add(51 * time.Millisecond)
	if pod, d := admitOn(t, g, next); pod != base(p, 0) {
		t.Fatalf("next not placed once the silent waiter is stale (%q, %+v)", pod, d)
	}
}

// In a burst a pod's limit rises by one above what runs there now, and a
// call that finishes frees its seat for the next at once: the batch keeps
// what it holds and grows by one a reading, as the replay's twin does. A
// finished call still counts as the queue's own for the others (the pod's
// gauges may show it until its next step).
func TestPodsBurstGrowsOverWhatRuns(t *testing.T) {
	p := newPods(t, 1)
	g, clock := podsGate(t, p, `,"pending_prefills":100,"burst_threshold":3,"idle_reserve":2`)
	ctx := context.Background()
	p.set(0, 5, 0) // 5 interactive requests: a burst
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	var placed []gate.Decision
	for range 3 {
		if pod, d := admitOn(t, g, &wire.Request{}); pod != "" {
			placed = append(placed, d)
		}
	}
	if len(placed) != 1 {
		t.Fatalf("%d placed at the burst's first reading, want 1 (own 0 + 1)", len(placed))
	}
	*clock = clock.Add(time.Second)
	p.set(0, 5+1, 0)
	if _, err := g.Budget(ctx); err != nil {
		t.Fatal(err)
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod == "" {
		t.Fatal("nothing placed at the next reading, want one more (own 1 + 1)")
	}
	if pod, _ := admitOn(t, g, &wire.Request{}); pod != "" {
		t.Fatal("a third placed in one reading of a burst")
	}
	// the first call finishes: its seat is free for another before the
	// next reading
	placed[0].Release()
	if pod, _ := admitOn(t, g, &wire.Request{}); pod == "" {
		t.Fatal("a finished call's seat not given to the next request in the burst")
	}
}

// In a pod's burst (its other traffic at burst_threshold or more) the pace
// is burst_pace_tokens; outside it, pace_tokens.
func TestPodsBurstPace(t *testing.T) {
	p := newPods(t, 1)
	g, clock := podsGate(t, p, `,"pace_tokens":1000,"burst_pace_tokens":250,"burst_threshold":3,"pending_prefills":50,"burst_window":"100ms"`)
	ctx := context.Background()
	read := func(others int) {
		t.Helper()
		p.set(0, others, 0)
		if _, err := g.Budget(ctx); err != nil {
			t.Fatal(err)
		}
	}
	req := func() *wire.Request { return &wire.Request{Payload: []byte(strings.Repeat("x", 400))} } // 100 tokens
	read(0)
	if pod, _ := admitOn(t, g, req()); pod == "" {
		t.Fatal("nothing placed outside a burst")
	}
	// outside a burst 100 tokens hold the pod 100 ms
	*clock = clock.Add(100 * time.Millisecond)
	read(5) // a burst
	if pod, _ := admitOn(t, g, req()); pod == "" {
		t.Fatal("nothing placed 100 ms after 100 tokens")
	}
	// in the burst 100 tokens hold it 400 ms
	*clock = clock.Add(300 * time.Millisecond)
	read(5)
	if _, d := admitOn(t, g, req()); d.Verdict != gate.Wait || !strings.Contains(d.Reason, "1 paced") {
		t.Fatalf("300 ms after 100 tokens in a burst: %+v, want paced (250 tokens a second)", d)
	}
	*clock = clock.Add(100 * time.Millisecond)
	if pod, _ := admitOn(t, g, req()); pod == "" {
		t.Fatal("nothing placed 400 ms after 100 tokens in a burst")
	}
	if !strings.Contains(g.Describe(), "(250 in its bursts)") {
		t.Errorf("Describe() = %q, want the burst pace named", g.Describe())
	}
}

// With the pods' step counts (step_metric), a pod's waiting requests less
// this replica's placements of its last one and a quarter steps are the ones queued
// behind the batch: a placement older than that has had its step, so a
// request still waiting then is someone else's and the pod takes no batch.
// Without them, every placement since the previous reading counts as
// possibly waiting.
func TestPodsQueuedOverSteps(t *testing.T) {
	for _, steps := range []bool{true, false} {
		t.Run(fmt.Sprint("steps=", steps), func(t *testing.T) {
			p := newPods(t, 1)
			g, clock := podsGate(t, p, `,"pending_prefills":10`)
			ctx := context.Background()
			read := func(waiting int) headroom.PodReading {
				t.Helper()
				if steps {
					p.addSteps(0, 10) // 10 steps a 50 ms: a step is 5 ms
				}
				p.set(0, 0, waiting)
				if _, err := g.Budget(ctx); err != nil {
					t.Fatal(err)
				}
				return g.Last().Pods[0]
			}
			read(0)
			*clock = clock.Add(50 * time.Millisecond)
			if r := read(0); steps && r.Step != 5*time.Millisecond {
				t.Fatalf("step %v, want 5ms (10 steps in 50 ms)", r.Step)
			}
			// two placements early in the interval, long scheduled by the
			// next reading, which sees two requests waiting
			*clock = clock.Add(5 * time.Millisecond)
			for range 2 {
				if pod, _ := admitOn(t, g, &wire.Request{}); pod == "" {
					t.Fatal("not placed")
				}
			}
			*clock = clock.Add(45 * time.Millisecond)
			r := read(2)
			want := 0
			if steps {
				want = 2
			}
			if r.Queued != want {
				t.Fatalf("queued %d, want %d (waiting 2, placements 45 ms = 9 steps ago)", r.Queued, want)
			}
			if pod, d := admitOn(t, g, &wire.Request{}); (pod == "") != steps {
				t.Fatalf("placed on %q (%+v); want a placement only without the steps", pod, d)
			}
			// a placement 4 ms (under one and a quarter steps) before a reading may be
			// the one waiting
			*clock = clock.Add(46 * time.Millisecond)
			if !steps {
				return
			}
			r = read(0)
			*clock = clock.Add(46 * time.Millisecond)
			if pod, _ := admitOn(t, g, &wire.Request{}); pod == "" {
				t.Fatal("not placed on a pod with nothing waiting")
			}
			*clock = clock.Add(4 * time.Millisecond)
			if r = read(1); r.Queued != 0 {
				t.Fatalf("queued %d, want 0 (the one waiting is the placement of 4 ms ago)", r.Queued)
			}
		})
	}
}
