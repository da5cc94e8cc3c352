package poolsim

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// result is the end of one request sent by fire.
type result struct {
	status int
	header http.Header
	err    error
}

// fire sends a request in the background; cancel ends it. The returned
// wait blocks for its result.
func fire(t testing.TB, c *http.Client, url, body string, headers ...string) (wait func() result, cancel func()) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	ch := make(chan result, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			ch <- result{err: err}
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ch <- result{status: resp.StatusCode, header: resp.Header, err: err}
	}()
	var once sync.Once
	var r result
	wait = func() result { once.Do(func() { r = <-ch }); return r }
	t.Cleanup(func() { stop(); wait() })
	return wait, stop
}

// saturatedPool starts a one-pod, one-seat pool whose utilization detector
// reads 1.0 as soon as one request waits, and fills it: one long request
// runs and one waits.
func saturatedPool(t *testing.T, edit func(*Config)) (*Pool, string, *http.Client, []func()) {
	t.Helper()
	cfg := Config{Pods: 1}
	cfg.Engine.MaxNumSeqs = 1
	cfg.Front.QueueDepthThreshold = 1
	if edit != nil {
		edit(&cfg)
	}
	p, base, c := startPool(t, cfg)
	var cancels []func()
	for range 2 {
		_, cancel := fire(t, c, base+PodPrefix+"0"+PathCompletions, `{"prompt":"x","max_tokens":2000}`)
		cancels = append(cancels, cancel)
	}
	waitFor(t, "saturation 1", func() bool { return p.Saturation() >= 1 })
	return p, base, c, cancels
}

func TestUtilizationDetector(t *testing.T) {
	tests := []struct {
		name  string
		snaps []snap
		want  float64
		stale int
	}{
		{"idle", []snap{{}, {}}, 0, 0},
		{"queue score: waiting/5", []snap{{waiting: 5}, {waiting: 0}}, 0.5, 0},
		{"kv score: kv/0.8", []snap{{kv: 0.4}, {kv: 0.8}}, 0.75, 0},
		{"max of the two per pod", []snap{{waiting: 1, kv: 0.8}, {waiting: 10, kv: 0.1}}, 1.5, 0},
		{"uncapped", []snap{{waiting: 20}, {waiting: 20}}, 4, 0},
		{"stale pod scores 1", []snap{{waiting: 0}, {waiting: 0, at: time.Unix(1, 0)}}, 0.5, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := New(Config{Seed: 1, Pods: len(tc.snaps)})
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			for i, s := range tc.snaps {
				if s.at.IsZero() {
					s.at = now
				}
				p.front.snaps[i] = s
			}
			got := p.front.saturationLocked(now)
			if d := got - tc.want; d > 1e-9 || d < -1e-9 || p.front.stale != tc.stale {
				t.Fatalf("saturation %v stale %d, want %v and %d", got, p.front.stale, tc.want, tc.stale)
			}
		})
	}
}

func TestRouting(t *testing.T) {
	p, err := New(Config{Seed: 1, Pods: 3})
	if err != nil {
		t.Fatal(err)
	}
	f := p.front
	now := time.Now()
	set := func(s ...snap) {
		for i := range s {
			s[i].at = now
			f.snaps[i] = s[i]
			f.sinceRead[i] = 0
		}
	}
	set(snap{waiting: 2, running: 1}, snap{waiting: 1, running: 9}, snap{waiting: 1, running: 3})
	if got := f.routeLocked(now); got != 2 {
		t.Fatalf("routed to %d, want 2 (fewest waiting, then fewest running)", got)
	}
	// The request just sent to pod 2 counts as waiting there until the
	// next read: the next goes to pod 1.
	if got := f.routeLocked(now); got != 1 {
		t.Fatalf("routed to %d, want 1 (pod 2 got a request since its read)", got)
	}
	// A pod the filter drops (KV ≥ 0.8) is avoided while another passes.
	set(snap{kv: 0.9}, snap{waiting: 3}, snap{waiting: 4})
	if got := f.routeLocked(now); got != 1 {
		t.Fatalf("routed to %d, want 1 (pod 0 filtered out by its KV usage)", got)
	}
	// Ties are broken at random, with the seed.
	seen := map[int]bool{}
	for range 60 {
		set(snap{}, snap{}, snap{})
		seen[f.routeLocked(now)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("ties went to pods %v, want all three", seen)
	}
}

func TestLegacyAdmission(t *testing.T) {
	p, base, c, _ := saturatedPool(t, func(c *Config) {
		c.Front.Mode = ModeLegacyAdmission
		c.Front.RetryAfter = 1500 * time.Millisecond
	})
	resp, body := post(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch-sheddable")
	if resp.StatusCode != 429 || resp.Header.Get("x-llm-d-request-dropped-reason") != "rejected-saturated" {
		t.Fatalf("sheddable request at saturation: %d %q %s; want 429 rejected-saturated",
			resp.StatusCode, resp.Header.Get("x-llm-d-request-dropped-reason"), body)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "2" {
		t.Fatalf("Retry-After %q, want 2 (1.5 s rounded up)", ra)
	}
	// Priority >= 0 passes (it queues on the pod).
	wait, cancel := fire(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "interactive-default")
	waitFor(t, "the interactive request to reach the pod", func() bool { return p.PodGauges()[0].Waiting == 2 })
	cancel()
	if r := wait(); r.status == 429 {
		t.Fatal("an interactive request was rejected")
	}
	st := p.Stats()
	if st.Classes[ClassBatch].Rejected != 1 || st.Rejections[ReasonSaturated] != 1 {
		t.Fatalf("stats %+v: want one batch rejection for rejected-saturated", st)
	}
	fams := scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricFrontRejections, "reason", ReasonSaturated); v != 1 {
		t.Fatalf("%s = %v, want 1", MetricFrontRejections, v)
	}
	if v := value(t, fams, MetricPoolSaturationOld, "stage", "effective"); v < 1 {
		t.Fatalf("%s = %v while saturated, want >= 1", MetricPoolSaturationOld, v)
	}
}

func TestLegacyAdmissionBelowSaturation(t *testing.T) {
	cfg := Config{}
	cfg.Front.Mode = ModeLegacyAdmission
	_, base, c := startPool(t, cfg)
	resp, body := post(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch-sheddable")
	if resp.StatusCode != 200 {
		t.Fatalf("sheddable request on an idle pool: %d %s", resp.StatusCode, body)
	}
}

func TestStalePod(t *testing.T) {
	p, base, c := startPool(t, Config{})
	p.SetPodStalled(1, true)
	waitFor(t, "pod 1 to read stale", func() bool { return p.Saturation() >= 0.5 })
	fams := scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricStaleEndpoints, "detector", "utilization-detector"); v != 1 {
		t.Fatalf("stale endpoints %v, want 1", v)
	}
	p.SetPodStalled(1, false)
	waitFor(t, "pod 1 to read fresh again", func() bool { return p.Saturation() == 0 })
}

func TestConcurrencyDetector(t *testing.T) {
	cfg := Config{Pods: 1}
	cfg.Front.Detector = DetectorConcurrency
	cfg.Front.MaxConcurrency = 2
	cfg.Front.Mode = ModeLegacyAdmission
	p, base, c := startPool(t, cfg)
	for range 2 {
		fire(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":2000}`)
	}
	waitFor(t, "two requests in flight", func() bool { return p.Saturation() >= 1 })
	resp, _ := post(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch")
	if resp.StatusCode != 429 {
		t.Fatalf("sheddable request at concurrency saturation: %d, want 429", resp.StatusCode)
	}
	fams := scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricStaleEndpoints, "detector", "concurrency-detector"); v != 0 {
		t.Fatalf("stale endpoints %v", v)
	}
}

func TestFlowControl(t *testing.T) {
	p, base, c, fill := saturatedPool(t, func(c *Config) {
		c.Front.Mode = ModeFlowControl
		c.Front.BandCapacity = 2
		c.Front.RequestTTL = time.Minute
	})
	// Saturated: a batch and an interactive request are held in their bands.
	waitBatch, _ := fire(t, c, base+PathCompletions, `{"model":"m","prompt":"x","max_tokens":1}`,
		HeaderObjective, "batch-sheddable", HeaderFairness, "tenant-a")
	waitInter, _ := fire(t, c, base+PathCompletions, `{"model":"m","prompt":"x","max_tokens":1}`, HeaderObjective, "interactive-default")
	waitFor(t, "two held requests", func() bool {
		p.front.mu.Lock()
		defer p.front.mu.Unlock()
		return p.front.queued[queueKey{"tenant-a", "m", -1}] == 1 && p.front.queued[queueKey{"default", "m", 100}] == 1
	})
	fams := scrape(t, c, base+PathMetrics)
	for _, name := range []string{MetricQueueSize, MetricQueueSizeOld} {
		if v := value(t, fams, name, "priority", "-1", "fairness_id", "tenant-a", "inference_pool", DefaultPoolName,
			"model_name", "m", "target_model_name", "m"); v != 1 {
			t.Fatalf("%s{priority=-1} = %v, want 1", name, v)
		}
	}
	// The band of -1 holds 2: one more fits, the next is refused.
	fire(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch-sheddable")
	waitFor(t, "a second batch request held", func() bool {
		p.front.mu.Lock()
		defer p.front.mu.Unlock()
		return p.front.bandLocked(-1).items.Len() == 2
	})
	resp, _ := post(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch-sheddable")
	if resp.StatusCode != 429 {
		t.Fatalf("band full: %d, want 429", resp.StatusCode)
	}
	// Free the pool: the held requests are dispatched.
	for _, cancel := range fill {
		cancel()
	}
	ri, rb := waitInter(), waitBatch()
	if ri.status != 200 || rb.status != 200 {
		t.Fatalf("held requests answered %d (interactive) and %d (batch), want 200", ri.status, rb.status)
	}
	fams = scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricFlowRequests, "outcome", "Dispatched", "priority", "100"); v != 1 {
		t.Fatalf("dispatched{priority=100} = %v, want 1", v)
	}
	if v := value(t, fams, MetricFlowRequests, "outcome", "RejectedCapacity", "priority", "-1"); v != 1 {
		t.Fatalf("RejectedCapacity{priority=-1} = %v, want 1", v)
	}
}

func TestFlowControlOrderAndTTL(t *testing.T) {
	p, base, c, fill := saturatedPool(t, func(c *Config) {
		c.Front.Mode = ModeFlowControl
		c.Front.RequestTTL = 300 * time.Millisecond
	})
	// An SLO header shortens the TTL further; both expire while saturated.
	waitA, _ := fire(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch")
	waitB, _ := fire(t, c, base+PathCompletions, `{"prompt":"x","max_tokens":1}`, HeaderObjective, "batch", HeaderSLOTTFT, "50")
	start := time.Now()
	rb := waitB()
	early := time.Since(start)
	ra := waitA()
	for _, r := range []result{ra, rb} {
		if r.status != 503 || r.header.Get(HeaderDroppedReason) != ReasonTTLExpired {
			t.Fatalf("held past TTL: %d %q, want 503 %s", r.status, r.header.Get(HeaderDroppedReason), ReasonTTLExpired)
		}
	}
	if early > 250*time.Millisecond {
		t.Logf("the 50-ms SLO request waited %v (loaded machine?)", early)
	}
	fams := scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricFlowRequests, "outcome", "EvictedTTL", "priority", "-1"); v != 2 {
		t.Fatalf("EvictedTTL = %v, want 2", v)
	}
	if st := p.Stats(); st.Rejections[ReasonTTLExpired] != 2 {
		t.Fatalf("rejections %v", st.Rejections)
	}
	for _, cancel := range fill {
		cancel()
	}
}

func TestFlowControlDispatchOrder(t *testing.T) {
	// The concurrency detector with one seat of concurrency: each dispatch
	// saturates the pool until that request ends, so one cycle dispatches
	// exactly one request, from the highest non-empty band.
	cfg := Config{Seed: 1, Pods: 1}
	cfg.Front.Mode = ModeFlowControl
	cfg.Front.Detector = DetectorConcurrency
	cfg.Front.MaxConcurrency = 1
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := p.front
	hold := func(prio int) *fcItem {
		it := &fcItem{req: &request{eppPriority: prio}, decided: make(chan struct{}), pod: -1, key: queueKey{"default", "m", prio}}
		f.mu.Lock()
		it.band = f.bandLocked(prio)
		it.elem = it.band.items.PushBack(it)
		f.queued[it.key]++
		f.mu.Unlock()
		return it
	}
	decided := func(it *fcItem) bool {
		select {
		case <-it.decided:
			return true
		default:
			return false
		}
	}
	b1, b2, i1 := hold(-1), hold(-1), hold(100)
	now := time.Now()
	f.cycle(now)
	if !decided(i1) || decided(b1) || decided(b2) || i1.pod != 0 {
		t.Fatalf("first cycle: interactive %v batch %v %v; want only the interactive request dispatched", decided(i1), decided(b1), decided(b2))
	}
	f.done(0)
	f.cycle(now)
	if !decided(b1) || decided(b2) {
		t.Fatalf("second cycle: batch %v %v; want the first batch request (FIFO within the band)", decided(b1), decided(b2))
	}
	// Holdback: with two bands, the lowest band's ceiling is HoldbackMin.
	f.cfg.CeilingPolicy = CeilingPriorityHoldback
	f.cfg.HoldbackMin = 0.5
	if c0, c1 := f.ceilingLocked(0, 2), f.ceilingLocked(1, 2); c0 != 1 || c1 != 0.5 {
		t.Fatalf("holdback ceilings %v, %v; want 1 and 0.5", c0, c1)
	}
}

// With PrefixAware, a request whose text extends one routed before goes to
// that request's pod while its load allows; a short shared prefix, or a
// pod with more than one extra waiting request, does not pull it.
func TestPrefixAwareRouting(t *testing.T) {
	cfg := Config{Seed: 1, Pods: 2}
	cfg.Engine.PrefixCaching, cfg.Front.PrefixAware = true, true
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := p.front
	now := time.Now()
	set := func(w0, w1 int) {
		f.snaps[0], f.snaps[1] = snap{at: now, waiting: w0}, snap{at: now, waiting: w1}
		f.sinceRead[0], f.sinceRead[1] = 0, 0
	}
	prompt := strings.Repeat(" wab", 128)
	set(0, 1)
	if got := f.routeTextLocked(now, prompt); got != 0 {
		t.Fatalf("first request to pod %d, want 0 (the least loaded)", got)
	}
	set(1, 0) // now pod 1 is the least loaded, pod 0 one request more
	if got := f.routeTextLocked(now, prompt+" the continuation"); got != 0 {
		t.Fatalf("continuation to pod %d, want 0 (it holds the prefix)", got)
	}
	set(3, 0) // pod 0 three waiting beyond pod 1: load wins
	if got := f.routeTextLocked(now, prompt+" another continuation"); got != 1 {
		t.Fatalf("continuation to busy pod 0 (%d), want pod 1", got)
	}
	set(1, 0)
	if got := f.routeTextLocked(now, prompt[:100]+" different"); got != 1 {
		t.Fatalf("a short shared prefix pulled the request to pod %d, want 1 (the load)", got)
	}
}
