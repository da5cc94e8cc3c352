package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/boltstate"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/filestore/disk"
	"github.com/sluice-io/sluice/front/submit"
	submitmem "github.com/sluice-io/sluice/front/submit/memory"
	submitrss "github.com/sluice-io/sluice/front/submit/redissortedset"
	"github.com/sluice-io/sluice/transports/memory"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// batchAPI is the batch_api section at work: the OpenAI Batch API beside
// the dispatcher, on the same transport.
type batchAPI struct {
	svc   *batch.Service
	ln    net.Listener
	state batch.State
	prod  submit.Producer
	log   *slog.Logger
}

// newBatchAPI builds the Batch API of cfg (batch_api.enabled). For the
// memory transport it builds the transport too, which the dispatcher must
// then run on (the returned transport, for app.Options.Transport).
func newBatchAPI(cfg *config.Config, ad app.Adapters, log *slog.Logger) (*batchAPI, transport.Transport, error) {
	b := cfg.BatchAPI
	q := cfg.BatchQueue()
	if q == nil {
		return nil, nil, errors.New("batch_api.queue: names no configured queue")
	}
	var tr transport.Transport
	var prod submit.Producer
	switch cfg.Transport {
	case memory.Name:
		t, err := ad.Transports.New(cfg.Transport, cfg.TransportConfig.Options, transport.Env{Logger: log})
		if err != nil {
			return nil, nil, err
		}
		mem, ok := t.(*memory.Transport)
		if !ok {
			return nil, nil, fmt.Errorf("batch_api: transport %s is not the memory transport", cfg.Transport)
		}
		tr, prod = mem, submitmem.New(mem, submitmem.Options{})
	case rss.Name:
		var o struct {
			Prefix string `json:"prefix"`
		}
		if len(cfg.TransportConfig.Options) > 0 {
			_ = json.Unmarshal(cfg.TransportConfig.Options, &o) // the transport checks its options strictly
		}
		p, err := producer.Dial(cfg.RedisURL, producer.Config{Prefix: o.Prefix, Mode: cfg.RedisMode})
		if err != nil {
			return nil, nil, fmt.Errorf("batch_api: %w", err)
		}
		prod = submitrss.New(p, submitrss.Options{})
	default:
		return nil, nil, fmt.Errorf("batch_api: transport %s has no producer here (memory, redis-sortedset)", cfg.Transport)
	}
	fail := func(err error) (*batchAPI, transport.Transport, error) {
		_ = prod.Close()
		return nil, nil, err
	}
	files, err := disk.Open(disk.Config{Dir: b.Files.Dir})
	if err != nil {
		return fail(fmt.Errorf("batch_api.files: %w", err))
	}
	var state batch.State
	if b.State.Store == "redis" {
		state, err = redisstate.Dial(cfg.RedisURL, b.State.Prefix)
	} else {
		state, err = boltstate.Open(b.State.Path)
	}
	if err != nil {
		return fail(fmt.Errorf("batch_api.state: %w", err))
	}
	svc, err := batch.New(batch.Config{Queue: q.Name, Windows: b.CompletionWindows, FileExpiry: b.FileExpiry.D()}, state, files, prod, log.With("component", "batch-api"))
	if err != nil {
		_ = state.Close()
		return fail(err)
	}
	ln, err := net.Listen("tcp", b.Listen)
	if err != nil {
		_ = state.Close()
		return fail(fmt.Errorf("batch_api.listen: %w", err))
	}
	return &batchAPI{svc: svc, ln: ln, state: state, prod: prod, log: log}, tr, nil
}

// runWithBatchAPI runs the dispatcher a beside the Batch API b until ctx
// ends or the dispatcher does.
func runWithBatchAPI(ctx context.Context, a *app.App, b *batchAPI) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.run(ctx)
	}()
	err := a.Run(ctx)
	stop() // the dispatcher ended (an error at start, or shutdown): so does the API
	<-done
	return err
}

// run serves the API and processes jobs until ctx ends, then closes what
// it opened.
func (b *batchAPI) run(ctx context.Context) {
	srv := &http.Server{Handler: b.svc.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(b.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			b.log.Error("batch api: serving failed", "err", err)
		}
	}()
	b.log.Info("batch api listening", "addr", b.ln.Addr().String())
	_ = b.svc.Run(ctx)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-served
	_ = b.state.Close()
	_ = b.prod.Close()
}

// figures are the status page's lines for the newest batches.
func (b *batchAPI) figures() []status.Figure {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sums, err := b.svc.Summaries(ctx, 10)
	if err != nil {
		return []status.Figure{{Label: "batches", Value: "unavailable: " + err.Error()}}
	}
	out := []status.Figure{{Label: "Batch API", Value: "http://" + b.ln.Addr().String() + "/v1/batches"}}
	for _, s := range sums {
		out = append(out, status.Figure{Label: "batch " + s.ID, Value: s.String()})
	}
	return out
}
