package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/promql"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/gates/tieradmission"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

const (
	mtPool    = "shared"
	mtWorkers = 10
	mtMetric  = "inference_extension_flow_control_pool_saturation"
	// mtQuery: saturation 0.8 or more closes the pool (budget 0).
	mtQuery = `clamp(1 - max(` + mtMetric + `{inference_pool="pool-a"}) / 0.8, 0, 1)`
	// mtCacheTTL is how long sluice reuses a Prometheus answer.
	mtCacheTTL = 100 * time.Millisecond
)

// mtLimit is each tenant's quota on tier: requests at a time.
func mtLimit(tier string) int {
	if tier == wire.TierInteractive {
		return 2
	}
	return 1
}

// TestMultiTenantSaturation runs the multi-tenant scenario (issue 13, item
// 7) with real servers: a redis-server holds the tenants' quotas, and a
// Prometheus scrapes the pool's saturation gauge, which the test drives.
//
//	queue gates  redis-quota, classifying, concurrency mode, keyed on metadata
//	             userid, one counter per tenant and tier (prefix quota:<tier>:):
//	             interactive 2, async 1, batch 1 requests at a time
//	pool         "shared": 10 workers for the three tier queues, tier-priority
//	pool gate    tier-priority-admission over prometheus-query
//
// It saturates the pool and checks, per tenant and tier, that reserved
// requests wait (no re-queue, no error) and are dispatched once the pool
// frees, that interactive overflow is answered with upstream's 429 payload,
// that async and batch overflow is deferred, comes back and is answered
// OK, and that freed workers go to the lanes in order (the gateway records
// the priority header of each call). The gateway holds every call until the
// test lets it answer, so the order is exact.
//
// Every count is exact but one: how often a deferred request was deferred
// before the workers were all taken (each deferral re-queues it for 1 ms);
// the test checks that each deferral was one more pass through the quota
// gate and one quota_exhausted decision.
//
// Concurrency mode, not rate-limit: a reserved request keeps its tenant's
// slot while it waits for the saturated pool, so a tenant cannot stack more
// reserved work on it than its quota, and deferred work is classified again
// on each pass. The slots come back when the requests end, so the test
// checks at the end that Redis holds exactly what it held before. No request
// ends while the pool is saturated, so the classifications are exact; in
// rate-limit mode they would depend on the window's clock too.
//
// redis-quota has one limit per gate (as upstream's), shared by the tenants
// of the queue. Carol's interactive quota is smaller here because another
// replica (an upstream one during a cut-over, say, which keeps only the
// counter) holds one of her two slots: the quota is Redis', not the
// process'.
func TestMultiTenantSaturation(t *testing.T) {
	start := time.Now()
	ctx := context.Background()
	rd := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, rd.URL)
	gauges := testenv.StartGauges(t)
	gauges.Set(mtMetric, 0, "inference_pool", "pool-a")
	prom := testenv.StartPrometheus(t, []string{gauges.URL()}, 200*time.Millisecond)
	// Carol holds one of her two interactive slots on another replica.
	if err := rc.Set(ctx, quotaKey(wire.TierInteractive, "carol"), 1, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	gw := newSteppedGateway(t)
	rec := &gateRecorder{events: map[string][]gateEvent{}}
	reg := prometheus.NewRegistry()
	h := startAppWith(t, multiTenantConfig(t, rd.Addr, prom.URL, gw.url), Options{
		Adapters: multiTenantAdapters(t, rec), Transport: memory.New(memory.Options{}), Registry: reg})

	// The pool gate's budget is read (not saturated yet).
	waitFor(t, func() bool {
		return metricValue(t, reg, "sluice_gate_budget", map[string]string{"gate": "pool:" + mtPool}) == 1
	}, 10*time.Second)

	// Saturate the pool. The pool gate's refresh loop and its per-request
	// decisions share the Prometheus client's cache: once the loop reports
	// budget 0, every decision sees the pool saturated.
	gauges.Set(mtMetric, 0.9, "inference_pool", "pool-a")
	waitFor(t, func() bool { v, ok := promValue(t, prom.URL, mtQuery); return ok && v == 0 }, 10*time.Second)
	waitFor(t, func() bool {
		return metricValue(t, reg, "sluice_gate_budget", map[string]string{"gate": "pool:" + mtPool}) == 0
	}, 10*time.Second)

	// Phase A, saturated. Per tenant and tier: reserved (R) within the quota,
	// overflow (O) beyond it.
	//   alice: interactive R R,    batch R O
	//   bob:   interactive R R O,  async R O
	//   carol: interactive R O O,  batch R        (one interactive slot held elsewhere)
	// R waits at the pool gate holding a worker (8 of 10), interactive O is
	// answered 429, async and batch O are deferred and come back.
	c := &tenantClient{h: h, next: map[string]int{}}
	var ids []string
	st := mtState{rec: rec, gw: gw, ids: &ids}
	ids = append(ids, c.send(t, "alice", wire.TierInteractive, 2)...)
	ids = append(ids, c.send(t, "alice", wire.TierBatch, 2)...)
	ids = append(ids, c.send(t, "bob", wire.TierInteractive, 3)...)
	ids = append(ids, c.send(t, "bob", wire.TierAsync, 2)...)
	ids = append(ids, c.send(t, "carol", wire.TierInteractive, 3)...)
	ids = append(ids, c.send(t, "carol", wire.TierBatch, 1)...)
	st.wait(t, "phase A: 8 waiting, 3 rejected, 2 deferred", func() bool {
		return rec.count(ids, firstPoolVerdict(gate.Wait)) == 8 && rec.count(ids, firstPoolVerdict(gate.Reject)) == 3 &&
			rec.count(ids, firstPoolVerdict(gate.Defer)) == 2
	}, 10*time.Second)
	rejected := h.waitResults(3, 5*time.Second)
	if len(rejected) != 3 {
		t.Fatalf("%d results while saturated, want the 3 rejections", len(rejected))
	}

	// Phase B, still saturated. Alice's and Carol's first async requests are
	// reserved: they take the last two workers and wait too. From then on no
	// worker is free, so the deferred requests, coming back, wait in their
	// lanes, and so do two late arrivals that no worker can take to the pool
	// gate: Bob's first batch request (reserved, lane 2) and his fourth
	// interactive one (overflow, lane 3; not answered 429, as upstream: only
	// a worker asks the pool gate).
	fillers := append(c.send(t, "alice", wire.TierAsync, 1), c.send(t, "carol", wire.TierAsync, 1)...)
	ids = append(ids, fillers...)
	st.wait(t, "phase B: the two async requests wait", func() bool { return rec.count(fillers, firstPoolVerdict(gate.Wait)) == 2 }, 10*time.Second)
	late := append(c.send(t, "bob", wire.TierBatch, 1), c.send(t, "bob", wire.TierInteractive, 1)...)
	ids = append(ids, late...)
	deferred := rec.matching(ids, firstPoolVerdict(gate.Defer))
	st.wait(t, "phase B: every request claimed, the late and deferred ones in their lanes", func() bool {
		return c.claimedAll(t) && rec.count(late, queuePasses(1)) == 2 && rec.count(deferred, backInLane) == 2
	}, 10*time.Second)
	if n := gw.count(); n != 0 {
		t.Fatalf("%d requests dispatched while the pool was saturated", n)
	}

	// Phase C: the pool frees. The ten waiting reserved requests are asked
	// again and dispatched (the stepped gateway holds them, so they keep
	// their workers); everything else waits in its lane.
	gauges.Set(mtMetric, 0.1, "inference_pool", "pool-a")
	st.wait(t, "phase C: the waiting requests dispatched", func() bool { return gw.count() == mtWorkers }, 10*time.Second)
	parked := rec.matching(ids, firstPoolVerdict(gate.Wait))
	if got := gw.ids(0, mtWorkers); !sameSet(got, parked) {
		t.Errorf("dispatched first %v, want the reserved requests that waited %v", got, parked)
	}

	// Phase D: free one worker at a time; each goes to the lowest lane.
	tail := len(late) + len(deferred) // 4
	for i := range tail {
		gw.permit(1)
		st.wait(t, "phase D: the next lane's request dispatched", func() bool { return gw.count() == mtWorkers+i+1 }, 10*time.Second)
	}
	if got, want := gw.lanes(mtWorkers, mtWorkers+tail), "2345"; got != want || !sameSet(gw.ids(mtWorkers, mtWorkers+tail), slices.Concat(late, deferred)) {
		t.Errorf("requests that waited for a worker, in dispatch order: %v in lanes %s; want %v and %v in lanes %s",
			gw.ids(mtWorkers, mtWorkers+tail), got, late, deferred, want)
	}
	gw.permit(len(ids))
	res := h.waitResults(len(ids), 10*time.Second)
	t.Logf("scenario ran in %v", time.Since(start).Round(time.Millisecond))

	checkMultiTenantOutcome(t, ids, res, rejected, rec, gw)
	checkPoolDecisions(t, reg, rec, ids)
	// Every slot taken was given back: Redis holds what it held before.
	st.wait(t, "every slot given back", func() bool { return quotaCounters(t, rc) == "interactive/carol=1" }, 5*time.Second)
}

// checkMultiTenantOutcome checks each request's path through the gates, its
// dispatch and its result, and the counts per tenant and tier.
func checkMultiTenantOutcome(t *testing.T, ids []string, res, rejected map[string]*wire.Result, rec *gateRecorder, gw *steppedGateway) {
	t.Helper()
	type key struct{ tenant, tier string }
	counts := map[key]map[string]int{}
	for _, id := range ids {
		tenant, tier := splitID(id)
		ev := rec.of(id)
		queue, pool := split(ev)
		r := res[id]
		if len(queue) == 0 || len(pool) == 0 || r == nil {
			t.Errorf("%s: gates %v, result %+v: want both gates asked and a result", id, ev, r)
			continue
		}
		var outcome string
		switch first := pool[0].verdict; {
		case first == gate.Wait:
			// Reserved, waited at the gate holding a worker: never re-queued,
			// never answered with an error, dispatched once the pool freed.
			outcome = "waited"
			if len(queue) != 1 || queue[0].class != wire.ClassReserved || pool[len(pool)-1].verdict != gate.Admit ||
				countVerdict(pool, gate.Wait) != len(pool)-1 {
				t.Errorf("%s: gates %v, want reserved once, then wait… admit", id, ev)
			}
		case first == gate.Reject:
			// Interactive overflow: upstream's 429 payload, no status, no code.
			outcome = "429"
			if len(queue) != 1 || queue[0].class != wire.ClassOverflow || len(pool) != 1 || tier != wire.TierInteractive {
				t.Errorf("%s: gates %v, want overflow once, then reject", id, ev)
			}
			if r.Payload != tieradmission.TooManyRequests || r.StatusCode != 0 || r.ErrorCode != wire.CodeNone || rejected[id] == nil {
				t.Errorf("%s: result %+v, want upstream's 429 payload, no status, no code (answered while saturated)", id, r)
			}
			if gw.dispatched(id) {
				t.Errorf("%s: rejected, yet dispatched", id)
			}
		case first == gate.Defer:
			// Overflow async or batch: re-queued (each deferral one more pass
			// through the quota gate, still overflow), then dispatched.
			outcome = "deferred"
			n := countVerdict(pool, gate.Defer)
			if n != len(pool)-1 || pool[len(pool)-1].verdict != gate.Admit || len(queue) != n+1 ||
				slices.ContainsFunc(queue, func(e gateEvent) bool { return e.class != wire.ClassOverflow }) {
				t.Errorf("%s: gates %v, want overflow, defer, (overflow, defer)…, overflow, admit", id, ev)
			}
		default:
			// Arrived once every worker waited: admitted when the pool freed.
			outcome = "late"
			if len(queue) != 1 || len(pool) != 1 || pool[0].verdict != gate.Admit {
				t.Errorf("%s: gates %v, want one pass, then admit", id, ev)
			}
		}
		if outcome != "429" && (!r.OK() || r.StatusCode != http.StatusOK || !gw.dispatched(id)) {
			t.Errorf("%s (%s): result %+v, dispatched %v; want OK", id, outcome, r, gw.dispatched(id))
		}
		if lane, class := gw.lane(id), lastClass(queue); outcome != "429" && lane != laneOf(class, tier) {
			t.Errorf("%s: dispatched in lane %s, want %s (%s %s)", id, lane, laneOf(class, tier), class, tier)
		}
		if outcome != "429" && gw.tenant(id) != tenant {
			t.Errorf("%s: fairness header %q, want %q", id, gw.tenant(id), tenant)
		}
		k := key{tenant, tier}
		if counts[k] == nil {
			counts[k] = map[string]int{}
		}
		counts[k][outcome]++
	}
	want := map[key]map[string]int{
		{"alice", wire.TierInteractive}: {"waited": 2},
		{"alice", wire.TierAsync}:       {"waited": 1},
		{"alice", wire.TierBatch}:       {"waited": 1, "deferred": 1},
		{"bob", wire.TierInteractive}:   {"waited": 2, "429": 1, "late": 1},
		{"bob", wire.TierAsync}:         {"waited": 1, "deferred": 1},
		{"bob", wire.TierBatch}:         {"late": 1},
		{"carol", wire.TierInteractive}: {"waited": 1, "429": 2},
		{"carol", wire.TierAsync}:       {"waited": 1},
		{"carol", wire.TierBatch}:       {"waited": 1},
	}
	if got, w := fmt.Sprint(counts), fmt.Sprint(want); got != w {
		t.Errorf("outcomes per tenant and tier:\n got %s\nwant %s", got, w)
	}
	if n := gw.count(); n != len(ids)-3 {
		t.Errorf("%d calls to the gateway, want %d (each request but the 429s once)", n, len(ids)-3)
	}
}

// checkPoolDecisions checks upstream's decision counters of the pool gate:
// a waiting request counts once, a rejection once, each deferral once.
func checkPoolDecisions(t *testing.T, reg *prometheus.Registry, rec *gateRecorder, ids []string) {
	t.Helper()
	defers := 0
	for _, id := range ids {
		_, pool := split(rec.of(id))
		defers += countVerdict(pool, gate.Defer)
	}
	t.Logf("the 2 deferred requests were deferred %d times in all", defers)
	for reason, want := range map[string]int{"gate_closed": 8 + 2, "dropped": 3, "quota_exhausted": defers} {
		labels := map[string]string{"queue_id": "", "queue_name": "", "pool_name": mtPool, "reason": reason}
		if got := metricValue(t, reg, "llm_d_async_async_gate_decisions_total", labels); got != float64(want) {
			t.Errorf("pool gate decisions %s = %v, want %d", reason, got, want)
		}
	}
}

// multiTenantConfig is the deployment: three tier queues in one pool.
func multiTenantConfig(t *testing.T, redisAddr, promURL, gwURL string) *config.Config {
	t.Helper()
	raw := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var queues []config.Queue
	for _, tier := range []string{wire.TierInteractive, wire.TierAsync, wire.TierBatch} {
		queues = append(queues, config.Queue{
			Queue:        transport.Queue{Name: "requests-" + tier},
			IGWBaseURL:   gwURL,
			WorkerPoolID: mtPool,
			Labels:       map[string]string{"tier": tier},
			GateType:     redisquota.Type,
			GateParams: map[string]json.RawMessage{
				"address": raw(redisAddr), "attribute": raw("userid"), "mode": raw("concurrency"),
				"gating_mode": raw("classifying"), "limit": raw(mtLimit(tier)), "prefix": raw("quota:" + tier + ":"),
			},
		})
	}
	return &config.Config{
		Transport: memory.Name, MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
		RequestTimeout: config.Duration(time.Minute),
		Prometheus:     config.Prometheus{URL: promURL, CacheTTL: config.Duration(mtCacheTTL)},
		WorkerPools: []config.WorkerPool{{ID: mtPool, Workers: mtWorkers, GateType: tieradmission.Type,
			GateParams: map[string]json.RawMessage{
				"saturation_gate":        raw(promql.Type),
				"saturation_gate_params": raw(map[string]any{"query": mtQuery, "pool": "pool-a"}),
			}}},
		MergePolicy: config.MergePolicy{Type: config.PolicyTierPriority,
			Parameters: raw(map[string]string{"priority_header": "x-gateway-priority", "fairness_attribute": "userid"})},
		TransportConfig: config.TransportConfig{ResultQueueName: e2eResults, Queues: queues},
	}
}

// multiTenantAdapters registers the real gates, the queue's and the pool's
// wrapped so that rec sees each decision.
func multiTenantAdapters(t *testing.T, rec *gateRecorder) Adapters {
	t.Helper()
	ad := testAdapters(t)
	quota := redisquota.NewFactory()
	for typ, f := range map[string]gate.Factory{
		redisquota.Type:    rec.wrap("queue", quota),
		tieradmission.Type: rec.wrap("pool", tieradmission.Factory),
		promql.Type:        promql.Factory,
	} {
		if err := ad.Gates.Register(typ, f); err != nil {
			t.Fatal(err)
		}
	}
	return ad
}

// mtState dumps what the gates decided and the gateway saw, when a wait
// of the scenario times out.
type mtState struct {
	rec *gateRecorder
	gw  *steppedGateway
	ids *[]string
}

// wait waits until cond holds, or fails t naming what it waited for.
func (st mtState) wait(t *testing.T, what string, cond func() bool, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, id := range *st.ids {
				fmt.Fprintf(&b, "\n  %s: %v", id, st.rec.of(id))
			}
			st.gw.mu.Lock()
			fmt.Fprintf(&b, "\n  gateway: %v", st.gw.arrivals)
			st.gw.mu.Unlock()
			t.Fatalf("%s: not within %v; gate decisions so far:%s", what, within, b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tenantClient enqueues the tenants' requests.
type tenantClient struct {
	h    *harness
	next map[string]int // tenant-tier → the next request's number
}

// send enqueues n requests of tenant on tier's queue, with ids
// tenant-tier-i (i counting from 0 per tenant and tier), and returns the ids.
func (c *tenantClient) send(t *testing.T, tenant, tier string, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		id := tenant + "-" + tier + "-" + strconv.Itoa(c.next[tenant+"-"+tier])
		c.next[tenant+"-"+tier]++
		b := fmt.Appendf(nil, `{"id":%q,"deadline":%d,"payload":{"prompt":"hi"},"metadata":{"userid":%q},"headers":{"x-test-id":%q}}`,
			id, time.Now().Add(time.Minute).Unix(), tenant, id)
		if err := c.h.mem.Enqueue("requests-"+tier, b); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// claimedAll says every request was taken from its queue (none waits in
// the broker or its delay set).
func (c *tenantClient) claimedAll(t *testing.T) bool {
	t.Helper()
	for _, tier := range []string{wire.TierInteractive, wire.TierAsync, wire.TierBatch} {
		d, err := c.h.mem.Depth(context.Background(), transport.Queue{Name: "requests-" + tier})
		if err != nil {
			t.Fatal(err)
		}
		if d.Waiting+d.Delayed != 0 {
			return false
		}
	}
	return true
}

// quotaKey is the concurrency counter of tenant on tier (upstream's key).
func quotaKey(tier, tenant string) string { return "quota:" + tier + ":userid:" + tenant }

// quotaCounters lists, sorted, the quota counters above 0 ("tier/tenant=n")
// and the slots sluice holds (the members of its lease sets).
func quotaCounters(t *testing.T, rc *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	keys, err := rc.Keys(ctx, "quota:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, k := range keys {
		if strings.HasSuffix(k, redisquota.LeaseSuffix) {
			if n := rc.ZCard(ctx, k).Val(); n > 0 {
				held = append(held, fmt.Sprintf("%s=%d leases", k, n))
			}
			continue
		}
		n, err := rc.Get(ctx, k).Int()
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if n != 0 {
			tier, tenant, _ := strings.Cut(strings.TrimPrefix(k, "quota:"), ":userid:")
			held = append(held, fmt.Sprintf("%s/%s=%d", tier, tenant, n))
		}
	}
	slices.Sort(held)
	return strings.Join(held, ",")
}

// promValue runs an instant query and returns its first sample.
func promValue(t *testing.T, base, query string) (float64, bool) {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || len(body.Data.Result) == 0 {
		return 0, false
	}
	s, _ := body.Data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

// gateEvent is one decision of a gate about a request.
type gateEvent struct {
	gate    string // "queue" or "pool"
	verdict gate.Verdict
	class   string // the request's classification after the decision
	err     error
}

func (e gateEvent) String() string {
	s := e.gate + ":" + e.verdict.String()
	if e.class != "" {
		s += "(" + e.class + ")"
	}
	if e.err != nil {
		s += "!" + e.err.Error()
	}
	return s
}

// gateRecorder records every decision of the gates it wraps, by request.
type gateRecorder struct {
	mu     sync.Mutex
	events map[string][]gateEvent
}

// wrap returns a factory of f's gates, recorded under name.
func (r *gateRecorder) wrap(name string, f gate.Factory) gate.Factory {
	return func(p gate.Params, env gate.Env) (gate.Gate, error) {
		g, err := f(p, env)
		if err != nil {
			return nil, err
		}
		return &recordedGate{Gate: g, adm: gate.AdmitterOf(g), name: name, rec: r}, nil
	}
}

func (r *gateRecorder) of(id string) []gateEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events[id])
}

// matching returns the ids whose decisions so far satisfy cond.
func (r *gateRecorder) matching(ids []string, cond func([]gateEvent) bool) []string {
	var out []string
	for _, id := range ids {
		if cond(r.of(id)) {
			out = append(out, id)
		}
	}
	return out
}

func (r *gateRecorder) count(ids []string, cond func([]gateEvent) bool) int {
	return len(r.matching(ids, cond))
}

// recordedGate is a gate whose per-request decisions are recorded; it
// forwards what the pipeline reads of the gate it wraps.
type recordedGate struct {
	gate.Gate
	adm  gate.Admitter
	name string
	rec  *gateRecorder
}

func (g *recordedGate) Admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	d, err := g.adm.Admit(ctx, req)
	g.rec.mu.Lock()
	g.rec.events[req.ID] = append(g.rec.events[req.ID], gateEvent{gate: g.name, verdict: d.Verdict, class: req.Classification(), err: err})
	g.rec.mu.Unlock()
	return d, err
}

func (g *recordedGate) RefreshInterval() time.Duration    { return gate.IntervalOf(g.Gate) }
func (g *recordedGate) FailurePolicy() gate.FailurePolicy { return gate.PolicyOf(g.Gate) }
func (g *recordedGate) Unwrap() gate.Gate                 { return g.Gate }

func (g *recordedGate) Close() error {
	if c, ok := g.Gate.(interface{ Close() error }); ok {
		return c.Close()
	}
	return nil
}

// split returns the queue gate's and the pool gate's decisions.
func split(ev []gateEvent) (queue, pool []gateEvent) {
	for _, e := range ev {
		if e.gate == "queue" {
			queue = append(queue, e)
		} else {
			pool = append(pool, e)
		}
	}
	return queue, pool
}

// firstPoolVerdict: the pool gate's first decision was v.
func firstPoolVerdict(v gate.Verdict) func([]gateEvent) bool {
	return func(ev []gateEvent) bool {
		_, pool := split(ev)
		return len(pool) > 0 && pool[0].verdict == v
	}
}

// queuePasses: the request passed the queue gate n times.
func queuePasses(n int) func([]gateEvent) bool {
	return func(ev []gateEvent) bool { q, _ := split(ev); return len(q) == n }
}

// backInLane: a deferred request passed the queue gate after its last
// deferral (it waits for a worker, or is past the lanes).
func backInLane(ev []gateEvent) bool {
	return len(ev) > 0 && ev[len(ev)-1].gate == "queue"
}

func countVerdict(ev []gateEvent, v gate.Verdict) int {
	n := 0
	for _, e := range ev {
		if e.verdict == v {
			n++
		}
	}
	return n
}

func lastClass(queue []gateEvent) string {
	if len(queue) == 0 {
		return ""
	}
	return queue[len(queue)-1].class
}

// laneOf is the tier-priority lane of a request: class×3 + tier.
func laneOf(class, tier string) string {
	lane := map[string]int{wire.TierInteractive: 0, wire.TierAsync: 1, wire.TierBatch: 2}[tier]
	if class != wire.ClassReserved {
		lane += 3
	}
	return strconv.Itoa(lane)
}

// splitID returns the tenant and tier of an id tenant-tier-i.
func splitID(id string) (tenant, tier string) {
	parts := strings.Split(id, "-")
	return parts[0], parts[1]
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// steppedGateway holds every call until the test permits it to answer, and
// records each call's arrival: request id, priority header (the lane) and
// fairness header (the tenant).
type steppedGateway struct {
	url     string
	permits chan struct{}

	mu       sync.Mutex
	arrivals []gwArrival
}

type gwArrival struct{ id, lane, tenant string }

func newSteppedGateway(t *testing.T) *steppedGateway {
	g := &steppedGateway{permits: make(chan struct{}, 1000)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "PRI" {
			return // dispatch.protocol auto's h2c preface (see flow_test.go)
		}
		// Read the body first: only then does the server notice a client
		// that gives up (r.Context ends), e.g. sluice shutting down after a
		// failed check.
		_, _ = io.Copy(io.Discard, r.Body)
		g.mu.Lock()
		g.arrivals = append(g.arrivals, gwArrival{r.Header.Get("x-test-id"), r.Header.Get("x-gateway-priority"),
			r.Header.Get("x-llm-d-inference-fairness-id")})
		g.mu.Unlock()
		select {
		case <-g.permits:
			_, _ = w.Write([]byte(`{"choices":[]}`))
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	g.url = srv.URL
	return g
}

// permit lets n held calls answer.
func (g *steppedGateway) permit(n int) {
	for range n {
		g.permits <- struct{}{}
	}
}

func (g *steppedGateway) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.arrivals)
}

// ids returns the ids of arrivals [from, to).
func (g *steppedGateway) ids(from, to int) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, a := range g.arrivals[from:to] {
		out = append(out, a.id)
	}
	return out
}

// lanes returns the lanes of arrivals [from, to), in arrival order.
func (g *steppedGateway) lanes(from, to int) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var b strings.Builder
	for _, a := range g.arrivals[from:to] {
		b.WriteString(a.lane)
	}
	return b.String()
}

func (g *steppedGateway) find(id string) (gwArrival, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, found := 0, gwArrival{}
	for _, a := range g.arrivals {
		if a.id == id {
			n++
			found = a
		}
	}
	return found, n
}

// dispatched says id reached the gateway exactly once.
func (g *steppedGateway) dispatched(id string) bool { _, n := g.find(id); return n == 1 }

func (g *steppedGateway) lane(id string) string   { a, _ := g.find(id); return a.lane }
func (g *steppedGateway) tenant(id string) string { a, _ := g.find(id); return a.tenant }
