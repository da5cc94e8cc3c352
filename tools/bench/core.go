package main

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice/cmd/sluice/demo"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
)

// okDispatcher answers every request at once, without HTTP: what is left is
// the framework's own cost per message (claim, router, middleware, result).
type okDispatcher struct{}

func (okDispatcher) DoWith(context.Context, dispatch.Target, *wire.Request, dispatch.Overrides) dispatch.Outcome {
	return dispatch.Outcome{Class: dispatch.Success, StatusCode: 200, Body: []byte(`{"ok":true}`)}
}

// coreTargets: the framework's own cost is followed across commits, not
// held to a bound; every request must still be answered 200.
func coreTargets() []target {
	return []target{
		noFailures("failed"),
		reportedOnly("throughput_stub", "the framework's cost per message, compared across commits (docs/benchmarks.md)"),
		reportedOnly("allocs_per_msg_stub", "exact, compared across commits"),
		reportedOnly("throughput_http", "the same through the 0-ms simulator"),
		reportedOnly("allocs_per_msg_http", "exact, compared across commits"),
	}
}

// memoryTargets: the memory transport's line has no baseline to compare with.
func memoryTargets() []target {
	return []target{
		noFailures("failed"),
		reportedOnly("throughput", "the memory transport's rate; no baseline to compare with"),
	}
}

// memoryRate is ok results per second of a MemoryLoad, and its failed results.
func memoryRate(r demo.LoadResult) (rate float64, failed int) {
	var t resultTally
	t.addAll(r.Results)
	return float64(t.ok) / r.Seconds, t.failed + max(0, r.Requests-t.total())
}

// runCore measures the per-message overhead on the memory transport: once
// with no HTTP at all, once through a zero-latency simulator on loopback.
// Throughputs count ok results only; failed is every other result, summed
// over the runs.
func runCore(ctx context.Context, o options) (figures, error) {
	const n = 100_000
	var stubRate, stubAllocs, httpRate, httpAllocs []float64
	failed := 0
	url, stop, err := zeroLatencyGateway()
	if err != nil {
		return nil, err
	}
	defer stop()
	for range o.runs {
		r, err := demo.MemoryLoad(ctx, demo.LoadOptions{Requests: n, Dispatcher: okDispatcher{}})
		if err != nil {
			return nil, fmt.Errorf("stub: %w", err)
		}
		rate, bad := memoryRate(r)
		stubRate, stubAllocs, failed = append(stubRate, rate), append(stubAllocs, r.AllocsPerMsg), failed+bad
		r, err = demo.MemoryLoad(ctx, demo.LoadOptions{Requests: n / 2, GatewayURL: url})
		if err != nil {
			return nil, fmt.Errorf("http: %w", err)
		}
		rate, bad = memoryRate(r)
		httpRate, httpAllocs, failed = append(httpRate, rate), append(httpAllocs, r.AllocsPerMsg), failed+bad
	}
	return figures{
		"messages":            n,
		"failed":              float64(failed),
		"throughput_stub":     median(stubRate),
		"allocs_per_msg_stub": median(stubAllocs),
		"throughput_http":     median(httpRate),
		"allocs_per_msg_http": median(httpAllocs),
		"rss_mb":              rssMB(),
	}, nil
}

// runMemory is the memory transport's line among the per-transport
// scenarios: requests through a 0-ms simulator on loopback, 64 in flight.
func runMemory(ctx context.Context, o options) (figures, error) {
	const n = 50_000
	url, stop, err := zeroLatencyGateway()
	if err != nil {
		return nil, err
	}
	defer stop()
	var rates []float64
	failed := 0
	for range o.runs {
		r, err := demo.MemoryLoad(ctx, demo.LoadOptions{Requests: n, GatewayURL: url})
		if err != nil {
			return nil, err
		}
		rate, bad := memoryRate(r)
		rates, failed = append(rates, rate), failed+bad
	}
	return figures{"requests": n, "throughput": median(rates), "failed": float64(failed), "rss_mb": rssMB()}, nil
}

// zeroLatencyGateway starts a 0-ms simulator on loopback for 64 in flight.
func zeroLatencyGateway() (url string, stop func(), err error) {
	sim, err := simulator.New(simulator.Config{Capacity: 64})
	if err != nil {
		return "", nil, err
	}
	if url, err = sim.Start("127.0.0.1:0"); err != nil {
		return "", nil, err
	}
	return url, func() { _ = sim.Close() }, nil
}
