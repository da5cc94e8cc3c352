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

// newFronts builds the fronts cfg turns on (at least one). For the memory
// transport it builds the transport too, which the dispatcher must then
// run on (the returned transport, for app.Options.Transport).
func newFronts(cfg *config.Config, ad app.Adapters, log *slog.Logger) (*fronts, transport.Transport, error) {
	if err := frontProblems(cfg, ad); err != nil {
		return nil, nil, err
	}
	prod, tr, err := newProducer(cfg, ad, log)
	if err != nil {
		return nil, nil, err
	}
	f := &fronts{prod: prod}
	if cfg.BatchAPI.Enabled {
		if f.batch, err = newBatchAPI(cfg, prod, log); err != nil {
			f.close()
			return nil, nil, err
		}
	}
	if cfg.OpenAIAPI.Enabled {
		if f.openai, err = newOpenAIAPI(cfg, prod, log); err != nil {
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

// openAIConfig is openai_api in front/openai's own type (its defaults
// applied by the front).
func openAIConfig(cfg *config.Config) (openai.Config, error) {
	o := cfg.OpenAIAPI
	def, queues, ok := cfg.OpenAIQueues()
	if !ok {
		return openai.Config{}, errors.New("openai_api: default_queue or queues names no configured queue")
	}
	return openai.Config{
		Listen: o.Listen, DefaultQueue: def, Queues: queues, RoutePrefix: o.RoutePrefix,
		DefaultTimeout: o.DefaultTimeout, MaxTimeout: o.MaxTimeout, ResultGrace: o.ResultGrace, KeepAlive: o.KeepAlive,
		MaxBodyBytes: o.MaxBodyBytes, ForwardHeaders: o.ForwardHeaders,
	}, nil
}

// frontProblems runs the fronts' own checks on their parts of cfg (after
// cfg.Validate), with their defaults, and the producer's on the transport
// options: what `sluice validate` reports beside the config's problems.
func frontProblems(cfg *config.Config, ad app.Adapters) error {
	var errs []error
	if cfg.BatchAPI.Enabled || cfg.OpenAIAPI.Enabled {
		if err := ad.Producers.Check(cfg.Transport, cfg.TransportConfig.Options); err != nil {
			errs = append(errs, fmt.Errorf("fronts: %w", err))
		}
	}
	if cfg.OpenAIAPI.Enabled {
		if oc, err := openAIConfig(cfg); err != nil {
			errs = append(errs, err)
		} else {
			oc.SetDefaults()
			errs = append(errs, oc.Validate())
		}
	}
	if cfg.BatchAPI.Enabled {
		var err error
		switch f := cfg.BatchAPI.Files; f.Store {
		case "s3":
			c := s3Files(f)
			c.SetDefaults()
			err = c.Validate()
		case "gcs":
			c := gcsFiles(f)
			c.SetDefaults()
			err = c.Validate()
		default:
			c := diskFiles(f)
			c.SetDefaults()
			err = c.Validate()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("batch_api.files: %w", err))
		}
	}
	return errors.Join(errs...)
}

// openaiAPI is the openai_api section at work: the OpenAI-compatible
// synchronous front on its own listener, through the fronts' producer
// (which it does not close).
type openaiAPI struct {
	front *openai.Front
	ln    net.Listener
	log   *slog.Logger
}

// newOpenAIAPI builds the front of cfg (openai_api.enabled) on prod.
func newOpenAIAPI(cfg *config.Config, prod submit.Producer, log *slog.Logger) (*openaiAPI, error) {
	oc, err := openAIConfig(cfg)
	if err != nil {
		return nil, err
	}
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
