package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-io/sluice/internal/simulator"
)

// The concurrency scenarios' shape: requests in all, inFlight at once.
const (
	concurrencyRequests = 60_000
	concurrencyInFlight = 5_000
)

// childBaseline is the value of childEnv under which the child process runs
// the concurrency baseline instead of sluice.
const childBaseline = "baseline"

// concurrencyBaseline is the concurrency scenario without sluice, against
// the same kind of gateway child, warmed up the same way: 5,000 requests in
// flight until 60,000 are done, no queue, no gate, no result writing. Over
// "h2c" it is h2cLoop, a minimal client on golang.org/x/net/http2's framing;
// over "http1", 5,000 goroutines each POST a request through a plain
// net/http Transport, read the answer and POST the next. What this machine
// lets a plain client do with that gateway on the same cores, so that
// sluice's throughput can be read as a ratio to it. A call that fails
// (another status than 200, no answer) is counted in failed, as sluice's
// failed results are, and not in throughput; the run goes on.
func concurrencyBaseline(ctx context.Context, protocol string) (figures, error) {
	gw, err := startGatewayProcess(ctx, time.Second, 2*concurrencyInFlight, gatewayWarmup(), protocol)
	if err != nil {
		return nil, err
	}
	defer gw.stop()
	if protocol == "h2c" {
		start, cpu0 := time.Now(), cpuSeconds()
		failed, err := h2cLoop(ctx, gw.url, concurrencyInFlight, concurrencyRequests)
		if err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		return baselineFigures(gw, time.Since(start), cpuSeconds()-cpu0, failed)
	}
	tr, err := clientTransport(protocol, concurrencyInFlight)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	defer tr.CloseIdleConnections()
	url := gw.url + simulator.PathCompletions
	// The same body and headers sluice sends in the scenario.
	body := []byte(`{"model":"m","prompt":"hi","max_tokens":8}`)
	header := http.Header{
		"Content-Type":           {"application/json"},
		simulator.HeaderDeadline: {strconv.FormatInt(time.Now().Add(10*time.Minute).UnixMilli(), 10)},
	}

	var next, failed atomic.Int64
	var once sync.Once
	start, cpu0 := time.Now(), cpuSeconds()
	var wg sync.WaitGroup
	for range concurrencyInFlight {
		wg.Go(func() {
			for next.Add(1) <= concurrencyRequests && ctx.Err() == nil {
				if err := post(ctx, tr, url, body, header); err != nil {
					failed.Add(1)
					once.Do(func() { fmt.Fprintf(os.Stderr, "bench: concurrency baseline: a call failed: %v\n", err) })
				}
			}
		})
	}
	wg.Wait()
	el, cpu := time.Since(start), cpuSeconds()-cpu0
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return baselineFigures(gw, el, cpu, int(failed.Load()))
}

// baselineFigures are a baseline's figures: its throughput (calls answered
// 200 per second over el), its failed calls, its CPU and the gateway's per
// request, the gateway's wave spreads.
func baselineFigures(gw *gatewayProcess, el time.Duration, cpu float64, failed int) (figures, error) {
	st, err := gw.statsQuery("?wave=" + strconv.Itoa(concurrencyInFlight))
	if err != nil {
		return nil, fmt.Errorf("gateway stats: %w", err)
	}
	f := figures{
		"throughput":                 float64(concurrencyRequests-failed) / el.Seconds(),
		"failed":                     float64(failed),
		"cpu_us_per_request":         cpu / concurrencyRequests * 1e6,
		"gateway_cpu_us_per_request": (gw.stop() - st.WarmupCPU) / concurrencyRequests * 1e6,
	}
	if w := st.Waves; w != nil {
		f["first_wave_ms"], f["last_wave_ms"] = w.FirstSpreadMs, w.LastSpreadMs
	}
	return f, nil
}
