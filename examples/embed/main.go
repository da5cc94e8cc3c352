// Command embed runs sluice inside a program of its own, as an embedder
// would: it chooses the adapters (the memory transport and the constant
// gate), writes the configuration in code, enqueues three requests for an
// in-process gateway (one already past its deadline), runs sluice until each
// has its one result, and prints the results.
//
//	go run ./examples/embed
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/memory"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"echo":%s}`, body)
	}))
	defer gw.Close()

	ad := app.NewAdapters() // the adapters this program links, registered explicitly
	if err := errors.Join(
		ad.Transports.Register(memory.Name, memory.Factory),
		ad.Gates.Register(constant.Type, constant.Factory),
	); err != nil {
		return err
	}
	cfg := &config.Config{
		Transport: memory.Name, Concurrency: 8, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "results",
			Queues: []config.Queue{{Queue: transport.Queue{Name: "requests"}, IGWBaseURL: gw.URL, GateType: constant.Type}}},
	}
	mem := memory.New(memory.Options{}) // given to New, to enqueue and read results
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: mem})
	if err != nil {
		return err
	}

	now := time.Now()
	for i, deadline := range []time.Time{now.Add(time.Minute), now.Add(time.Minute), now.Add(-time.Second)} {
		req := fmt.Appendf(nil, `{"id":"req-%d","deadline":%d,"payload":{"prompt":"hello %d"}}`, i, deadline.Unix(), i)
		if err := mem.Enqueue("requests", req); err != nil {
			return err
		}
	}
	runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	for n, more := mem.ResultCount("results"); n < 3 && runCtx.Err() == nil; n, more = mem.ResultCount("results") {
		select {
		case <-more:
		case <-runCtx.Done():
		}
	}
	stop() // stop claiming, drain, close
	if err := <-done; err != nil {
		return err
	}
	results := mem.Results("results")
	slices.SortFunc(results, bytes.Compare) // by id: it is the first field
	for _, r := range results {
		fmt.Fprintf(out, "%s\n", r)
	}
	return nil
}
