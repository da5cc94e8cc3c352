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
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/gate"
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
	// Preset is the simulated pool, a poolsim preset as `sluice
	// simulate-pool --preset` takes it (default poolsim.PresetStress). It
	// chooses the gate (demoGate) and the defaults below.
	Preset string
	// Batch is how many batch requests sluice sends (default 160; on the
	// vLLM presets 600), each of BatchPrompt prompt and BatchOutput
	// output tokens (defaults 512, 128).
	Batch, BatchPrompt, BatchOutput int
	// Concurrency is the batch queue's in-flight limit at budget 1
	// (default 64: more than the pool's seats, so only the gate holds the
	// batch back; on the vLLM presets 256, more than the gate lets run).
	Concurrency int
	// Floor is how long interactive traffic runs alone first, to measure
	// its time to first token with the pool to itself (default 6s).
	Floor time.Duration
	// Waves is the interactive traffic that runs beside the batch (default:
	// 3 cycles of 5-s bursts of 10 requests/s and 5-s idle phases of 1/s,
	// the rates times the preset's RateScale: the same share of its pool).
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
	// figures as the live line under "Also", interactive TTFT p99 against
	// its floor as a chart, and the batch in flight per pod with dispatch
	// "pods").
	OnStatus func(url string)
}

// vllmPreset reports whether the preset is one of the vLLM-calibrated
// pools (not stress).
func vllmPreset(name string) bool { return name != poolsim.PresetStress }

func (o *PoolOptions) setDefaults(p poolsim.Preset) {
	if o.Batch <= 0 {
		o.Batch = 160
		if vllmPreset(p.Name) {
			// the vLLM pods serve 160 requests in a second or two; with
			// the gate's pacing (one placement a pod per reading) 600 run
			// beside every burst and end with the waves
			o.Batch = 600
		}
	}
	if o.BatchPrompt <= 0 {
		o.BatchPrompt = 512
	}
	if o.BatchOutput <= 0 {
		o.BatchOutput = 128
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
		if vllmPreset(p.Name) {
			// the preset's own (2,048: more than the KV caches hold) keeps
			// that many requests waiting in sluice for a pod; the gate
			// lets far fewer run (see demoGate), so 256 shows the same on
			// two cores
			o.Concurrency = 256
		}
	}
	if o.Floor <= 0 {
		o.Floor = 6 * time.Second
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Waves == (poolsim.Waves{}) {
		o.Waves = poolsim.Waves{Warmup: 2 * time.Second, Burst: 5 * time.Second, Idle: 5 * time.Second, Cycles: 3,
			BurstRate: 10 * p.RateScale, IdleRate: p.RateScale}
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
	// Preset is the simulated pool (PoolOptions.Preset); Pods and
	// SeatsPerPod its size.
	Preset      string `json:"preset"`
	Pods        int    `json:"pods"`
	SeatsPerPod int    `json:"seats_per_pod"`
	// Gate is the batch queue's gate; GateParams its parameters (none
	// when ungated).
	Gate       string                     `json:"gate"`
	GateParams map[string]json.RawMessage `json:"gate_params,omitempty"`
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
	// PerPod is what the batch held on each pod, with a gate that places
	// requests on pods (gate.PodReporter: pool-headroom with dispatch
	// "pods"); empty otherwise.
	PerPod []PodSummary `json:"per_pod,omitempty"`
}

// PodSummary is what the batch held on one pod, from the gate's readings
// sampled once a second after the warm-up: the means, in the bursts and
// between them, of the batch's calls there (in flight) and of the most the
// gate allowed there (limit), and the most in flight at a sample.
type PodSummary struct {
	Pod           string  `json:"pod"`
	BurstInFlight float64 `json:"burst_in_flight"`
	BurstLimit    float64 `json:"burst_limit"`
	IdleInFlight  float64 `json:"idle_in_flight"`
	IdleLimit     float64 `json:"idle_limit"`
	MaxInFlight   int     `json:"max_in_flight"`
}

// demoPoolQueue and demoPoolResults are the pool demo's queue names.
const (
	demoPoolQueue   = "llm-d-async:requests:demo-batch"
	demoPoolResults = "llm-d-async:results:demo-batch"
)

// RunPool runs the purpose demo: a simulated inference pool (the preset's
// vLLM-like pods behind an EPP-like front, internal/poolsim) serves
// interactive traffic straight to the front, first alone (the floor), then
// in bursts while sluice sends a batch through the pool-headroom gate with
// evict and resume (demoGate: it reads every pod's own gauges each 50 ms,
// keeps seats free and takes batch requests back when a burst eats them; a
// request taken back continues later from the tokens it had made) — no
// Prometheus, no server. It returns when every batch request has its result.
func RunPool(ctx context.Context, o PoolOptions) (PoolSummary, error) {
	if o.Preset == "" {
		o.Preset = poolsim.PresetStress
	}
	preset, err := poolsim.PresetByName(o.Preset)
	if err != nil {
		return PoolSummary{}, fmt.Errorf("demo: %w", err)
	}
	o.setDefaults(preset)
	sum := PoolSummary{Preset: preset.Name, Gate: headroom.Type, Batch: o.Batch}
	if o.Ungated {
		sum.Gate = constant.Type
	}
	if err := o.Waves.Validate(); err != nil {
		return sum, err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	pcfg := preset.Config
	pcfg.Seed = int64(o.Seed)
	// vLLM V1's prefix caching and the EPP's prefix-aware routing: a
	// resumed request finds the blocks its evicted call left
	pcfg.Engine.PrefixCaching, pcfg.Front.PrefixAware = true, true
	pcfg.SetDefaults()
	sum.Pods, sum.SeatsPerPod = pcfg.Pods, pcfg.Engine.MaxNumSeqs
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
		fmt.Fprintf(o.Progress, "pool: preset %s, %d pods × %d seats (simulated vLLM behind an EPP-like front at %s)\n",
			preset.Name, pcfg.Pods, pcfg.Engine.MaxNumSeqs, front)
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
		gateType, evict, resume = headroom.Type, true, true
		if params, err = demoGate(preset.Name, pcfg, front); err != nil {
			return sum, err
		}
		sum.GateParams = params
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
	live := &liveView{recs: recs, mem: mem, total: o.Batch, pool: pool, reg: reg, floorStart: floorStart, floorP99: sum.FloorP99Ms}
	a, err := app.New(cfg, app.Options{Adapters: ad, Logger: o.Logger, Transport: mem, Registry: reg, StatusExtra: live.figures})
	if err != nil {
		return sum, err
	}
	live.pods = podReporter(a)
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

	arrivals, bursts := o.Waves.Schedule()
	wavesStart := live.start(bursts)
	statusURL := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "status page: %s (the same figures under \"Also\", TTFT p99 and the batch per pod as charts)\n", statusURL)
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
	perPod := &podTally{}
	for {
		n, more := mem.ResultCount(demoPoolResults)
		if n >= o.Batch && last.IsZero() {
			last = time.Now()
		}
		if n >= o.Batch && !wavesRunning {
			break
		}
		select {
		case errs := <-interactiveDone:
			sum.InteractiveErrors += errs
			wavesRunning = false
			continue
		case <-more:
			continue
		case now := <-tick.C:
			pods := live.podReadings()
			if off := now.Sub(wavesStart); off >= o.Waves.Warmup && wavesRunning {
				perPod.add(pods, poolsim.InBurst(bursts, off))
			}
			if o.Progress != nil {
				fmt.Fprintln(o.Progress, live.line(now, n, pods))
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
	sum.PerPod = perPod.summary()
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

// demoGate returns the pool-headroom parameters the demo runs on the
// preset's pool: the recommended gate of the interactive-protection
// benchmark for it (docs/benchmarks.md).
//
// On stress (16 seats a pod) that is headroom-resume-w2-t3: the pool read
// as a whole, 4 seats kept free, waiting requests weighed by the pod count,
// the burst rule at 3 others.
//
// On the vLLM presets a reserve of seats does not protect: with 1,024 seats
// a pod the batch fills the KV cache and lengthens every step before a
// seat runs out (on 16 seats the same rule holds the same way). There the
// gate dispatches to the pods itself and applies every rule per pod
// (dispatch "pods", the benchmark's headroom-resume-pods-r2-i2-t3-w1-h250:
// 2 seats kept free a pod, waiting requests at weight 1, a hold of 250 ms,
// no batch placed on a pod where an interactive request waits, one
// placement a pod between readings; on 1,024-seat pods the prefill paced
// at demoPaceTokens instead), with kv_limit 0.7: nothing more is
// placed on a pod whose KV cache is over 70 % full. A burst needs about 7 %
// of a pod's KV (some 100 interactive requests of 320 tokens in 467,280),
// and the batch's calls admitted below the limit still grow by their
// output (at most 128 tokens each here), so 0.7 leaves the burst its
// blocks with room to spare; the placements per reading, not the KV,
// bound the batch here.
func demoGate(preset string, pcfg poolsim.Config, front string) (map[string]json.RawMessage, error) {
	eps := make([]string, pcfg.Pods)
	for i := range eps {
		eps[i] = fmt.Sprintf("%s/pods/%d/metrics", front, i)
	}
	b, err := json.Marshal(eps)
	if err != nil {
		return nil, err
	}
	params := map[string]json.RawMessage{"endpoints": b, "seats_per_pod": json.RawMessage(strconv.Itoa(pcfg.Engine.MaxNumSeqs)),
		"burst_threshold": json.RawMessage("3")}
	if !vllmPreset(preset) {
		params["reserve"] = json.RawMessage("4")
		params["waiting_weight"] = json.RawMessage(strconv.Itoa(pcfg.Pods))
		return params, nil
	}
	params["dispatch"] = json.RawMessage(strconv.Quote(headroom.DispatchPods))
	params["reserve"], params["idle_reserve"] = json.RawMessage("2"), json.RawMessage("2")
	params["waiting_weight"] = json.RawMessage("1")
	params["hold"] = json.RawMessage(`"250ms"`)
	params["kv_limit"] = json.RawMessage("0.7")
	if pcfg.Engine.MaxNumSeqs > 64 {
		// vLLM's default seats: the steps, not the seats, bound what the
		// batch may do; its prefill is paced in tokens (docs/gates.md,
		// the pace in tokens)
		params["pace_tokens"] = json.RawMessage(strconv.Itoa(demoPaceTokens))
		params["pending_prefills"] = json.RawMessage("4")
	}
	return params, nil
}

// demoPaceTokens is the batch's prefill per pod on pods of vLLM's default
// seats, in prompt tokens a second: the replay's and the benchmark's
// choice for vllm-8b-h100 (docs/gates.md).
const demoPaceTokens = 25600

// podReporter is the per-pod reporter of a's batch queue's gate (nil: the
// gate does not place requests on pods).
func podReporter(a *app.App) gate.PodReporter {
	for _, q := range a.Pipeline().Snapshot().Queues {
		if q.Gate != nil {
			return gate.PodReporterOf(q.Gate.Gate())
		}
	}
	return nil
}

// liveView is what the live line and the status page's "Also" show while
// the batch runs.
type liveView struct {
	recs       *records
	mem        *memory.Transport
	total      int
	pool       *poolsim.Pool
	reg        *prometheus.Registry
	pods       gate.PodReporter // nil: not per pod
	floorStart time.Time
	floorP99   float64

	mu         sync.Mutex
	wavesStart time.Time // zero until the waves start
	bursts     [][2]time.Duration
}

// start marks the waves' start and returns it.
func (v *liveView) start(bursts [][2]time.Duration) time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.wavesStart, v.bursts = time.Now(), bursts
	return v.wavesStart
}

func (v *liveView) phase(now time.Time) (started bool, burst bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.wavesStart.IsZero() {
		return false, false
	}
	return true, poolsim.InBurst(v.bursts, now.Sub(v.wavesStart))
}

func (v *liveView) podReadings() []gate.PodReading {
	if v.pods == nil {
		return nil
	}
	return v.pods.PodReadings()
}

// recentP99 is interactive TTFT p99 (ms) over the requests that arrived
// in the last two seconds; ok is false when none did.
func (v *liveView) recentP99(now time.Time) (p99 float64, ok bool) {
	recent := v.recs.ttfts(func(r poolsim.Record) bool {
		return r.Class == poolsim.ClassInteractive && now.Sub(r.Arrival) <= 2*time.Second
	})
	return nearestRank(recent, 0.99), len(recent) > 0
}

// line is the live line: interactive TTFT p99 over the last two seconds
// against the floor, the batch's progress, what the gate lets through
// and, per pod, what the batch holds there (in flight / limit).
func (v *liveView) line(now time.Time, done int, pods []gate.PodReading) string {
	_, burst := v.phase(now)
	phase := "idle "
	if burst {
		phase = "burst"
	}
	ttft := "  -  "
	ratio := ""
	if p, ok := v.recentP99(now); ok {
		ttft = fmt.Sprintf("%5.0f ms", p)
		if v.floorP99 > 0 {
			ratio = fmt.Sprintf(" (%.1f× floor)", p/v.floorP99)
		}
	}
	var batchRunning, interRunning int
	for _, g := range v.pool.PodGauges() {
		batchRunning += g.RunningByClass[poolsim.ClassBatch]
		interRunning += g.RunningByClass[poolsim.ClassInteractive]
	}
	v.mu.Lock()
	el := now.Sub(v.wavesStart).Seconds()
	v.mu.Unlock()
	s := fmt.Sprintf("t=%3.0fs %s | interactive TTFT p99 %s%s, %2d running | batch %d/%d done, %2d running | sluice in-flight limit %.0f, %.0f taken back",
		el, phase, ttft, ratio, interRunning, done, v.total, batchRunning, familySum(v.reg, "sluice_inflight_limit"),
		familySum(v.reg, "sluice_evicted_total"))
	if len(pods) > 0 {
		s += " | per pod " + podsText(pods)
	}
	return s
}

// podsText is each pod's in flight / limit, "3/14 0/14".
func podsText(pods []gate.PodReading) string {
	parts := make([]string, len(pods))
	for i, p := range pods {
		parts[i] = fmt.Sprintf("%d/%d", p.InFlight, p.Limit)
	}
	return strings.Join(parts, " ")
}

// figures are the live line's figures, for the status page; the TTFT
// figure carries its history as a chart.
func (v *liveView) figures() []status.Figure {
	now := time.Now()
	started, burst := v.phase(now)
	if !started {
		return []status.Figure{{Label: "phase", Value: "starting"}}
	}
	phase := "idle"
	if burst {
		phase = "burst"
	}
	p99 := "no interactive request in the last 2 s"
	if p, ok := v.recentP99(now); ok {
		p99 = fmt.Sprintf("%.0f ms", p)
		if v.floorP99 > 0 {
			p99 += fmt.Sprintf(" (%.1f× the floor's %.0f ms)", p/v.floorP99, v.floorP99)
		}
	}
	done, _ := v.mem.ResultCount(demoPoolResults)
	var batchRunning int
	for _, g := range v.pool.PodGauges() {
		batchRunning += g.RunningByClass[poolsim.ClassBatch]
	}
	figs := []status.Figure{
		{Label: "phase", Value: phase},
		{Label: "interactive TTFT p99, last 2 s", Value: p99, Chart: v.ttftChart(now)},
		{Label: "batch done", Value: fmt.Sprintf("%d of %d (%d running in the pool)", done, v.total, batchRunning)},
		{Label: "batch calls taken back (evict)", Value: fmt.Sprintf("%.0f", familySum(v.reg, "sluice_evicted_total"))},
		{Label: "sluice in-flight limit", Value: fmt.Sprintf("%.0f", familySum(v.reg, "sluice_inflight_limit"))},
	}
	if pods := v.podReadings(); len(pods) > 0 {
		figs = append(figs, status.Figure{Label: "batch per pod (in flight / limit)", Value: podsText(pods)})
	}
	return figs
}

// ttftChart is interactive TTFT p99 over two-second windows ending each
// second, from the floor's start to now, beside the floor's p99.
func (v *liveView) ttftChart(now time.Time) *status.Chart {
	from := v.floorStart
	n := int(now.Sub(from)/time.Second) + 1
	buckets := make([][]float64, n)
	v.recs.each(func(r poolsim.Record) {
		if r.Class != poolsim.ClassInteractive || r.FirstToken.IsZero() || r.Arrival.Before(from) {
			return
		}
		if i := int(r.Arrival.Sub(from) / time.Second); i < n {
			buckets[i] = append(buckets[i], float64(r.TTFT())/float64(time.Millisecond))
		}
	})
	p99 := status.Line{Label: "interactive TTFT p99, last 2 s", Points: [][2]float64{}}
	for i := range n {
		window := buckets[i]
		if i > 0 {
			window = append(slices.Clone(buckets[i-1]), window...)
		}
		if len(window) == 0 {
			continue
		}
		at := from.Add(time.Duration(i+1) * time.Second)
		if at.After(now) {
			at = now
		}
		p99.Points = append(p99.Points, [2]float64{float64(at.UnixMilli()), nearestRank(window, 0.99)})
	}
	floor := status.Line{Label: "the floor's p99 (interactive alone)", Points: [][2]float64{
		{float64(from.UnixMilli()), v.floorP99}, {float64(now.UnixMilli()), v.floorP99}}}
	return &status.Chart{Unit: "ms", Lines: []status.Line{p99, floor}}
}

// podTally adds up, per pod, the gate's readings sampled by the live loop.
type podTally struct {
	pods []string
	// sums per pod: in flight and limit in bursts and idle phases, and
	// the sample counts
	burstIn, burstLim, idleIn, idleLim []int
	burstN, idleN                      int
	max                                []int
}

func (t *podTally) add(pods []gate.PodReading, burst bool) {
	if len(pods) == 0 {
		return
	}
	if t.pods == nil {
		n := len(pods)
		t.pods = make([]string, n)
		for i, p := range pods {
			t.pods[i] = p.Pod
		}
		t.burstIn, t.burstLim, t.idleIn, t.idleLim, t.max = make([]int, n), make([]int, n), make([]int, n), make([]int, n), make([]int, n)
	}
	if len(pods) != len(t.pods) {
		return
	}
	if burst {
		t.burstN++
	} else {
		t.idleN++
	}
	for i, p := range pods {
		if burst {
			t.burstIn[i] += p.InFlight
			t.burstLim[i] += p.Limit
		} else {
			t.idleIn[i] += p.InFlight
			t.idleLim[i] += p.Limit
		}
		t.max[i] = max(t.max[i], p.InFlight)
	}
}

func (t *podTally) summary() []PodSummary {
	mean := func(sum, n int) float64 {
		if n == 0 {
			return 0
		}
		return float64(sum) / float64(n)
	}
	out := make([]PodSummary, len(t.pods))
	for i, p := range t.pods {
		out[i] = PodSummary{Pod: p, BurstInFlight: mean(t.burstIn[i], t.burstN), BurstLimit: mean(t.burstLim[i], t.burstN),
			IdleInFlight: mean(t.idleIn[i], t.idleN), IdleLimit: mean(t.idleLim[i], t.idleN), MaxInFlight: t.max[i]}
	}
	return out
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

// each calls f with every record, in the order they finished.
func (rs *records) each(f func(poolsim.Record)) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, r := range rs.recs {
		f(r)
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
	var out []float64
	rs.each(func(r poolsim.Record) {
		if !r.FirstToken.IsZero() && keep(r) {
			out = append(out, float64(r.TTFT())/float64(time.Millisecond))
		}
	})
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
