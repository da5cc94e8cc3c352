package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/poolsim"
	"github.com/sluice-io/sluice/transports/memory"
)

// PoolOptions configure RunPool, the demo of what sluice is for: a batch
// filling a shared inference pool's slack while interactive traffic keeps
// its time to first token.
type PoolOptions struct {
	// Batch is how many batch requests sluice sends (default 160), each of
	// BatchPrompt prompt and BatchOutput output tokens (defaults 512, 128).
	Batch, BatchPrompt, BatchOutput int
	// Concurrency is the batch queue's in-flight limit at budget 1
	// (default 64: more than the pool's seats, so only the gate holds the
	// batch back).
	Concurrency int
	// Floor is how long interactive traffic runs alone first, to measure
	// its time to first token with the pool to itself (default 6s).
	Floor time.Duration
	// Waves is the interactive traffic that runs beside the batch (default:
	// 3 cycles of 5-s bursts of 10 requests/s and 5-s idle phases of 1/s).
	Waves poolsim.Waves
	// Ungated runs the batch without a gate (constant budget 1), to show
	// what the gate prevents.
	Ungated bool
	// Timeout bounds the run (default 3m).
	Timeout time.Duration
	// Progress, when set, receives one line a second.
	Progress io.Writer
	// Logger receives sluice's logs (default: discarded).
	Logger *slog.Logger
	// Seed makes the run repeatable (default 1).
	Seed uint64
	// OnStatus, when set, is called once with the status page's URL (served
	// on a free port of 127.0.0.1 while the batch runs; it shows the same
	// figures as the live line under "Also").
	OnStatus func(url string)
}

func (o *PoolOptions) setDefaults() {
	if o.Batch <= 0 {
		o.Batch = 160
	}
	if o.BatchPrompt <= 0 {
		o.BatchPrompt = 512
	}
	if o.BatchOutput <= 0 {
		o.BatchOutput = 128
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.Floor <= 0 {
		o.Floor = 6 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Waves == (poolsim.Waves{}) {
		o.Waves = poolsim.Waves{Warmup: 2 * time.Second, Burst: 5 * time.Second, Idle: 5 * time.Second, Cycles: 3, BurstRate: 10, IdleRate: 1}
	}
	if o.Waves.Seed == 0 {
		o.Waves.Seed = o.Seed
	}
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// PoolSummary is RunPool's outcome.
type PoolSummary struct {
	// Gate is the batch queue's gate.
	Gate string `json:"gate"`
	// FloorP50Ms and FloorP99Ms are interactive TTFT with the pool to
	// itself; BurstP50Ms and BurstP99Ms in the burst phases beside the
	// batch (measured in the simulator: arrival at the front → first token).
	FloorP50Ms float64 `json:"floor_ttft_p50_ms"`
	FloorP99Ms float64 `json:"floor_ttft_p99_ms"`
	BurstP50Ms float64 `json:"burst_ttft_p50_ms"`
	BurstP99Ms float64 `json:"burst_ttft_p99_ms"`
	// P99Ratio is BurstP99Ms / FloorP99Ms.
	P99Ratio float64 `json:"ttft_p99_ratio"`
	// InteractiveErrors counts interactive requests that did not stream to
	// the end.
	InteractiveErrors int `json:"interactive_errors"`
	// Batch counts: sent, answered ok, answered with an error, missing and
	// duplicated results.
	Batch, BatchOK, BatchFailed, Missing, Duplicates int
	// BatchTokens are the output tokens of the batch's answers (their
	// usage); BatchSeconds from its
	// first enqueue to its last result.
	BatchTokens  int     `json:"batch_tokens"`
	BatchSeconds float64 `json:"batch_seconds"`
	// Rejections are the front's 429s to batch requests (each retried).
	Rejections uint64 `json:"batch_rejections"`
	// Evicted are the batch calls sluice took back for the gate (each
	// re-queued and answered later).
	Evicted int `json:"batch_evicted"`
	// ResumedTokens are the output tokens evicted calls had made that
	// their next attempts kept (resume) instead of making again.
	ResumedTokens int `json:"batch_resumed_tokens"`
	// PrefixHitTokens are the prompt tokens the pods' prefix caches served
	// (a resumed request's prompt holds its evicted call's).
	PrefixHitTokens int `json:"prefix_hit_tokens"`
	// StepLagP99Ms is how late the simulator's steps ran (a large value: the
	// machine was too busy for the figures to mean much).
	StepLagP99Ms float64 `json:"step_lag_p99_ms"`
}

// demoPoolQueue and demoPoolResults are the pool demo's queue names.
const (
	demoPoolQueue   = "llm-d-async:requests:demo-batch"
	demoPoolResults = "llm-d-async:results:demo-batch"
)

// RunPool runs the purpose demo: a simulated inference pool (two vLLM-like
// pods of 16 seats behind an EPP-like front, internal/poolsim) serves
// interactive traffic straight to the front, first alone (the floor), then
// in bursts while sluice sends a batch through the pool-headroom gate with
// evict and resume (it reads every pod's own gauges each 50 ms, keeps 4
// seats free and takes batch requests back when a burst eats them; a
// request taken back continues later from the tokens it had made) — no
// Prometheus, no server. It returns when every batch request has its result.
func RunPool(ctx context.Context, o PoolOptions) (PoolSummary, error) {
	o.setDefaults()
	sum := PoolSummary{Gate: headroom.Type, Batch: o.Batch}
	if o.Ungated {
		sum.Gate = constant.Type
	}
	if err := o.Waves.Validate(); err != nil {
		return sum, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	pcfg := poolsim.Config{Seed: int64(o.Seed)}
	pcfg.SetDefaults()
	// vLLM V1's prefix caching and the EPP's prefix-aware routing: a
	// resumed request finds the blocks its evicted call left
	pcfg.Engine.PrefixCaching, pcfg.Front.PrefixAware = true, true
	pool, err := poolsim.New(pcfg)
	if err != nil {
		return sum, err
	}
	recs := &records{}
	pool.OnRecord(recs.add)
	if err := pool.Start(ctx); err != nil {
		return sum, err
	}
	defer pool.Close()
	front, err := pool.Listen("127.0.0.1:0")
	if err != nil {
		return sum, err
	}
	client := &poolsim.Client{Front: front, PromptTokens: 256, MaxTokens: 64}

	// The floor: interactive alone, at the burst rate.
	floorWaves := poolsim.Waves{Burst: o.Floor, Cycles: 1, BurstRate: o.Waves.BurstRate, IdleRate: o.Waves.IdleRate, Seed: o.Seed + 1}
	arrivals, _ := floorWaves.Schedule()
	floorStart := time.Now()
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "pool: 2 pods × 16 seats (simulated vLLM behind an EPP-like front at %s)\n", front)
		fmt.Fprintf(o.Progress, "phase 1: interactive traffic alone for %s (%.0f requests/s), to measure its floor\n", o.Floor, o.Waves.BurstRate)
	}
	sum.InteractiveErrors += client.Drive(ctx, floorStart, arrivals)
	floorEnd := time.Now()
	floor := recs.ttfts(func(r poolsim.Record) bool { return !r.Arrival.Before(floorStart) && r.Arrival.Before(floorEnd) })
	sum.FloorP50Ms, sum.FloorP99Ms = nearestRank(floor, 0.50), nearestRank(floor, 0.99)
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "floor: interactive TTFT p50 %.0f ms, p99 %.0f ms\n", sum.FloorP50Ms, sum.FloorP99Ms)
		fmt.Fprintf(o.Progress, "phase 2: %d batch requests through sluice (gate %s) beside interactive bursts\n", o.Batch, sum.Gate)
	}

	// The batch, through sluice.
	mem := memory.New(memory.Options{})
	gateType, params, evict, resume := constant.Type, map[string]json.RawMessage{}, false, false
	if !o.Ungated {
		// the recommended arm of the interactive-protection benchmark
		eps := make([]string, pcfg.Pods)
		for i := range eps {
			eps[i] = fmt.Sprintf("%s/pods/%d/metrics", front, i)
		}
		b, err := json.Marshal(eps)
		if err != nil {
			return sum, err
		}
		gateType, evict, resume = headroom.Type, true, true
		params = map[string]json.RawMessage{"endpoints": b, "seats_per_pod": json.RawMessage(strconv.Itoa(pcfg.Engine.MaxNumSeqs)),
			"reserve": json.RawMessage("4"), "waiting_weight": json.RawMessage(strconv.Itoa(pcfg.Pods)),
			"burst_threshold": json.RawMessage("3")}
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: o.Concurrency, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(5 * time.Second),
		Retry:        config.Retry{Base: config.Duration(200 * time.Millisecond), Max: config.Duration(2 * time.Second)},
		TransportConfig: config.TransportConfig{ResultQueueName: demoPoolResults, Queues: []config.Queue{{
			Queue: transport.Queue{Name: demoPoolQueue}, IGWBaseURL: front, RequestPathURL: "/v1/completions",
			InferenceObjective: "batch-sheddable", GateType: gateType, GateParams: params, Evict: evict, Resume: resume,
		}}},
	}
	ad, err := adapters()
	if err != nil {
		return sum, err
	}
	port, err := freePort()
	if err != nil {
		return sum, err
	}
	cfg.ListenHost, cfg.MetricsPort = "127.0.0.1", port
	reg := prometheus.NewRegistry()
	var wavesStart time.Time
	var bursts [][2]time.Duration
	var started sync.Once
	startedCh := make(chan struct{})
	extra := func() []status.Figure {
		select {
		case <-startedCh:
		default:
			return []status.Figure{{Label: "phase", Value: "starting"}}
		}
		return poolFigures(time.Now(), wavesStart, bursts, recs, sum.FloorP99Ms, mem, o.Batch, pool, reg)
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Logger: o.Logger, Transport: mem, Registry: reg, StatusExtra: extra})
	if err != nil {
		return sum, err
	}
	batchStart := time.Now()
	// text prompts (the simulator counts four bytes a token), so that a
	// request taken back can resume: its continuation appends to it; one
	// per request, as a real batch's differ
	deadline := float64(batchStart.Add(o.Timeout).UnixMilli()) / 1000
	for i := range o.Batch {
		b := fmt.Appendf(nil, `{"id":"batch-%d","deadline":%.3f,"payload":{"model":%q,"prompt":%s,"max_tokens":%d}}`,
			i, deadline, poolsim.DefaultModelName, poolsim.TextPromptFor(o.BatchPrompt, uint64(i)), o.BatchOutput)
		if err := mem.Enqueue(demoPoolQueue, b); err != nil {
			return sum, err
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(runCtx) }()

	wavesStart = time.Now()
	arrivals, bursts = o.Waves.Schedule()
	started.Do(func() { close(startedCh) })
	statusURL := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "status page: %s (the same figures, under \"Also\")\n", statusURL)
	}
	if o.OnStatus != nil {
		o.OnStatus(statusURL)
	}
	interactiveDone := make(chan int, 1)
	go func() { interactiveDone <- client.Drive(ctx, wavesStart, arrivals) }()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last time.Time
	wavesRunning := true
	for {
		n, more := mem.ResultCount(demoPoolResults)
		if n >= o.Batch && !wavesRunning {
			last = time.Now()
			break
		}
		select {
		case errs := <-interactiveDone:
			sum.InteractiveErrors += errs
			wavesRunning = false
			continue
		case <-more:
			if n+1 >= o.Batch && last.IsZero() {
				last = time.Now()
			}
			continue
		case now := <-tick.C:
			if o.Progress != nil {
				fmt.Fprintln(o.Progress, poolLine(now, wavesStart, bursts, recs, sum.FloorP99Ms, n, o.Batch, pool, reg))
			}
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	stop()
	if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
		return sum, err
	}
	burst := recs.ttfts(func(r poolsim.Record) bool {
		return r.Class == poolsim.ClassInteractive && poolsim.InBurst(bursts, r.Arrival.Sub(wavesStart))
	})
	sum.BurstP50Ms, sum.BurstP99Ms = nearestRank(burst, 0.50), nearestRank(burst, 0.99)
	if sum.FloorP99Ms > 0 {
		sum.P99Ratio = sum.BurstP99Ms / sum.FloorP99Ms
	}
	seen := map[string]int{}
	for _, b := range mem.Results(demoPoolResults) {
		r, err := wire.DecodeResult(b)
		if err != nil {
			return sum, fmt.Errorf("demo: unreadable result: %w", err)
		}
		if seen[r.ID]++; seen[r.ID] > 1 {
			sum.Duplicates++
			continue
		}
		if r.OK() {
			sum.BatchOK++
			// the tokens the answer carries (a resumed request's answer
			// holds its evicted calls' tokens too)
			if _, out, ok := dispatch.ParseUsage([]byte(r.Payload)); ok {
				sum.BatchTokens += int(out)
			}
		} else {
			sum.BatchFailed++
		}
	}
	for i := range o.Batch {
		if seen[fmt.Sprintf("batch-%d", i)] == 0 {
			sum.Missing++
		}
	}
	if !last.IsZero() {
		sum.BatchSeconds = last.Sub(batchStart).Seconds()
	}
	st := pool.Stats()
	sum.Rejections = st.Classes[poolsim.ClassBatch].Rejected
	sum.Evicted = int(familySum(reg, "sluice_evicted_total"))
	sum.ResumedTokens = int(familySum(reg, "sluice_resumed_tokens_total"))
	for _, g := range pool.PodGauges() {
		sum.PrefixHitTokens += int(g.PrefixHits)
	}
	sum.StepLagP99Ms = float64(pool.StepLag().P99) / float64(time.Millisecond)
	if sum.Missing > 0 {
		return sum, fmt.Errorf("demo: %d batch requests have no result after %s", sum.Missing, o.Timeout)
	}
	return sum, nil
}

// poolLine is the live line: interactive TTFT p99 over the last two
// seconds against the floor, the batch's progress and what the gate lets
// through.
func poolLine(now, start time.Time, bursts [][2]time.Duration, recs *records, floorP99 float64, done, total int, pool *poolsim.Pool, reg *prometheus.Registry) string {
	recent := recs.ttfts(func(r poolsim.Record) bool {
		return r.Class == poolsim.ClassInteractive && now.Sub(r.Arrival) <= 2*time.Second
	})
	phase := "idle "
	if poolsim.InBurst(bursts, now.Sub(start)) {
		phase = "burst"
	}
	ttft := "  -  "
	ratio := ""
	if len(recent) > 0 {
		p := nearestRank(recent, 0.99)
		ttft = fmt.Sprintf("%5.0f ms", p)
		if floorP99 > 0 {
			ratio = fmt.Sprintf(" (%.1f× floor)", p/floorP99)
		}
	}
	var batchRunning, interRunning int
	for _, g := range pool.PodGauges() {
		batchRunning += g.RunningByClass[poolsim.ClassBatch]
		interRunning += g.RunningByClass[poolsim.ClassInteractive]
	}
	return fmt.Sprintf("t=%3.0fs %s | interactive TTFT p99 %s%s, %2d running | batch %d/%d done, %2d running | sluice in-flight limit %.0f, %.0f taken back",
		now.Sub(start).Seconds(), phase, ttft, ratio, interRunning, done, total, batchRunning, familySum(reg, "sluice_inflight_limit"),
		familySum(reg, "sluice_evicted_total"))
}

// records collects the simulator's records of finished requests.
type records struct {
	mu   sync.Mutex
	recs []poolsim.Record
}

func (rs *records) add(r poolsim.Record) {
	rs.mu.Lock()
	rs.recs = append(rs.recs, r)
	rs.mu.Unlock()
}

// poolFigures are the live line's figures, for the status page.
func poolFigures(now, start time.Time, bursts [][2]time.Duration, recs *records, floorP99 float64, mem *memory.Transport, total int, pool *poolsim.Pool, reg *prometheus.Registry) []status.Figure {
	recent := recs.ttfts(func(r poolsim.Record) bool {
		return r.Class == poolsim.ClassInteractive && now.Sub(r.Arrival) <= 2*time.Second
	})
	phase := "idle"
	if poolsim.InBurst(bursts, now.Sub(start)) {
		phase = "burst"
	}
	p99 := "no interactive request in the last 2 s"
	if len(recent) > 0 {
		p := nearestRank(recent, 0.99)
		p99 = fmt.Sprintf("%.0f ms", p)
		if floorP99 > 0 {
			p99 += fmt.Sprintf(" (%.1f× the floor's %.0f ms)", p/floorP99, floorP99)
		}
	}
	done, _ := mem.ResultCount(demoPoolResults)
	var batchRunning int
	for _, g := range pool.PodGauges() {
		batchRunning += g.RunningByClass[poolsim.ClassBatch]
	}
	return []status.Figure{
		{Label: "phase", Value: phase},
		{Label: "interactive TTFT p99, last 2 s", Value: p99},
		{Label: "batch done", Value: fmt.Sprintf("%d of %d (%d running in the pool)", done, total, batchRunning)},
		{Label: "batch calls taken back (evict)", Value: fmt.Sprintf("%.0f", familySum(reg, "sluice_evicted_total"))},
		{Label: "sluice in-flight limit", Value: fmt.Sprintf("%.0f", familySum(reg, "sluice_inflight_limit"))},
	}
}

// freePort is a free TCP port of 127.0.0.1.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("demo: a free port for the status page: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ttfts returns the TTFT (ms) of the records that keep selects and that
// had a first token.
func (rs *records) ttfts(keep func(poolsim.Record) bool) []float64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []float64
	for _, r := range rs.recs {
		if !r.FirstToken.IsZero() && keep(r) {
			out = append(out, float64(r.TTFT())/float64(time.Millisecond))
		}
	}
	return out
}

// nearestRank is the exact q-quantile of xs (nearest rank), 0 when empty.
func nearestRank(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(max(int(math.Ceil(q*float64(len(s))))-1, 0), len(s)-1)]
}
