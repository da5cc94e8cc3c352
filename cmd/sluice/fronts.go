package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/openai"
)

// fronts are the batch_api and openai_api sections at work beside the
// dispatcher: whichever are on, sharing one producer onto the transport.
type fronts struct {
	prod   submit.Producer
	batch  *batchAPI  // nil when batch_api is off
	openai *openaiAPI // nil when openai_api is off
}

// newFronts builds the fronts cfg turns on (nil when none is), after
// readFronts' checks. For the memory transport it builds the transport
// too, which the dispatcher must then run on (the returned transport, for
// app.Options.Transport).
func newFronts(cfg *config.Config, ad app.Adapters, log *slog.Logger) (*fronts, transport.Transport, error) {
	fc, err := readFronts(cfg, ad)
	if err != nil {
		return nil, nil, err
	}
	if fc.batch == nil && fc.openai == nil {
		return nil, nil, nil
	}
	prod, tr, err := newProducer(cfg, ad, log)
	if err != nil {
		return nil, nil, err
	}
	f := &fronts{prod: prod}
	if fc.batch != nil {
		if f.batch, err = newBatchAPI(cfg, fc.batch, prod, log); err != nil {
			f.close()
			return nil, nil, err
		}
	}
	if fc.openai != nil {
		if f.openai, err = newOpenAIAPI(fc.openai.Config, prod, log); err != nil {
			f.close()
			return nil, nil, err
		}
	}
	return f, tr, nil
}

// runWithFronts runs the dispatcher a beside the fronts f until ctx ends
// or the dispatcher does.
func runWithFronts(ctx context.Context, a *app.App, f *fronts) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(ctx)
	}()
	err := a.Run(ctx)
	stop() // the dispatcher ended (an error at start, or shutdown): so do the fronts
	<-done
	return err
}

// close releases what newFronts opened, for a start that failed.
func (f *fronts) close() {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f.run(ctx)
}

// run serves the fronts until ctx ends, then closes what they opened and
// the producer.
func (f *fronts) run(ctx context.Context) {
	var wg sync.WaitGroup
	if f.batch != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.batch.run(ctx)
		}()
	}
	if f.openai != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.openai.run(ctx)
		}()
	}
	wg.Wait()
	_ = f.prod.Close()
}

// figures are the status page's lines of the fronts.
func (f *fronts) figures() []status.Figure {
	var out []status.Figure
	if f.openai != nil {
		out = append(out, status.Figure{Label: "OpenAI API", Value: "http://" + f.openai.ln.Addr().String() + "/v1/chat/completions"})
	}
	if f.batch != nil {
		out = append(out, f.batch.figures()...)
	}
	return out
}

// openaiAPI is the openai_api section at work: the OpenAI-compatible
// synchronous front on its own listener, through the fronts' producer
// (which it does not close).
type openaiAPI struct {
	front *openai.Front
	ln    net.Listener
	log   *slog.Logger
}

// newOpenAIAPI builds the front of oc (openai_api, read by readFronts) on
// prod.
func newOpenAIAPI(oc openai.Config, prod submit.Producer, log *slog.Logger) (*openaiAPI, error) {
	log = log.With("component", "openai-api")
	front, err := openai.NewWithLogger(oc, prod, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", oc.Listen)
	if err != nil {
		_ = front.Close()
		return nil, fmt.Errorf("openai_api.listen: %w", err)
	}
	return &openaiAPI{front: front, ln: ln, log: log}, nil
}

// run serves the front until ctx ends. Calls still waiting then get 5
// seconds to be answered before their connections are closed.
func (o *openaiAPI) run(ctx context.Context) {
	srv := &http.Server{Handler: o.front, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(o.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.log.Error("openai api: serving failed", "err", err)
		}
	}()
	o.log.Info("openai api listening", "addr", o.ln.Addr().String())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		_ = srv.Close()
	}
	<-served
	_ = o.front.Close()
}
