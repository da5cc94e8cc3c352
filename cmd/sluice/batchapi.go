package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/boltstate"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/filestore"
	"github.com/sluice-io/sluice/front/filestore/disk"
	gcsstore "github.com/sluice-io/sluice/front/filestore/gcs"
	s3store "github.com/sluice-io/sluice/front/filestore/s3"
)

// batchAPI is the batch_api section at work: the OpenAI Batch API beside
// the dispatcher, on the same transport, through the fronts' producer
// (which it does not close).
type batchAPI struct {
	svc   *batch.Service
	ln    net.Listener
	state batch.State
	files filestore.Store
	log   *slog.Logger
}

// newProducer builds the submit.Producer every front of cfg shares: the
// producer side the registry holds for cfg's transport, built from the
// transport's options and the deployment's Redis settings (url, topology,
// redis_tls), so that it reaches the queues as the transport does. When
// the producer reaches them only through a transport of its own (memory),
// that transport is returned too: the dispatcher must then run on it
// (app.Options.Transport).
func newProducer(cfg *config.Config, ad app.Adapters, log *slog.Logger) (submit.Producer, transport.Transport, error) {
	env, err := app.TransportEnv(cfg, log)
	if err != nil {
		return nil, nil, fmt.Errorf("fronts: %w", err)
	}
	p, t, err := ad.Producers.New(cfg.Transport, cfg.TransportConfig.Options, env)
	if err != nil {
		return nil, nil, fmt.Errorf("fronts: %w", err)
	}
	return p, t, nil
}

// openFiles opens the file store batch_api.files chooses.
func openFiles(ctx context.Context, f storeSection) (filestore.Store, error) {
	var (
		st  filestore.Store
		err error
	)
	switch f.store {
	case "s3":
		st, err = s3store.Open(ctx, f.s3)
	case "gcs":
		st, err = gcsstore.Open(ctx, f.gcs)
	default:
		st, err = disk.Open(f.disk)
	}
	if err != nil {
		return nil, fmt.Errorf("batch_api.files: %w", err)
	}
	return st, nil
}

// newBatchAPI builds the Batch API of b (read by readFronts from cfg) on
// prod.
func newBatchAPI(cfg *config.Config, b *batchSection, prod submit.Producer, log *slog.Logger) (*batchAPI, error) {
	files, err := openFiles(context.Background(), b.files)
	if err != nil {
		return nil, err
	}
	var state batch.State
	if b.State.Store == "redis" {
		// Beside the queues: on the connection the producer reaches them
		// on (the transport's url, topology and TLS), else on the
		// deployment's Redis settings.
		if rc, ok := prod.(interface{ Redis() redis.UniversalClient }); ok {
			state, err = redisstate.NewChecked(rc.Redis(), b.State.Prefix)
		} else {
			var env transport.Env
			if env, err = app.TransportEnv(cfg, log); err == nil {
				state, err = redisstate.Dial(cfg.RedisURL, b.State.Prefix, env)
			}
		}
	} else {
		state, err = boltstate.Open(b.State.Path)
	}
	if err != nil {
		closeStore(files)
		return nil, fmt.Errorf("batch_api.state: %w", err)
	}
	fail := func(err error) (*batchAPI, error) {
		_ = state.Close()
		closeStore(files)
		return nil, err
	}
	svc, err := batch.New(b.front, state, files, prod, log.With("component", "batch-api"))
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", b.Listen)
	if err != nil {
		return fail(fmt.Errorf("batch_api.listen: %w", err))
	}
	return &batchAPI{svc: svc, ln: ln, state: state, files: files, log: log}, nil
}

// closeStore closes a file store that holds a client (gcs).
func closeStore(st filestore.Store) {
	if c, ok := st.(io.Closer); ok {
		_ = c.Close()
	}
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
	closeStore(b.files)
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
