package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/pipeline"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The flow-control scenario: one worker pool of fcWorkers workers serving
// three redis-sortedset queues, one per tier (queue labels {"tier": ...}),
// with a backlog of fcPerQueue requests each, against a 0-ms simulated
// gateway and a real redis-server. Two setups, alternated run by run:
//
//   - flow: the tier-priority merge policy, and a redis-quota gate in
//     classifying mode on each queue (rate-limit, fcLimit requests per
//     tenant per minute), so requests within their tenant's quota are
//     reserved and the others overflow, and each waits for a worker in one
//     of the six lanes;
//   - baseline: the same pool, queues and load with the random-robin policy
//     and no gate (constant).
//
// The order check watches the flow setup's lanes through
// pipeline.Pipeline.ObserveLanes and replays their steps (checkOrder): a
// violation is a worker granted to a request while a request of a strictly
// lower lane had been waiting longer. A control run splits the pool into
// one pool per queue (each queue's lanes then see no other queue: the
// lanes are bypassed across tiers) and runs the same check over the three
// pools' steps merged, to show that the check does fail when priority is
// not enforced. The gateway reads the priority and fairness headers of every
// request and checks each lane against the request's tier and its tenant's
// quota (lane_errors).

const (
	fcPool         = "flow"
	fcWorkers      = 64
	fcQueueMax     = 64 // each queue's max_concurrency: up to 3 × 64 claimed for 64 workers
	fcPerQueue     = 8000
	fcLimit        = 100 // requests per tenant per window
	fcSmallTenants = 50  // per tier: fcPerQueue/2/50 = 80 requests each, all within quota
	fcBigTenants   = 4   // per tier: 1,000 requests each, fcLimit reserved and the rest overflow
	fcPriority     = "x-gateway-priority"
	fcResults      = "llm-d-async:results:flow-control"
)

// fcTiers are the tiers, one queue each, in lane order.
var fcTiers = [3]string{wire.TierInteractive, wire.TierAsync, wire.TierBatch}

func fcQueue(tier string) string { return rss.RequestQueueName("fc-" + tier) }

// fcTenant is the tenant (metadata.userid) of request i of a tier: even
// requests go to small tenants in turn (all within their quota: reserved),
// odd ones to big tenants in turn (the first fcLimit of each reserved, the
// rest overflow), so every stretch of the backlog holds both classes.
func fcTenant(tier string, i int) string {
	if i%2 == 0 {
		return tier + "-s" + strconv.Itoa(i/2%fcSmallTenants)
	}
	return tier + "-b" + strconv.Itoa(i/2%fcBigTenants)
}

// fcSetup is one deployment of the scenario.
type fcSetup struct {
	name     string
	priority bool // the tier-priority policy (false: random-robin)
	quota    bool // a redis-quota gate on each queue (false: none)
	split    bool // the control: one pool per queue
}

// fcRun is what one run measured.
type fcRun struct {
	rate        float64 // ok results per second
	failed      int     // results other than a first 200, and results missing
	cpuUS       float64 // this process's CPU (sluice, gateway, bench) per request
	redisCmds   float64 // Redis commands per request (the bench's own polls excluded)
	redisReads  float64 // Redis read events per request: about one per round trip
	redisCPUUS  float64 // redis-server's CPU per request
	check       orderCheck
	laneErrors  int64
	gatewayLane [pipeline.NumLanes]int64
}

// flowControlTargets: what upstream's flow control may cost, and the order
// check, which must hold on the flow setup and fail on the control.
func flowControlTargets() []target {
	return []target{
		minimum("ratio", 0.80, "tier-priority lanes and a classifying redis-quota gate against random-robin without a gate"),
		exactly("order_violations", 0, "no grant while an older request of a lower lane waits"),
		exactly("lane_errors", 0, "every request reaches the gateway in the lane its tier and quota call for"),
		minimum("control_violations", 1, "the control bypasses the lanes across tiers: a check that finds nothing there cannot fail"),
		noFailures("failed"),
		noFailures("baseline_failed"),
	}
}

// runFlowControl: see the notes above.
func runFlowControl(ctx context.Context, o options) (figures, error) {
	rs, err := startRedis()
	if err != nil {
		return nil, err
	}
	defer rs.Stop()
	gw, err := startFCGateway()
	if err != nil {
		return nil, err
	}
	defer gw.close()
	p, err := producer.Dial(rs.URL, producer.Config{})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	reqs := fcRequests(time.Now().Add(time.Hour))
	n := len(fcTiers) * fcPerQueue

	flow := fcSetup{name: "flow", priority: true, quota: true}
	base := fcSetup{name: "baseline"}
	setups := []fcSetup{flow, base}
	if os.Getenv("SLUICE_BENCH_FLOW_PARTS") != "" {
		setups = append(setups, fcSetup{name: "priority-only", priority: true}, fcSetup{name: "quota-only", quota: true})
	}
	all := map[string][]fcRun{}
	// The baseline is the last side: flow first on odd runs, the baseline
	// first on even ones.
	sides := make([]side, 0, len(setups))
	for _, s := range append(slices.Delete(slices.Clone(setups), 1, 2), base) {
		sides = append(sides, func(ctx context.Context, i int) error {
			r, err := fcMeasure(ctx, s, rs, p, gw, reqs, n)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			fmt.Fprintf(os.Stderr, "flow-control run %d/%d %s\n", i+1, o.runs, r.describe(s))
			all[s.name] = append(all[s.name], r)
			return nil
		})
	}
	if err := alternate(ctx, o.runs, sides...); err != nil {
		return nil, err
	}
	rates := func(setup string) []float64 {
		var xs []float64
		for _, r := range all[setup] {
			xs = append(xs, r.rate)
		}
		return xs
	}
	failed := func(setup string) float64 {
		n := 0
		for _, r := range all[setup] {
			n += r.failed
		}
		return float64(n)
	}
	control, err := fcMeasure(ctx, fcSetup{name: "control", priority: true, quota: true, split: true}, rs, p, gw, reqs, n)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	fmt.Fprintf(os.Stderr, "flow-control %s\n", control.describe(fcSetup{name: "control (one pool per queue)", priority: true}))

	med := func(setup string, f func(fcRun) float64) float64 {
		var xs []float64
		for _, r := range all[setup] {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	rate := func(r fcRun) float64 { return r.rate }
	var violations, strict, laneErrors float64
	for _, r := range all[flow.name] {
		violations += float64(r.check.violations)
		strict += float64(r.check.strict)
		laneErrors += float64(r.laneErrors)
	}
	f := figures{
		"requests":                          float64(n),
		"throughput":                        med(flow.name, rate),
		"baseline":                          med(base.name, rate),
		"ratio":                             medianRatio(rates(flow.name), rates(base.name)),
		"failed":                            failed(flow.name),
		"baseline_failed":                   failed(base.name),
		"order_violations":                  violations,
		"order_violations_strict":           strict,
		"lane_errors":                       laneErrors,
		"control_violations":                float64(control.check.violations),
		"waited_share":                      med(flow.name, func(r fcRun) float64 { return float64(r.check.waited) / float64(n) }),
		"cpu_us_per_request":                med(flow.name, func(r fcRun) float64 { return r.cpuUS }),
		"baseline_cpu_us_per_request":       med(base.name, func(r fcRun) float64 { return r.cpuUS }),
		"redis_cmds_per_request":            med(flow.name, func(r fcRun) float64 { return r.redisCmds }),
		"baseline_redis_cmds_per_request":   med(base.name, func(r fcRun) float64 { return r.redisCmds }),
		"redis_reads_per_request":           med(flow.name, func(r fcRun) float64 { return r.redisReads }),
		"baseline_redis_reads_per_request":  med(base.name, func(r fcRun) float64 { return r.redisReads }),
		"redis_cpu_us_per_request":          med(flow.name, func(r fcRun) float64 { return r.redisCPUUS }),
		"baseline_redis_cpu_us_per_request": med(base.name, func(r fcRun) float64 { return r.redisCPUUS }),
	}
	for _, s := range setups[2:] { // SLUICE_BENCH_FLOW_PARTS
		f[s.name+"_throughput"] = med(s.name, rate)
		f[s.name+"_ratio"] = medianRatio(rates(s.name), rates(base.name))
		f[s.name+"_cpu_us_per_request"] = med(s.name, func(r fcRun) float64 { return r.cpuUS })
		f[s.name+"_redis_cpu_us_per_request"] = med(s.name, func(r fcRun) float64 { return r.redisCPUUS })
	}
	return f, nil
}

func (r fcRun) describe(s fcSetup) string {
	line := fmt.Sprintf("%s: throughput=%.0f cpu_us_per_request=%.1f redis_cmds_per_request=%.2f redis_reads_per_request=%.2f redis_cpu_us_per_request=%.1f",
		s.name, r.rate, r.cpuUS, r.redisCmds, r.redisReads, r.redisCPUUS)
	if s.priority {
		line += fmt.Sprintf(" waited=%d order_violations=%d order_violations_strict=%d lane_errors=%d grants=%v gateway_lanes=%v",
			r.check.waited, r.check.violations, r.check.strict, r.laneErrors, r.check.grants, r.gatewayLane)
	}
	return line
}

// fcRequests builds each tier's backlog; deadlines 1 ms apart keep each
// queue in index order (the sorted set's score is the deadline).
func fcRequests(deadline time.Time) map[string][]*wire.Request {
	out := map[string][]*wire.Request{}
	payload := json.RawMessage(`{"model":"m","prompt":"What is 2+2?","max_tokens":16}`)
	for _, tier := range fcTiers {
		reqs := make([]*wire.Request, fcPerQueue)
		for i := range reqs {
			reqs[i] = &wire.Request{ID: tier + "-" + strconv.Itoa(i), Created: time.Now(),
				Deadline: deadline.Add(time.Duration(i) * time.Millisecond), Payload: payload,
				Metadata: map[string]string{"job_id": "flow-control", "userid": fcTenant(tier, i)}}
		}
		out[tier] = reqs
	}
	return out
}

// fcConfig is the deployment of setup s.
func fcConfig(s fcSetup, redisURL, redisAddr, gw string) *config.Config {
	cfg := &config.Config{
		Transport: rss.Name, MetricsPort: -1, HealthPort: -1, RedisURL: redisURL,
		DrainTimeout:    config.Duration(5 * time.Second),
		WorkerPools:     []config.WorkerPool{{ID: fcPool, Workers: fcWorkers}},
		TransportConfig: config.TransportConfig{ResultQueueName: fcResults},
	}
	if s.split {
		cfg.WorkerPools = nil
	}
	if s.priority {
		cfg.MergePolicy = config.MergePolicy{Type: config.PolicyTierPriority, Parameters: json.RawMessage(`{"priority_header":"` + fcPriority + `"}`)}
	}
	for _, tier := range fcTiers {
		q := config.Queue{Queue: transport.Queue{Name: fcQueue(tier), MaxConcurrency: fcQueueMax}, IGWBaseURL: gw, WorkerPoolID: fcPool,
			Labels: map[string]string{wire.DefaultTierLabel: tier}}
		if s.split {
			q.WorkerPoolID = fcPool + "-" + tier
			cfg.WorkerPools = append(cfg.WorkerPools, config.WorkerPool{ID: q.WorkerPoolID, Workers: fcWorkers / len(fcTiers)})
		}
		if s.quota {
			q.GateType = redisquota.Type
			q.GateParams = map[string]json.RawMessage{
				"address":     json.RawMessage(strconv.Quote(redisAddr)),
				"gating_mode": json.RawMessage(`"classifying"`),
				"mode":        json.RawMessage(`"rate-limit"`),
				"limit":       json.RawMessage(strconv.Itoa(fcLimit)),
				"window":      json.RawMessage(`"1m"`),
			}
		}
		cfg.TransportConfig.Queues = append(cfg.TransportConfig.Queues, q)
	}
	return cfg
}

// fcMeasure runs setup s once over a fresh backlog until every result is
// written.
func fcMeasure(ctx context.Context, s fcSetup, rs *testenv.Redis, p *producer.Producer, gw *fcGateway, reqs map[string][]*wire.Request, n int) (fcRun, error) {
	c := p.Client()
	if err := c.FlushDB(ctx).Err(); err != nil {
		return fcRun{}, err
	}
	for _, tier := range fcTiers {
		if err := p.EnqueueMany(ctx, fcQueue(tier), reqs[tier]); err != nil {
			return fcRun{}, err
		}
	}
	gw.reset()
	if dir := os.Getenv("SLUICE_BENCH_PROFILE"); dir != "" && !s.split {
		stop, err := fcProfile(dir, s.name)
		if err != nil {
			return fcRun{}, err
		}
		defer stop()
	}
	r0, err := redisStats(ctx, c)
	if err != nil {
		return fcRun{}, err
	}
	a, err := newApp(fcConfig(s, rs.URL, rs.Addr, gw.url), app.Options{})
	if err != nil {
		return fcRun{}, err
	}
	rec := &laneRecorder{}
	if s.priority {
		rec.events = make([]laneStep, 0, 2*n)
		pools := []string{fcPool}
		if s.split {
			pools = pools[:0]
			for _, tier := range fcTiers {
				pools = append(pools, fcPool+"-"+tier)
			}
		}
		for i, id := range pools {
			if !a.Pipeline().ObserveLanes(id, rec.observer(i)) {
				closed, cancel := context.WithCancel(ctx)
				cancel()
				_ = a.Run(closed) // closes what New opened
				return fcRun{}, fmt.Errorf("pool %s has no lanes", id)
			}
		}
		defer func() {
			for _, id := range pools {
				a.Pipeline().ObserveLanes(id, nil)
			}
		}()
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	start, cpu0 := time.Now(), cpuSeconds()
	go func() { runErr <- a.Run(rctx) }()
	if os.Getenv("SLUICE_BENCH_TRACE") != "" {
		stopTrace := fcTrace(a, rec, start)
		defer stopTrace()
	}
	polls, err := fcWait(ctx, c, n, runErr)
	elapsed, cpu := time.Since(start), cpuSeconds()-cpu0
	if err != nil {
		cancel()
		<-runErr
		return fcRun{}, err
	}
	r1, statsErr := redisStats(ctx, c)
	rec.stop()
	cancel()
	if err := <-runErr; err != nil {
		return fcRun{}, err
	}
	if statsErr != nil {
		return fcRun{}, statsErr
	}
	own := float64(polls + 1) // LLEN polls and the first INFO
	t, err := tallyLists(ctx, c, fcResults)
	if err != nil {
		return fcRun{}, err
	}
	r := fcRun{
		rate:       float64(t.ok) / elapsed.Seconds(),
		failed:     t.failed + max(0, n-t.total()),
		cpuUS:      cpu / float64(n) * 1e6,
		redisCmds:  (r1.cmds - r0.cmds - own) / float64(n),
		redisReads: (r1.reads - r0.reads - own) / float64(n),
		redisCPUUS: (r1.cpu - r0.cpu) / float64(n) * 1e6,
	}
	if s.priority {
		if r.check, err = checkOrder(rec.steps()); err != nil {
			return fcRun{}, err
		}
		var lanes [pipeline.NumLanes]int64
		lanes, r.laneErrors = gw.verify(s.quota)
		r.gatewayLane = lanes
		for l := range lanes {
			if lanes[l] != int64(r.check.grants[l]) {
				r.laneErrors += max(lanes[l]-int64(r.check.grants[l]), int64(r.check.grants[l])-lanes[l])
			}
		}
	}
	return r, nil
}

// fcProfile writes a CPU profile of one run into dir, and a goroutine dump
// 1 s into it (SLUICE_BENCH_PROFILE).
func fcProfile(dir, setup string) (stop func(), err error) {
	f, err := os.Create(filepath.Join(dir, "flow-control."+setup+".cpu.pprof"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	dump := time.AfterFunc(time.Second, func() {
		if g, err := os.Create(filepath.Join(dir, "flow-control."+setup+".goroutine.txt")); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(g, 1)
			g.Close()
		}
	})
	return func() {
		dump.Stop()
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// fcTrace prints, every 100 ms, the requests each queue holds (claimed and
// not settled) and the requests waiting in each lane.
func fcTrace(a *app.App, rec *laneRecorder, start time.Time) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var b strings.Builder
			fmt.Fprintf(&b, "t=%.1fs cpu=%.2f held", time.Since(start).Seconds(), cpuSeconds())
			for _, tier := range fcTiers {
				if c := a.Pipeline().Credits(fcQueue(tier)); c != nil {
					inflight, _, _ := c.Snapshot()
					fmt.Fprintf(&b, " %s=%d", tier, inflight)
				}
			}
			rec.mu.Lock()
			fmt.Fprintf(&b, " waiting=%v granted=%d", rec.waiting, rec.granted)
			rec.mu.Unlock()
			fmt.Fprintln(os.Stderr, b.String())
		}
	}()
	return func() { close(done) }
}

// fcWait polls the result list until n results are in; it returns how many
// LLEN polls it made.
func fcWait(ctx context.Context, c redis.UniversalClient, n int, runErr <-chan error) (int, error) {
	limit := time.After(2 * time.Minute)
	polls := 0
	for {
		got, err := c.LLen(ctx, fcResults).Result()
		polls++
		if err != nil {
			return polls, err
		}
		if got >= int64(n) {
			return polls, nil
		}
		select {
		case <-ctx.Done():
			return polls, ctx.Err()
		case err := <-runErr:
			return polls, fmt.Errorf("sluice stopped after %d of %d results: %v", got, n, err)
		case <-limit:
			return polls, fmt.Errorf("only %d of %d results after 2m", got, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// redisCounters are redis-server's running totals.
type redisCounters struct{ cmds, reads, cpu float64 }

// redisStats reads the commands processed, the read events (about one per
// round trip: a pipeline that fits the read buffer is read at once) and the
// CPU seconds of redis-server, in one INFO.
func redisStats(ctx context.Context, c redis.UniversalClient) (redisCounters, error) {
	info, err := c.Info(ctx, "stats", "cpu").Result()
	if err != nil {
		return redisCounters{}, err
	}
	var r redisCounters
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		x, _ := strconv.ParseFloat(v, 64)
		switch k {
		case "total_commands_processed":
			r.cmds = x
		case "total_reads_processed":
			r.reads = x
		case "used_cpu_sys", "used_cpu_user":
			r.cpu += x
		}
	}
	return r, nil
}

// laneStep is one step of the lanes, numbered across pools.
type laneStep struct {
	kind pipeline.LaneEventKind
	lane int
	seq  uint64 // the request's number in the order it reached any observed pool's lanes
}

// laneRecorder keeps the steps of the observed pools' lanes in one order.
type laneRecorder struct {
	mu      sync.Mutex
	stopped bool
	next    uint64
	seqs    map[[2]uint64]uint64 // (pool, LaneEvent.Seq) of a waiting request → its number here
	events  []laneStep
	waiting [pipeline.NumLanes]int // requests waiting now, for SLUICE_BENCH_TRACE
	granted int
}

// observer is the ObserveLanes function of pool number pool. Each pool's
// lanes number their own requests; the recorder numbers them again in the
// order the steps reach it, so that requests of different pools compare.
func (r *laneRecorder) observer(pool int) func(pipeline.LaneEvent) {
	return func(e pipeline.LaneEvent) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.stopped {
			return
		}
		if r.seqs == nil {
			r.seqs = map[[2]uint64]uint64{}
		}
		key := [2]uint64{uint64(pool), e.Seq}
		seq, ok := r.seqs[key]
		if !ok {
			r.next++
			seq = r.next
			if e.Kind == pipeline.LaneWaiting {
				r.seqs[key] = seq
			}
		} else if e.Kind != pipeline.LaneWaiting {
			delete(r.seqs, key)
		}
		r.events = append(r.events, laneStep{kind: e.Kind, lane: e.Lane, seq: seq})
		switch {
		case e.Kind == pipeline.LaneWaiting:
			r.waiting[e.Lane]++
		case ok:
			r.waiting[e.Lane]--
		}
		if e.Kind == pipeline.LaneGranted {
			r.granted++
		}
	}
}

// stop ends the recording (shutdown's steps are not part of the run).
func (r *laneRecorder) stop() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}

func (r *laneRecorder) steps() []laneStep {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events
}

// orderCheck is what checkOrder found.
type orderCheck struct {
	// violations: grants to a request while a request of a strictly lower
	// lane had been waiting longer (it reached the lanes first).
	violations int
	// strict: grants while any request of a strictly lower lane waited.
	strict    int
	waited    int // requests that waited for a worker
	abandoned int
	grants    [pipeline.NumLanes]int
}

// checkOrder replays the lanes' steps, in the order they were taken, and
// counts the grants that broke strict priority.
func checkOrder(steps []laneStep) (orderCheck, error) {
	var res orderCheck
	var waiting [pipeline.NumLanes][]uint64 // each lane's waiters, oldest first
	var head [pipeline.NumLanes]int
	laneOf := map[uint64]int{} // requests waiting or done waiting, by number
	done := map[uint64]bool{}  // granted or abandoned after waiting
	oldest := func(lane int) (uint64, bool) {
		for head[lane] < len(waiting[lane]) && done[waiting[lane][head[lane]]] {
			head[lane]++
		}
		if head[lane] == len(waiting[lane]) {
			return 0, false
		}
		return waiting[lane][head[lane]], true
	}
	for i, s := range steps {
		if s.lane < 0 || s.lane >= pipeline.NumLanes {
			return res, fmt.Errorf("step %d: lane %d", i, s.lane)
		}
		switch s.kind {
		case pipeline.LaneWaiting:
			if _, ok := laneOf[s.seq]; ok {
				return res, fmt.Errorf("step %d: request %d waits twice", i, s.seq)
			}
			laneOf[s.seq] = s.lane
			waiting[s.lane] = append(waiting[s.lane], s.seq)
			res.waited++
		case pipeline.LaneGranted, pipeline.LaneAbandoned:
			if l, ok := laneOf[s.seq]; ok {
				if done[s.seq] {
					return res, fmt.Errorf("step %d: request %d left its lane twice", i, s.seq)
				}
				if l != s.lane {
					return res, fmt.Errorf("step %d: request %d waited in lane %d, left lane %d", i, s.seq, l, s.lane)
				}
				done[s.seq] = true
			} else if s.kind == pipeline.LaneAbandoned {
				return res, fmt.Errorf("step %d: request %d abandoned without waiting", i, s.seq)
			}
			if s.kind == pipeline.LaneAbandoned {
				res.abandoned++
				continue
			}
			res.grants[s.lane]++
			lower, older := false, false
			for k := range s.lane {
				if w, ok := oldest(k); ok {
					lower = true
					older = older || w < s.seq
				}
			}
			if lower {
				res.strict++
			}
			if older {
				res.violations++
			}
		default:
			return res, fmt.Errorf("step %d: unknown kind %d", i, s.kind)
		}
	}
	return res, nil
}

// fcGateway is the 0-ms simulator behind a handler that reads each
// request's priority header (its lane) and fairness header (its tenant).
type fcGateway struct {
	sim     *simulator.Server
	srv     *http.Server
	url     string
	tenants map[string]int // tenant → index (read-only once serving)
	names   []string
	counts  [][pipeline.NumLanes]atomic.Int64 // arrivals per tenant and lane header
	noLane  atomic.Int64                      // arrivals without a lane header
	unknown atomic.Int64                      // arrivals of no known tenant
}

func startFCGateway() (*fcGateway, error) {
	sim, err := simulator.New(simulator.Config{Capacity: fcWorkers})
	if err != nil {
		return nil, err
	}
	g := &fcGateway{sim: sim, tenants: map[string]int{}}
	for _, tier := range fcTiers {
		for i := range fcPerQueue {
			if t := fcTenant(tier, i); !slices.Contains(g.names, t) {
				g.tenants[t] = len(g.names)
				g.names = append(g.names, t)
			}
		}
	}
	g.counts = make([][pipeline.NumLanes]atomic.Int64, len(g.names))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g.url = "http://" + ln.Addr().String()
	inner := sim.Handler()
	g.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t, ok := g.tenants[r.Header.Get(dispatch.DefaultFairnessHeader)]
		h := r.Header.Get(fcPriority)
		switch {
		case !ok:
			g.unknown.Add(1)
		case len(h) == 1 && h[0] >= '0' && h[0] < '0'+pipeline.NumLanes:
			g.counts[t][h[0]-'0'].Add(1)
		default:
			g.noLane.Add(1)
		}
		inner.ServeHTTP(w, r)
	})}
	go func() { _ = g.srv.Serve(simulator.BufferReads(ln)) }()
	return g, nil
}

func (g *fcGateway) reset() {
	for i := range g.counts {
		for l := range g.counts[i] {
			g.counts[i][l].Store(0)
		}
	}
	g.noLane.Store(0)
	g.unknown.Store(0)
}

// verify returns the arrivals per lane and counts the lane errors: an
// arrival without a lane or a known tenant, a lane of another tier than the
// tenant's, and per tenant the difference between the reserved arrivals
// (lanes 0–2) and what its quota allows (its requests, at most fcLimit;
// none without the quota gate).
func (g *fcGateway) verify(quota bool) (lanes [pipeline.NumLanes]int64, errs int64) {
	errs = g.noLane.Load() + g.unknown.Load()
	sent := map[string]int64{}
	for _, tier := range fcTiers {
		for i := range fcPerQueue {
			sent[fcTenant(tier, i)]++
		}
	}
	for i, name := range g.names {
		tier := slices.Index(fcTiers[:], name[:strings.LastIndexByte(name, '-')])
		var reserved int64
		for l := range pipeline.NumLanes {
			c := g.counts[i][l].Load()
			lanes[l] += c
			if l%3 != tier {
				errs += c
			}
			if l < 3 {
				reserved += c
			}
		}
		want := int64(0)
		if quota {
			want = min(sent[name], fcLimit)
		}
		errs += max(reserved-want, want-reserved)
	}
	return lanes, errs
}

func (g *fcGateway) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
	_ = g.sim.Close()
}
