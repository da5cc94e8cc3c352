// Package demo is sluice's embedded demo (`sluice demo`, `make run`) and the
// memory load the benchmarks and tests drive: the memory transport and the
// constant gate, over the gateway simulator or a stub dispatcher, assembled
// with core/app as any embedding program would. It is not part of the
// public API.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/aimd"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/transports/memory"
)

// Options configure Run.
type Options struct {
	// Requests is how many requests to enqueue (default 1000).
	Requests int
	// Concurrency is the queue's in-flight limit (default 64).
	Concurrency int
	// RetryBase is the first retry backoff (default 500ms, to keep the demo short).
	RetryBase time.Duration
	// Latency is the simulator's latency range (default 5ms to 50ms).
	LatencyMin, LatencyMax time.Duration
	// Rate429 and Rate5xx are the simulator's error rates (default 0.05 and 0.03).
	Rate429, Rate5xx float64
	// Timeout bounds the whole run (default 2m).
	Timeout time.Duration
	// Progress, when set, receives a progress line every ProgressEvery (default 500ms).
	Progress      io.Writer
	ProgressEvery time.Duration
	// Seed makes the sample deterministic (default 1).
	Seed uint64
	// Logger receives sluice's logs (default: discarded).
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.Requests <= 0 {
		o.Requests = 1000
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 500 * time.Millisecond
	}
	if o.LatencyMax <= 0 {
		o.LatencyMin, o.LatencyMax = 5*time.Millisecond, 50*time.Millisecond
	}
	if o.Rate429 == 0 {
		o.Rate429 = 0.05
	}
	if o.Rate5xx == 0 {
		o.Rate5xx = 0.03
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.ProgressEvery <= 0 {
		o.ProgressEvery = 500 * time.Millisecond
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Summary is the demo's outcome; every request is accounted for.
type Summary struct {
	Requests         int     `json:"requests"`
	Results          int     `json:"results"`
	Succeeded        int     `json:"succeeded"`
	Failed           int     `json:"failed"`
	DeadlineExceeded int     `json:"deadline_exceeded"`
	Invalid          int     `json:"invalid"`
	Cancelled        int     `json:"cancelled"`
	GateDropped      int     `json:"gate_dropped"`
	Retries          int     `json:"retries"`
	DeadLettered     int     `json:"dead_lettered"`
	Duplicates       int     `json:"duplicates"`
	Missing          int     `json:"missing"`
	Seconds          float64 `json:"seconds"`
	Throughput       float64 `json:"throughput_per_s"`
	GatewayRequests  uint64  `json:"gateway_requests"`
	Gateway429       uint64  `json:"gateway_429"`
	Gateway5xx       uint64  `json:"gateway_5xx"`
}

// demoQueue and demoResults are the demo's queue names (the batch convention).
const (
	demoQueue   = "llm-d-async:requests:demo"
	demoResults = "llm-d-async:results:demo:$batch"
)

// Run runs the embedded demo: the memory transport, the gateway
// simulator and the constant gate, with a sample of requests of mixed
// deadlines: most ordinary, some already expired, some invalid, some whose
// gateway call outlives their deadline, and some meeting the simulator's
// 429s and 5xx. It returns when every request has its result.
func Run(ctx context.Context, o Options) (Summary, error) {
	o.setDefaults()
	var sum Summary
	sim, err := simulator.New(simulator.Config{
		Latency: simulator.Uniform(o.LatencyMin, o.LatencyMax),
		Rate429: o.Rate429, Rate5xx: o.Rate5xx, RetryAfter: time.Second,
		Capacity: o.Concurrency, Seed: int64(o.Seed),
	})
	if err != nil {
		return sum, fmt.Errorf("simulator: %w", err)
	}
	gwURL, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return sum, fmt.Errorf("simulator: %w", err)
	}
	defer sim.Close()

	mem := memory.New(memory.Options{})
	cfg := &config.Config{
		Transport:   memory.Name,
		Concurrency: o.Concurrency,
		MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(10 * time.Second),
		Retry:        config.Retry{Base: config.Duration(o.RetryBase), Max: config.Duration(10 * o.RetryBase)},
		TransportConfig: config.TransportConfig{
			ResultQueueName: demoResults,
			Queues:          []config.Queue{{Queue: transport.Queue{Name: demoQueue}, IGWBaseURL: gwURL, RequestPathURL: "/v1/chat/completions"}},
		},
	}
	ad, err := adapters()
	if err != nil {
		return sum, err
	}
	reg := prometheus.NewRegistry()
	a, err := app.New(cfg, app.Options{Adapters: ad, Logger: o.Logger, Transport: mem, Registry: reg})
	if err != nil {
		return sum, err
	}

	// The sample.
	rng := rand.New(rand.NewPCG(o.Seed, 2))
	now := time.Now()
	for i := range o.Requests {
		if err := mem.Enqueue(demoQueue, demoRequest(rng, i, now)); err != nil {
			return sum, err
		}
	}
	sum.Requests = o.Requests

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	start := time.Now()
	go func() { runErr <- a.Run(runCtx) }()

	deadline := time.After(o.Timeout)
	tick := time.NewTicker(o.ProgressEvery)
	defer tick.Stop()
	for done := false; !done; {
		n, more := mem.ResultCount(demoResults)
		if n >= o.Requests {
			break
		}
		select {
		case <-more:
		case <-tick.C:
			if o.Progress != nil {
				el := time.Since(start).Seconds()
				fmt.Fprintf(o.Progress, "progress: %d/%d results, %.0f results/s, %d retries so far\n",
					n, o.Requests, float64(n)/el, int(familySum(reg, "llm_d_async_async_request_retries_total")))
			}
		case <-deadline:
			done = true
		case <-ctx.Done():
			done = true
		}
	}
	sum.Seconds = time.Since(start).Seconds()
	stop()
	if err := <-runErr; err != nil {
		return sum, err
	}

	seen := map[string]int{}
	for _, b := range mem.Results(demoResults) {
		r, err := wire.DecodeResult(b)
		if err != nil {
			return sum, fmt.Errorf("demo: unreadable result: %w", err)
		}
		seen[r.ID]++
		sum.Results++
		switch r.ErrorCode {
		case wire.CodeNone:
			sum.Succeeded++
		case wire.CodeDeadlineExceeded:
			sum.DeadlineExceeded++
		case wire.CodeInvalidRequest:
			sum.Invalid++
		case wire.CodeCancelled:
			sum.Cancelled++
		case wire.CodeGateDropped:
			sum.GateDropped++
		default:
			sum.Failed++
		}
	}
	for i := range o.Requests {
		switch seen[demoID(i)] {
		case 0:
			sum.Missing++
		case 1:
		default:
			sum.Duplicates += seen[demoID(i)] - 1
		}
	}
	sum.DeadLettered = len(mem.DeadLetters(demoQueue))
	sum.Retries = int(familySum(reg, "llm_d_async_async_request_retries_total"))
	if sum.Seconds > 0 {
		sum.Throughput = float64(sum.Results) / sum.Seconds
	}
	st := sim.Stats()
	sum.GatewayRequests, sum.Gateway429 = st.Requests, st.ByStatus[429]
	for code, n := range st.ByStatus {
		if code >= 500 {
			sum.Gateway5xx += n
		}
	}
	if sum.Missing > 0 {
		return sum, fmt.Errorf("demo: %d requests have no result after %s", sum.Missing, o.Timeout)
	}
	return sum, nil
}

// adapters registers what the demos and the memory load run on: the memory
// transport, the constant gate, the aimd gate and the pool-headroom gate
// (the purpose demo's).
func adapters() (app.Adapters, error) {
	ad := app.NewAdapters()
	err := errors.Join(
		ad.Transports.Register(memory.Name, memory.Factory),
		ad.Gates.Register(constant.Type, constant.Factory),
		ad.Gates.Register(aimd.Type, aimd.Factory),
		ad.Gates.Register(headroom.Type, headroom.Factory),
	)
	return ad, err
}

func demoID(i int) string { return "demo-" + strconv.Itoa(i) }

// demoRequest builds request i of the sample.
func demoRequest(rng *rand.Rand, i int, now time.Time) []byte {
	id := demoID(i)
	deadline := now.Add(time.Duration(30+rng.IntN(90)) * time.Second)
	headers := map[string]string{}
	payload := fmt.Sprintf(`{"model":"demo-model","messages":[{"role":"user","content":"question %d"}],"max_tokens":32}`, i)
	switch r := rng.IntN(100); {
	case r < 5: // already expired
		deadline = now.Add(-time.Duration(1+rng.IntN(60)) * time.Second)
	case r < 8: // invalid: the payload is not an object
		return fmt.Appendf(nil, `{"id":%q,"deadline":%d,"payload":"not an object","metadata":{"job_id":"demo"}}`, id, deadline.Unix())
	case r < 10: // the gateway is slower than the deadline
		deadline = now.Add(2 * time.Second)
		headers[simulator.HeaderLatencyMS] = "5000"
	}
	req := map[string]any{
		"id": id, "created": now.Unix(), "deadline": float64(deadline.UnixMilli()) / 1000,
		"payload":  json.RawMessage(payload),
		"metadata": map[string]string{"job_id": "demo", "request_index": strconv.Itoa(i)},
	}
	if len(headers) > 0 {
		req["headers"] = headers
	}
	b, _ := json.Marshal(req)
	return b
}

// familySum adds up every series of a counter or gauge family in reg.
func familySum(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var total float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += metricValue(m)
		}
	}
	return total
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}
