package aimd_test

import (
	"context"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/aimd"
	"github.com/sluice-io/sluice/gates/gatecheck"
	"github.com/sluice-io/sluice/gates/gatetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fixture is a gate on a settable clock.
type fixture struct {
	t   *testing.T
	g   *aimd.Gate
	clk *clock
}

func newFixture(t *testing.T, cfg aimd.Config) *fixture {
	t.Helper()
	clk := &clock{now: time.Unix(1_000_000, 0)}
	cfg.Now = clk.Now
	g, err := aimd.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, g: g, clk: clk}
}

// req is a request of band (class, tier); class "" is unclassified.
func req(class, tier string) *wire.Request {
	r := &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute)}
	if class != "" {
		r.SetClassification(class)
	}
	if tier != "" {
		r.SetLabel(wire.DefaultTierLabel, tier)
	}
	return r
}

var batch = req(wire.ClassOverflow, wire.TierBatch) // band 5

func (f *fixture) admit(r *wire.Request) gate.Decision {
	f.t.Helper()
	d, err := f.g.Admit(context.Background(), r)
	if err != nil {
		f.t.Fatalf("Admit: %v", err)
	}
	if err := gatecheck.CheckDecision(d); err != nil {
		f.t.Fatalf("Admit = %+v: %v", d, err)
	}
	return d
}

// admitN admits n requests of r's band, failing when one is refused.
func (f *fixture) admitN(r *wire.Request, n int) []gate.Decision {
	f.t.Helper()
	ds := make([]gate.Decision, n)
	for i := range ds {
		ds[i] = f.admit(r)
		if ds[i].Verdict != gate.Admit {
			f.t.Fatalf("admission %d of %d: %v (%s), want admit; bands %+v", i+1, n, ds[i].Verdict, ds[i].Reason, f.g.Bands())
		}
	}
	return ds
}

// answer observes d with status and headers (name, value pairs), then releases it.
func answer(d gate.Decision, status int, retryAfter time.Duration, kv ...string) {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	d.Observe(gate.Feedback{Sent: time.Now(), StatusCode: status, Header: h, RetryAfter: retryAfter})
	d.Release()
}

func answerAll(ds []gate.Decision, status int, kv ...string) {
	for _, d := range ds {
		answer(d, status, 0, kv...)
	}
}

func (f *fixture) band(i int) aimd.BandState { return f.g.Bands()[i] }

func (f *fixture) wantWindow(i int, want float64) {
	f.t.Helper()
	if got := f.band(i).Window; math.Abs(got-want) > 1e-9 {
		f.t.Fatalf("band %s window %v, want %v (%+v)", aimd.BandName(i), got, want, f.band(i))
	}
}

const saturated = "rejected-saturated"

var reason = aimd.DefaultDroppedReasonHeader

func TestSlowStartDoublesPerFlight(t *testing.T) {
	f := newFixture(t, aimd.Config{})
	f.wantWindow(5, 1)
	for _, w := range []float64{1, 2, 4, 8, 16, 32} {
		ds := f.admitN(batch, int(w))
		if d := f.admit(batch); d.Verdict != gate.Defer || d.Delay != aimd.DefaultDeferDelay || d.Release != nil {
			t.Fatalf("window %v full: %+v, want Defer after %v", w, d, aimd.DefaultDeferDelay)
		}
		answerAll(ds, 200)
		f.wantWindow(5, 2*w) // slow start: +1 per answer
	}
}

func TestAdditiveIncreaseAboveSSThresh(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 4, SlowStartThreshold: 4})
	ds := f.admitN(batch, 4)
	answerAll(ds, 200)
	// +1/w per answer: 4 → 4.25 → 4.485… → about 5 after a window's worth.
	w := 4.0
	for range 4 {
		w += 1 / w
	}
	f.wantWindow(5, w)
	if w < 4.9 || w > 5 {
		t.Fatalf("additive increase after one window: %v, want about +1", w)
	}
}

func TestMaxWindowCaps(t *testing.T) {
	f := newFixture(t, aimd.Config{MaxWindow: 3})
	for range 3 {
		answerAll(f.admitN(batch, int(f.band(5).Window)), 200)
	}
	f.wantWindow(5, 3)
}

// Sixteen rejections of one flight decrease the window once; a rejection
// of a request sent after the decrease decreases it again.
func TestDecreaseOncePerFlight(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 16})
	ds := f.admitN(batch, 16)
	answerAll(ds, http.StatusTooManyRequests, reason, saturated)
	f.wantWindow(5, 8)
	if got := f.band(5).SSThresh; got != 8 {
		t.Errorf("ssthresh %v, want 8", got)
	}
	ev := f.g.Events()
	if ev[aimd.EventDecreaseSaturated] != 1 || ev[aimd.EventCoalesced] != 15 {
		t.Errorf("events %v, want one decrease and 15 coalesced", ev)
	}
	// The next flight is new evidence.
	ds = f.admitN(batch, 2)
	answer(ds[0], http.StatusTooManyRequests, 0) // a bare 429 counts as saturated
	f.wantWindow(5, 4)
	answer(ds[1], http.StatusTooManyRequests, 0) // same flight as ds[0]
	f.wantWindow(5, 4)
	// An accept sent after the decrease grows the window, additively now
	// that it sits at ssthresh.
	answer(f.admitN(batch, 1)[0], 200, 0)
	f.wantWindow(5, 4.25)
}

func TestAcceptSentBeforeDecreaseDoesNotGrow(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 8})
	early := f.admitN(batch, 4)
	late := f.admitN(batch, 1)
	answer(late[0], 429, 0, reason, saturated) // decreases 8 → 4
	f.wantWindow(5, 4)
	answerAll(early, 200) // sent before the decrease: no growth
	f.wantWindow(5, 4)
}

func TestOutcomeTable(t *testing.T) {
	tests := []struct {
		name   string
		status int
		kv     []string
		want   float64 // window after, from 10
	}{
		{"2xx grows (slow start)", 200, nil, 11},
		{"rejected-saturated halves", 429, []string{reason, saturated}, 5},
		{"rejected-saturated on another status halves", 503, []string{reason, saturated}, 5},
		{"bare 429 halves", 429, nil, 5},
		{"ttl expired: gentle", 503, []string{reason, "rejected-ttl-expired"}, 9},
		{"evicted: none", 429, []string{reason, "evicted-priority"}, 10},
		{"another reason: none", 429, []string{reason, "rejected-no-endpoints"}, 10},
		{"5xx: none", 503, nil, 10},
		{"other 4xx: none", 400, nil, 10},
		{"transport failure: none", 0, nil, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, aimd.Config{InitialWindow: 10})
			answer(f.admitN(batch, 1)[0], tt.status, 0, tt.kv...)
			f.wantWindow(5, tt.want)
		})
	}
}

func TestCustomReasonHeader(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 10, DroppedReasonHeader: "x-why"})
	answer(f.admitN(batch, 1)[0], 503, 0, "x-why", saturated)
	f.wantWindow(5, 5)
	answer(f.admitN(batch, 1)[0], 503, 0, reason, saturated) // the default header is not read
	f.wantWindow(5, 5)
}

// Retry-After closes the band and the bands below until then, drops their
// windows to the minimum, and they reopen in slow start towards the
// ssthresh recorded at the close.
func TestRetryAfterClosesThenReopens(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 8, MaxConcurrency: 100})
	interactive := req(wire.ClassOverflow, wire.TierInteractive) // band 3
	async := req(wire.ClassOverflow, wire.TierAsync)             // band 4
	f.admitN(batch, 1)[0].Release()                              // bands 3, 4, 5 in use
	f.admitN(async, 1)[0].Release()
	d := f.admitN(interactive, 1)[0]
	answer(d, 429, 2*time.Second, reason, saturated)
	for _, i := range []int{3, 4, 5} {
		if s := f.band(i); !s.Closed || s.Window != 1 || s.SSThresh != 4 {
			t.Fatalf("band %s after Retry-After: %+v, want closed, window 1, ssthresh 4", s.Name, s)
		}
	}
	if s := f.band(2); s.Closed || s.Window != 8 {
		t.Fatalf("band above the rejection changed: %+v", s)
	}
	if b, _ := f.g.Budget(context.Background()); b != 0 {
		t.Errorf("budget %v with every band in use closed, want 0", b)
	}
	d = f.admit(batch)
	if d.Verdict != gate.Defer || d.Delay != 2*time.Second || !strings.Contains(d.Reason, "Retry-After") {
		t.Fatalf("closed band: %+v, want Defer for 2s", d)
	}
	if d := f.admit(req(wire.ClassReserved, wire.TierBatch)); d.Verdict != gate.Admit { // band 2 is open
		t.Fatalf("reserved-batch: %+v, want admit", d)
	} else {
		d.Release()
	}
	f.clk.Add(1500 * time.Millisecond)
	if d := f.admit(batch); d.Verdict != gate.Defer || d.Delay != 500*time.Millisecond {
		t.Fatalf("still closed: %+v, want Defer for the 500ms left", d)
	}
	f.clk.Add(500 * time.Millisecond)
	if b, _ := f.g.Budget(context.Background()); b != 0.11 {
		t.Errorf("budget %v after reopening, want (8 + 3 windows of 1) / 100", b)
	}
	// Slow start towards ssthresh 4, then additive increase.
	for _, want := range []float64{2, 4} {
		answerAll(f.admitN(batch, int(f.band(5).Window)), 200)
		f.wantWindow(5, want)
	}
	answerAll(f.admitN(batch, 4), 200)
	w := 4.0
	for range 4 {
		w += 1 / w
	}
	f.wantWindow(5, w)
	if f.g.Events()[aimd.EventCloseRetryAfter] != 3 {
		t.Errorf("events %v, want 3 closes", f.g.Events())
	}
}

// A rejection decreases the bands below it and holds the bands above;
// an accept in a lower band sent after the hold clears it.
func TestCouplingAcrossBands(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 8, HoldDuration: time.Second})
	reservedInteractive := req(wire.ClassReserved, wire.TierInteractive) // 0
	reservedBatch := req(wire.ClassReserved, wire.TierBatch)             // 2
	overflowInteractive := req(wire.ClassOverflow, wire.TierInteractive) // 3
	overflowAsync := req(wire.ClassOverflow, wire.TierAsync)             // 4

	top := f.admitN(reservedInteractive, 2) // sent before the rejection
	answer(f.admitN(overflowInteractive, 1)[0], 429, 0, reason, saturated)
	for i, want := range []float64{8, 8, 8, 4, 4, 4} {
		f.wantWindow(i, want)
	}
	for i := range 3 {
		if !f.band(i).Held {
			t.Fatalf("band %d above the rejection not held: %+v", i, f.band(i))
		}
	}
	if ev := f.g.Events(); ev[aimd.EventDecreaseCoupled] != 2 {
		t.Errorf("events %v, want 2 coupled decreases", ev)
	}
	answer(top[0], 200, 0) // held: no growth
	f.wantWindow(0, 8)
	answer(f.admitN(overflowAsync, 1)[0], 200, 0) // sent after the hold: clears the holds of 0…3
	for i := range 4 {
		if f.band(i).Held {
			t.Fatalf("band %d still held after an accept below it: %+v", i, f.band(i))
		}
	}
	answer(top[1], 200, 0)
	f.wantWindow(0, 9)

	// A hold expires on its own.
	answer(f.admitN(overflowInteractive, 1)[0], 429, 0, reason, saturated)
	if !f.band(2).Held {
		t.Fatal("band 2 not held")
	}
	f.clk.Add(time.Second)
	answer(f.admitN(reservedBatch, 1)[0], 200, 0)
	f.wantWindow(2, 9)
}

func TestHoldClearedOnlyBySendsAfterIt(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 8})
	below := f.admitN(req(wire.ClassOverflow, wire.TierAsync), 1) // band 4, sent before the hold
	answer(f.admitN(batch, 1)[0], 429, 0, reason, saturated)      // band 5 rejects: holds 0…4
	answer(below[0], 200, 0)
	if !f.band(0).Held {
		t.Fatal("an accept sent before the hold cleared it")
	}
}

func TestReservedWaitsOverflowDefers(t *testing.T) {
	f := newFixture(t, aimd.Config{})
	reserved := req(wire.ClassReserved, wire.TierBatch)
	held := f.admitN(reserved, 1)
	if d := f.admit(reserved); d.Verdict != gate.Wait || d.Delay <= 0 {
		t.Fatalf("full reserved band: %+v, want Wait", d)
	}
	unclassified := req("", "")
	held = append(held, f.admitN(unclassified, 1)...)
	if d := f.admit(unclassified); d.Verdict != gate.Defer {
		t.Fatalf("full unclassified band: %+v, want Defer", d)
	}
	for _, d := range held {
		d.Release()
		d.Release() // a second call does nothing
	}
	for _, s := range f.g.Bands() {
		if s.InFlight != 0 {
			t.Fatalf("band %s: %d in flight after every release", s.Name, s.InFlight)
		}
	}
}

func TestHeadroomCap(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 10})
	ds := f.admitN(batch, 3)
	answer(ds[0], 200, 0, aimd.DefaultHeadroomHeader, "2") // 3 in flight + 2 free
	f.wantWindow(5, 5)
	answer(ds[1], 200, 0, aimd.DefaultHeadroomHeader, "junk") // no signal
	f.wantWindow(5, 6)
	nf := newFixture(t, aimd.Config{InitialWindow: 10, NoFlowHeaders: true})
	answer(nf.admitN(batch, 1)[0], 200, 0, aimd.DefaultHeadroomHeader, "0")
	nf.wantWindow(5, 11)
	ds[2].Release()
}

func TestQueueDurationSignal(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 10, QueueDurationTarget: 100 * time.Millisecond})
	answer(f.admitN(batch, 1)[0], 200, 0, aimd.DefaultQueueDurationHeader, "50")
	f.wantWindow(5, 11)
	answer(f.admitN(batch, 1)[0], 200, 0, aimd.DefaultQueueDurationHeader, "150") // past the target: hold
	f.wantWindow(5, 11)
	answer(f.admitN(batch, 1)[0], 200, 0, aimd.DefaultQueueDurationHeader, "250") // past twice: ×0.9
	f.wantWindow(5, 9.9)
	off := newFixture(t, aimd.Config{InitialWindow: 10})
	answer(off.admitN(batch, 1)[0], 200, 0, aimd.DefaultQueueDurationHeader, "250") // no target: ignored
	off.wantWindow(5, 11)
}

func TestBudgetFollowsWindows(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 4, MaxConcurrency: 20})
	budget := func() float64 {
		t.Helper()
		b, err := f.g.Budget(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if b := budget(); b != 0.2 {
		t.Errorf("budget before any request %v, want the initial window 4/20", b)
	}
	f.admitN(batch, 1)[0].Release()
	if b := budget(); b != 0.2 {
		t.Errorf("one band in use: %v, want 4/20", b)
	}
	f.admitN(req(wire.ClassReserved, wire.TierInteractive), 1)[0].Release()
	if b := budget(); b != 0.4 {
		t.Errorf("two bands in use: %v, want 8/20", b)
	}
	answer(f.admitN(batch, 1)[0], 200, 0) // batch 4 → 5
	if b := budget(); b != 0.45 {
		t.Errorf("after growth: %v, want 9/20", b)
	}
	f.clk.Add(6 * time.Second) // both idle
	if b := budget(); b != 0.2 {
		t.Errorf("idle bands: %v, want the initial window's share", b)
	}
	big := newFixture(t, aimd.Config{InitialWindow: 40, MaxConcurrency: 20})
	if b, _ := big.g.Budget(context.Background()); b != 1 {
		t.Errorf("windows above max_concurrency: budget %v, want 1", b)
	}
}

func TestBandOverrides(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 4, Bands: map[string]aimd.BandConfig{
		"overflow-batch": {MaxWindow: 2, MinWindow: 2},
	}})
	f.wantWindow(5, 2)
	f.wantWindow(0, 4)
	answerAll(f.admitN(batch, 2), 200)
	f.wantWindow(5, 2) // capped
	answer(f.admitN(batch, 1)[0], 429, 0)
	f.wantWindow(5, 2) // floored at its minimum
}

func build(t testing.TB, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(aimd.Type, aimd.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, aimd.Type, params, env)
}

func TestParams(t *testing.T) {
	tests := []struct{ name, params, wantErr string }{
		{"defaults", `{}`, ""},
		{"upstream's example", `{"min_window":1,"max_window":256,"increase":1.0,"decrease_factor":0.5,"hold_duration":"1s","tier_label":"tier","queue_duration_target":"0s"}`, ""},
		{"strings for numbers", `{"max_window":"64","initial_window":"4"}`, ""},
		{"bands", `{"bands":{"overflow-batch":{"max_window":16},"reserved-interactive":{"min_window":4}}}`, ""},
		{"bands as a JSON string", `{"bands":"{\"overflow-batch\":{\"max_window\":16}}"}`, ""},
		{"headers", `{"dropped_reason_header":"x-why","queue_duration_header":"x-q","headroom_header":"x-h","flow_headers":false}`, ""},
		{"no holds", `{"hold_duration":"0s"}`, ""},
		{"min below 1", `{"min_window":0.5}`, "gate_params.min_window: 0.5 must be ≥ 1"},
		{"min zero", `{"min_window":0}`, "gate_params.min_window: 0 is not allowed"},
		{"max below min", `{"min_window":8,"max_window":4}`, "gate_params.max_window: 4 must be ≥ min_window 8"},
		{"initial above max", `{"max_window":4,"initial_window":8}`, "gate_params.initial_window"},
		{"ssthresh below min", `{"min_window":4,"slow_start_threshold":2}`, "gate_params.slow_start_threshold"},
		{"negative increase", `{"increase":-1}`, "gate_params.increase: -1 must be > 0"},
		{"decrease factor 1", `{"decrease_factor":1}`, "gate_params.decrease_factor: 1 must lie in (0,1)"},
		{"gentle factor above 1", `{"gentle_decrease_factor":1.5}`, "gate_params.gentle_decrease_factor"},
		{"negative hold", `{"hold_duration":"-1s"}`, "gate_params.hold_duration: -1s is negative"},
		{"negative queue target", `{"queue_duration_target":"-5ms"}`, "gate_params.queue_duration_target"},
		{"zero defer delay", `{"defer_delay":"0s"}`, "gate_params.defer_delay"},
		{"bad header", `{"headroom_header":"x h"}`, `gate_params.headroom_header: "x h" is not a valid header name`},
		{"bad flow_headers", `{"flow_headers":"maybe"}`, "gate_params.flow_headers"},
		{"unknown band", `{"bands":{"overflow-bulk":{"max_window":4}}}`, `unknown band "overflow-bulk"`},
		{"unknown band field", `{"bands":{"overflow-batch":{"window":4}}}`, "gate_params.bands"},
		{"band max below its min", `{"bands":{"overflow-batch":{"min_window":8,"max_window":4}}}`, "gate_params.bands.overflow-batch.max_window"},
		{"bands not an object", `{"bands":4}`, "gate_params.bands"},
		{"number not a number", `{"max_window":"lots"}`, "gate_params.max_window"},
		{"unknown param", `{"window":4}`, "unknown gate_params: window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params, gate.Env{MaxConcurrency: 64})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestFactoryUsesMaxConcurrency(t *testing.T) {
	g, err := build(t, `{"initial_window":8}`, gate.Env{MaxConcurrency: 32})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := g.Budget(context.Background()); b != 0.25 {
		t.Errorf("budget %v, want 8/32", b)
	}
	if d := g.(gate.Describer).Describe(); !strings.Contains(d, "/ 32 in flight") {
		t.Errorf("Describe = %q", d)
	}
	if iv := gate.IntervalOf(g); iv != aimd.DefaultRefreshInterval {
		t.Errorf("refresh interval %v, want %v", iv, aimd.DefaultRefreshInterval)
	}
}

func TestConformance(t *testing.T) {
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		g, err := build(t, `{"initial_window":4}`, gate.Env{MaxConcurrency: 16})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}, gatetest.Features{})
}

// Many goroutines admit, observe and release at once: the counts stay exact.
func TestConcurrentFeedback(t *testing.T) {
	g, err := aimd.New(aimd.Config{InitialWindow: 8, MaxWindow: 64})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				d, _ := g.Admit(context.Background(), batch)
				if d.Verdict != gate.Admit {
					continue
				}
				status := 200
				if (w+i)%7 == 0 {
					status = 429
				}
				answer(d, status, 0)
			}
		})
	}
	wg.Wait()
	s := g.Bands()[5]
	if s.InFlight != 0 || s.Window < 1 || s.Window > 64 {
		t.Fatalf("after concurrent feedback: %+v", s)
	}
}

// The factory registers the gate's windows on Env.Metrics (the generic
// parameters' wrapper around the gate changes nothing): one series per
// band, labelled by band and by the gate label the registerer adds.
func TestFactoryRegistersWindows(t *testing.T) {
	reg := prometheus.NewRegistry()
	env := gate.Env{Metrics: prometheus.WrapRegistererWith(prometheus.Labels{"gate": "aimd#1"}, reg)}
	g, err := build(t, `{"refresh_interval":"50ms"}`, env)
	if err != nil {
		t.Fatal(err)
	}
	if _, direct := g.(*aimd.Gate); direct {
		t.Fatal("refresh_interval did not wrap the gate; the test checks nothing")
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	for _, name := range []string{"sluice_gate_window", "sluice_gate_window_ssthresh", "sluice_gate_window_inflight", "sluice_gate_window_closed"} {
		if n := len(byName[name].GetMetric()); n != aimd.NumBands {
			t.Errorf("%s: %d series, want %d", name, n, aimd.NumBands)
		}
	}
	found := false
	for _, m := range byName["sluice_gate_window"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["gate"] != "aimd#1" || len(labels) != 2 {
			t.Errorf("labels %v, want gate=aimd#1 and band", labels)
		}
		if labels["band"] == "overflow-batch" {
			found = true
			if v := m.GetGauge().GetValue(); v != 1 {
				t.Errorf("overflow-batch window %v, want 1", v)
			}
		}
	}
	if !found {
		t.Error("no overflow-batch window series")
	}
	if gate.IntervalOf(g) != 50*time.Millisecond {
		t.Errorf("interval %v", gate.IntervalOf(g))
	}
}

// A coupled decrease of an idle band shrinks its window but keeps its
// slow start; a band in use loses it as on its own rejection.
func TestCoupledDecreaseOfAnIdleBand(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 8})
	async := req(wire.ClassOverflow, wire.TierAsync) // band 4, in use
	f.admitN(async, 1)[0].Release()
	answer(f.admitN(req(wire.ClassOverflow, wire.TierInteractive), 1)[0], 429, 0, reason, saturated) // band 3
	if s := f.band(4); s.Window != 4 || s.SSThresh != 4 {
		t.Errorf("band in use after a coupled decrease: %+v, want window and ssthresh 4", s)
	}
	if s := f.band(5); s.Window != 4 || s.SSThresh != aimd.DefaultMaxWindow {
		t.Errorf("idle band after a coupled decrease: %+v, want window 4, ssthresh kept", s)
	}
	// Its traffic starts: slow start, +1 per answer.
	answerAll(f.admitN(batch, 4), 200)
	f.wantWindow(5, 8)
}

// A Retry-After closes the idle bands below too, but they keep their
// ssthresh: they reopen in slow start.
func TestRetryAfterClosesAnIdleBandKeepingSlowStart(t *testing.T) {
	f := newFixture(t, aimd.Config{InitialWindow: 8})
	answer(f.admitN(req(wire.ClassOverflow, wire.TierInteractive), 1)[0], 429, time.Second, reason, saturated)
	if s := f.band(3); !s.Closed || s.Window != 1 || s.SSThresh != 4 {
		t.Errorf("rejecting band: %+v, want closed, window 1, ssthresh 4", s)
	}
	if s := f.band(5); !s.Closed || s.Window != 1 || s.SSThresh != aimd.DefaultMaxWindow {
		t.Errorf("idle band below: %+v, want closed, window 1, ssthresh kept", s)
	}
}
