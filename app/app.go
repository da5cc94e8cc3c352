// Package app assembles a sluice deployment from its configuration: the
// registries of transports and gates (the one place where built-ins are
// registered, explicitly), the dispatcher, the pipeline, and the metrics and
// health endpoints. cmd/sluice is a thin CLI over it; tests, benchmarks and
// programs that embed sluice use it directly.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/metrics"
	mw "github.com/sluice-io/sluice/core/middleware"
	"github.com/sluice-io/sluice/core/pipeline"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/memory"
)

// Registries returns the registries of the built-in transports and gates.
func Registries() (*transport.Registry, *gate.Registry) {
	tr := transport.NewRegistry()
	gr := gate.NewRegistry()
	must(tr.Register(memory.Name, memory.Factory))
	must(gr.Register(constant.Type, constant.Factory))
	registerMore(tr, gr)
	return tr, gr
}

func must(err error) {
	if err != nil {
		panic(err) // a duplicate built-in name is a programming error
	}
}

// Known describes the registries for config validation.
func Known(tr *transport.Registry, gr *gate.Registry) config.Known {
	return config.Known{Transport: tr.Has, Gate: gr.Has, Transports: tr.Names(), Gates: gr.Types()}
}

// Options are what an embedding program may supply.
type Options struct {
	Logger *slog.Logger
	// Transport, when set, is used instead of building one from the config
	// (an embedding program keeps a handle on it, e.g. the memory transport).
	Transport transport.Transport
	// Transports and Gates override the built-in registries.
	Transports *transport.Registry
	Gates      *gate.Registry
	// Registry receives the metrics (default: a new one with Go and process collectors).
	Registry *prometheus.Registry
	// Dispatcher, when set, replaces the HTTP client (benchmarks of the
	// framework's own overhead, tests).
	Dispatcher mw.Dispatcher
	// TracerProvider, when set, is used instead of the one the config's
	// tracing section would build.
	TracerProvider trace.TracerProvider
}

// App is one assembled deployment.
type App struct {
	cfg     *config.Config
	log     *slog.Logger
	pipe    *pipeline.Pipeline
	client  *dispatch.Client
	reg     *prometheus.Registry
	servers []*http.Server
	addrs   map[string]string
	gates   []*gate.Refresher
	tracing *sdktrace.TracerProvider // owned: shut down at the end of Run
}

// New validates cfg (already defaulted or not) and builds the deployment.
func New(cfg *config.Config, o Options) (*App, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Transports == nil || o.Gates == nil {
		tr, gr := Registries()
		if o.Transports == nil {
			o.Transports = tr
		}
		if o.Gates == nil {
			o.Gates = gr
		}
	}
	cfg.SetDefaults()
	if err := cfg.Validate(Known(o.Transports, o.Gates)); err != nil {
		return nil, err
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m, err := metrics.New(reg)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	a := &App{cfg: cfg, log: o.Logger, reg: reg, addrs: map[string]string{}}

	client, err := dispatch.New(dispatch.Config{
		MaxConns:         maxConcurrency(cfg),
		RequestTimeout:   cfg.RequestTimeout.D(),
		DeadlineHeader:   cfg.Dispatch.DeadlineHeader,
		TimeoutHeader:    cfg.Dispatch.TimeoutHeader,
		MaxResponseBytes: cfg.Dispatch.MaxResponseBytes,
		Protocol:         cfg.Dispatch.Protocol,
		TLS: dispatch.TLSConfig{CACert: cfg.TLS.CACert, Cert: cfg.TLS.Cert, Key: cfg.TLS.Key,
			InsecureSkipVerify: cfg.TLS.InsecureSkipVerify},
	})
	if err != nil {
		return nil, fmt.Errorf("dispatch: %w", err)
	}
	a.client = client

	tp := o.Transport
	if tp == nil {
		tp, err = o.Transports.New(cfg.Transport, cfg.TransportConfig.Options, transport.Env{Logger: o.Logger, RedisURL: cfg.RedisURL})
		if err != nil {
			client.Close()
			return nil, err
		}
	}

	if ec, ok := tp.(transport.EventCounter); ok {
		if err := reg.Register(metrics.NewEventsCollector(cfg.Transport, ec.Events)); err != nil {
			return nil, a.fail(tp, fmt.Errorf("metrics: %w", err))
		}
	}

	// One gate (and one refresh loop) per distinct gate definition.
	byDef := map[string]*gate.Refresher{}
	var queues []pipeline.Queue
	for i, q := range cfg.TransportConfig.Queues {
		params, err := gate.ParseParams(q.GateParams)
		if err != nil {
			return nil, a.fail(tp, fmt.Errorf("queues[%d]: %w", i, err))
		}
		def := q.GateType + "\x00" + params.Canonical()
		r, ok := byDef[def]
		if !ok {
			g, err := o.Gates.New(q.GateType, params, gate.Env{
				PrometheusURL: cfg.Prometheus.URL, PrometheusCacheTTL: cfg.Prometheus.CacheTTL.D(),
				RedisURL: cfg.RedisURL, MaxConcurrency: q.MaxConcurrency,
			})
			if err != nil {
				return nil, a.fail(tp, fmt.Errorf("queues[%d] (%s): %w", i, q.ID, err))
			}
			name := q.GateType
			if len(byDef) > 0 {
				name += "#" + strconv.Itoa(len(byDef))
			}
			r = gate.NewRefresher(g, gate.RefresherConfig{
				Name: name, Logger: o.Logger,
				Observe: func(b float64, err error) {
					m.GateBudget.WithLabelValues(name).Set(b)
					if err != nil {
						m.GateFailures.WithLabelValues(name).Inc()
						m.GateFailing.WithLabelValues(name).Set(1)
					} else {
						m.GateFailing.WithLabelValues(name).Set(0)
					}
				},
			})
			byDef[def] = r
			a.gates = append(a.gates, r)
		}
		queues = append(queues, pipeline.Queue{
			Queue:          transport.Queue{ID: q.ID, Name: q.QueueName, ResultName: q.ResultQueueName, Pool: q.Pool},
			Target:         dispatch.Target{BaseURL: q.IGWBaseURL, Path: q.RequestPathURL, InferenceObjective: q.InferenceObjective},
			Gate:           r,
			MaxConcurrency: q.MaxConcurrency,
		})
	}

	var d mw.Dispatcher = client
	if o.Dispatcher != nil {
		d = o.Dispatcher
	}
	tracer := o.TracerProvider
	if tracer == nil && cfg.Tracing.OTLPEndpoint != "" {
		a.tracing, err = newTracerProvider(cfg.Tracing)
		if err != nil {
			return nil, a.fail(tp, err)
		}
		tracer = a.tracing
	}
	a.pipe, err = pipeline.New(pipeline.Config{
		Transport:      tp,
		Dispatcher:     d,
		Queues:         queues,
		Retry:          mw.RetryPolicy{Base: cfg.Retry.Base.D(), Max: cfg.Retry.Max.D(), Jitter: cfg.Retry.Jitter, MaxAttempts: cfg.Retry.MaxAttempts},
		DrainTimeout:   cfg.DrainTimeout.D(),
		Metrics:        m,
		Logger:         o.Logger,
		TracerProvider: tracer,
	})
	if err != nil {
		return nil, a.fail(tp, err)
	}
	return a, nil
}

func (a *App) fail(tp transport.Transport, err error) error {
	for _, g := range a.gates {
		_ = g.Close()
	}
	if a.tracing != nil {
		_ = a.tracing.Shutdown(context.Background())
	}
	_ = tp.Close()
	a.client.Close()
	return err
}

func maxConcurrency(cfg *config.Config) int {
	n := 0
	for _, q := range cfg.TransportConfig.Queues {
		n += q.MaxConcurrency
	}
	return max(n, cfg.Concurrency)
}

// Pipeline returns the pipeline (for tests and benchmarks).
func (a *App) Pipeline() *pipeline.Pipeline { return a.pipe }

// Registry returns the metrics registry.
func (a *App) Registry() *prometheus.Registry { return a.reg }

// Addr returns the address the named endpoint ("metrics" or "health")
// listens on, once Run started it.
func (a *App) Addr(name string) string { return a.addrs[name] }

// Run serves the endpoints and runs the pipeline until ctx ends, then drains.
func (a *App) Run(ctx context.Context) error {
	defer a.client.Close()
	if err := a.listen(); err != nil {
		for _, g := range a.gates {
			_ = g.Close()
		}
		return err
	}
	err := a.pipe.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if a.tracing != nil {
		if terr := a.tracing.Shutdown(sctx); terr != nil {
			a.log.Warn("flushing traces", "err", terr)
		}
	}
	for _, s := range a.servers {
		_ = s.Shutdown(sctx)
	}
	return err
}

func (a *App) listen() error {
	host := a.cfg.ListenHost
	mux := func(name string) *http.ServeMux {
		m := http.NewServeMux()
		switch name {
		case "metrics":
			m.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
		case "health":
			m.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
			m.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
				if !a.pipe.Ready() {
					http.Error(w, "not ready", http.StatusServiceUnavailable)
					return
				}
				_, _ = w.Write([]byte("ready\n"))
			})
		}
		return m
	}
	for _, ep := range []struct {
		name string
		port int
	}{{"metrics", a.cfg.MetricsPort}, {"health", a.cfg.HealthPort}} {
		if ep.port < 0 {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(ep.port)))
		if err != nil {
			return fmt.Errorf("%s endpoint: %w", ep.name, err)
		}
		a.addrs[ep.name] = ln.Addr().String()
		srv := &http.Server{Handler: mux(ep.name), ReadHeaderTimeout: 10 * time.Second}
		a.servers = append(a.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("endpoint stopped", "endpoint", ep.name, "err", err)
			}
		}()
	}
	return nil
}

// NewLogger builds the structured logger of a config's log section.
func NewLogger(c config.Log, w *os.File) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// Check builds (and closes) the transport and every gate of a validated
// config, so that their own options are checked too. Factories do no I/O
// at construction, so Check needs no server.
func Check(cfg *config.Config, tr *transport.Registry, gr *gate.Registry) error {
	var errs []error
	tp, err := tr.New(cfg.Transport, cfg.TransportConfig.Options, transport.Env{RedisURL: cfg.RedisURL})
	if err != nil {
		errs = append(errs, fmt.Errorf("transport_config: %w", err))
	} else {
		_ = tp.Close()
	}
	for i, q := range cfg.TransportConfig.Queues {
		params, err := gate.ParseParams(q.GateParams)
		if err == nil {
			var g gate.Gate
			g, err = gr.New(q.GateType, params, gate.Env{PrometheusURL: cfg.Prometheus.URL,
				PrometheusCacheTTL: cfg.Prometheus.CacheTTL.D(), RedisURL: cfg.RedisURL, MaxConcurrency: q.MaxConcurrency})
			if c, ok := g.(interface{ Close() error }); ok && err == nil {
				_ = c.Close()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("transport_config.queues[%d].gate_params: %w", i, err))
		}
	}
	return errors.Join(errs...)
}
