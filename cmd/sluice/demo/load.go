package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/pipeline"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

// LoadOptions configure MemoryLoad.
type LoadOptions struct {
	// Requests is how many requests to push through (default 100,000).
	Requests int
	// Concurrency is the queue's in-flight limit (default 64).
	Concurrency int
	// GatewayURL is the gateway's base URL; ignored when Dispatcher is set.
	GatewayURL string
	// Dispatcher replaces the HTTP client (to measure the framework alone).
	Dispatcher pipeline.Dispatcher
}

// LoadResult is what MemoryLoad measured.
type LoadResult struct {
	Requests      int
	Seconds       float64
	PerSecond     float64
	AllocsPerMsg  float64
	BytesPerMsg   float64
	MaxGoroutines int
	// Results are the result messages written, in order (for a caller that
	// counts them by what they say, not by how many).
	Results [][]byte
}

// MemoryLoad enqueues Requests into the memory transport, runs sluice until
// each has its result, and measures throughput and allocations per message
// (all goroutines, from the first claim to the last result; the enqueue is
// not counted).
func MemoryLoad(ctx context.Context, o LoadOptions) (LoadResult, error) {
	if o.Requests <= 0 {
		o.Requests = 100_000
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	url := o.GatewayURL
	if url == "" {
		url = "http://127.0.0.1:1" // unused with a Dispatcher
	}
	mem := memory.New(memory.Options{})
	const q, res = "bench:requests", "bench:results"
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: o.Concurrency, MetricsPort: -1, HealthPort: -1,
		DrainTimeout: config.Duration(10 * time.Second),
		TransportConfig: config.TransportConfig{ResultQueueName: res,
			Queues: []config.Queue{{Queue: transport.Queue{Name: q}, IGWBaseURL: url}}},
	}
	ad, err := adapters()
	if err != nil {
		return LoadResult{}, err
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem, Dispatcher: o.Dispatcher, Registry: prometheus.NewRegistry()})
	if err != nil {
		return LoadResult{}, err
	}
	deadline := float64(time.Now().Add(time.Hour).UnixMilli()) / 1000
	for i := range o.Requests {
		b, _ := json.Marshal(map[string]any{
			"id": "r" + strconv.Itoa(i), "deadline": deadline, "created": time.Now().Unix(),
			"payload":  json.RawMessage(`{"model":"m","prompt":"hello","max_tokens":8}`),
			"metadata": map[string]string{"job_id": "bench", "request_index": strconv.Itoa(i)},
		})
		if err := mem.Enqueue(q, b); err != nil {
			return LoadResult{}, err
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- a.Run(runCtx) }()
	maxG := 0
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n, more := mem.ResultCount(res)
		if n >= o.Requests {
			break
		}
		select {
		case <-more:
		case <-tick.C:
			maxG = max(maxG, runtime.NumGoroutine())
		case <-ctx.Done():
			stop()
			<-errc
			return LoadResult{}, ctx.Err()
		}
	}
	el := time.Since(start)
	runtime.ReadMemStats(&after)
	stop()
	if err := <-errc; err != nil {
		return LoadResult{}, fmt.Errorf("run: %w", err)
	}
	n := float64(o.Requests)
	return LoadResult{
		Requests: o.Requests, Seconds: el.Seconds(), PerSecond: n / el.Seconds(),
		AllocsPerMsg:  float64(after.Mallocs-before.Mallocs) / n,
		BytesPerMsg:   float64(after.TotalAlloc-before.TotalAlloc) / n,
		MaxGoroutines: maxG,
		Results:       mem.Results(res),
	}, nil
}
