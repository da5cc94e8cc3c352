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

// runCore measures the per-message overhead on the memory transport: once
// with no HTTP at all, once through a zero-latency simulator on loopback.
func runCore(ctx context.Context, o options) (figures, error) {
	const n = 100_000
	var stubRate, stubAllocs, httpRate, httpAllocs []float64
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
		stubRate, stubAllocs = append(stubRate, r.PerSecond), append(stubAllocs, r.AllocsPerMsg)
		r, err = demo.MemoryLoad(ctx, demo.LoadOptions{Requests: n / 2, GatewayURL: url})
		if err != nil {
			return nil, fmt.Errorf("http: %w", err)
		}
		httpRate, httpAllocs = append(httpRate, r.PerSecond), append(httpAllocs, r.AllocsPerMsg)
	}
	return figures{
		"messages":            n,
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
	for range o.runs {
		r, err := demo.MemoryLoad(ctx, demo.LoadOptions{Requests: n, GatewayURL: url})
		if err != nil {
			return nil, err
		}
		rates = append(rates, r.PerSecond)
	}
	return figures{"requests": n, "throughput": median(rates), "rss_mb": rssMB()}, nil
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
