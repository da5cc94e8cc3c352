// Package app assembles a sluice deployment from its configuration, over
// interfaces and the adapters it is given: the dispatcher, the transport,
// the gates (one refresh loop per distinct gate definition), the pipeline,
// tracing, and the metrics and health endpoints.
//
// It registers no adapter and links none: the program that embeds sluice
// chooses its transports and gates and registers them in an Adapters value
// (cmd/sluice does so in cmd/sluice/adapters.go; examples/embed is the same
// in thirty lines). Then New builds a deployment and App.Run runs it:
//
//	ad := app.NewAdapters()
//	err := errors.Join(
//		ad.Transports.Register(memory.Name, memory.Factory),
//		ad.Gates.Register(constant.Type, constant.Factory),
//	)
//	a, err := app.New(cfg, app.Options{Adapters: ad})
//	err = a.Run(ctx)
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
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
	"github.com/sluice-io/sluice/core/pipeline"
	"github.com/sluice-io/sluice/core/redact"
	"github.com/sluice-io/sluice/core/status"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transform"
	"github.com/sluice-io/sluice/core/transport"
)

// Adapters are the transports and gates a configuration may name: the two
// namespaces of the registry (core/registry) a deployment is assembled
// from. The assembly registers nothing itself; a nil field reads as an
// empty registry.
type Adapters struct {
	// Transports maps the config's "transport" to a factory.
	Transports *transport.Registry
	// Gates maps each queue's "gate_type" to a factory.
	Gates *gate.Registry
	// Transforms maps a transform file's "type" to a factory.
	Transforms *transform.Registry
	// Producers maps a transport's name to its producer side, for the
	// fronts (batch_api, openai_api): a transport without an entry has
	// none.
	Producers *submit.Registry
}

// NewAdapters returns empty registries, ready for Register.
func NewAdapters() Adapters {
	return Adapters{Transports: transport.NewRegistry(), Gates: gate.NewRegistry(), Transforms: transform.NewRegistry(), Producers: submit.NewRegistry()}
}

func (ad *Adapters) setDefaults() {
	if ad.Transports == nil {
		ad.Transports = transport.NewRegistry()
	}
	if ad.Gates == nil {
		ad.Gates = gate.NewRegistry()
	}
	if ad.Transforms == nil {
		ad.Transforms = transform.NewRegistry()
	}
	if ad.Producers == nil {
		ad.Producers = submit.NewRegistry()
	}
}

// known describes the registries for config validation. With a transport
// given, the config's transport name is only a label and is not checked.
func (ad Adapters) known(transportGiven bool) config.Known {
	k := config.Known{Gate: ad.Gates.Has, Gates: ad.Gates.Names(), Transports: ad.Transports.Names()}
	if !transportGiven {
		k.Transport = ad.Transports.Has
	}
	return k
}

// Options are what an embedding program supplies besides the config.
type Options struct {
	// Adapters are the transports and gates the config may name.
	Adapters Adapters
	// Logger receives the logs (default: discarded).
	Logger *slog.Logger
	// Transport, when set, is used instead of building the config's
	// transport (an embedding program keeps a handle on it, e.g. the memory
	// transport's Enqueue and Results). The config's transport name is then
	// only its label in metrics and need not be registered.
	Transport transport.Transport
	// Registry receives the metrics (default: a new one with the Go and
	// process collectors).
	Registry *prometheus.Registry
	// Dispatcher, when set, replaces the HTTP client (benchmarks of the
	// framework's own overhead, tests).
	Dispatcher pipeline.Dispatcher
	// TracerProvider, when set, is used instead of the one the config's
	// tracing section would build.
	TracerProvider trace.TracerProvider
	// MetricsGuard, when set, checks every request to /metrics and to the
	// status page (core/metricsauth: Kubernetes TokenReview and
	// SubjectAccessReview, as upstream's --metrics-endpoint-auth). Run
	// closes it when it is an io.Closer.
	MetricsGuard MetricsGuard
	// StatusExtra, when set, adds the embedding program's own figures to
	// the status page (core/status.Config.Extra).
	StatusExtra func() []status.Figure
	// Version is shown on the status page (default: the main module's
	// version from the build information, else "dev").
	Version string
	// Reload, when set, makes Run re-read the queue configuration while it
	// runs and apply what changed (upstream's
	// --transport-config-watch-interval; see Reload).
	Reload *Reload
}

// MetricsGuard puts a check in front of the /metrics handler.
type MetricsGuard interface {
	// Wrap returns next behind the check; a request that fails it is
	// answered by the guard and never reaches next.
	Wrap(next http.Handler) http.Handler
}

func (o *Options) setDefaults() {
	o.Adapters.setDefaults()
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
		o.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
}

// App is one assembled deployment.
type App struct {
	cfg         *config.Config
	log         *slog.Logger
	reg         *prometheus.Registry
	client      *dispatch.Client
	transport   transport.Transport
	transform   *transform.Chain         // nil: no transforms
	tracing     *sdktrace.TracerProvider // owned: shut down at the end of Run
	pipe        *pipeline.Pipeline
	servers     []*http.Server
	addrs       map[string]string
	guard       MetricsGuard  // nil: /metrics is open
	gateState   *status.Gates // the gates' state, for the status page
	version     string
	statusExtra func() []status.Figure // Options.StatusExtra
	started     time.Time
	known       config.Known // the registries, to validate a reloaded config
	reload      *Reload      // Options.Reload (nil: no reload)

	// What Reconfigure reads and changes (reload.go).
	gateReg  *gate.Registry
	metrics  *metrics.Metrics
	reconfMu sync.Mutex           // one Reconfigure at a time; guards specs and nGates
	specs    map[string]queueSpec // the running queues by id
	nGates   int                  // the queue gates built so far, for their names

	mu    sync.Mutex
	gates []*gate.Refresher // every gate loop built (queues' and pools')
	live  []config.Queue    // the running queues' config
}

// New defaults and validates cfg against o.Adapters, then builds the
// deployment (build.go has its steps). On error, what was built is closed,
// including o.Transport.
func New(cfg *config.Config, o Options) (*App, error) {
	a, err := newApp(cfg, o)
	return a, redact.Error(err) // a Redis URL's password never leaves in an error
}

func newApp(cfg *config.Config, o Options) (*App, error) {
	o.setDefaults()
	// Every log line of the deployment passes through here: URL passwords
	// and credential values are masked (core/redact).
	o.Logger = slog.New(redact.NewHandler(o.Logger.Handler()))
	cfg.SetDefaults()
	if err := cfg.Validate(o.Adapters.known(o.Transport != nil)); err != nil {
		return nil, err
	}
	if err := o.Reload.validate(); err != nil {
		return nil, err
	}
	// The settings upstream accepts that act on nothing here are said
	// once, at start (an embedder sees them too; cmd/sluice adds only its
	// flags' own).
	for _, w := range cfg.Warnings() {
		o.Logger.Warn(w)
	}
	a := &App{cfg: cfg, log: o.Logger, reg: o.Registry, addrs: map[string]string{}, guard: o.MetricsGuard,
		gateState: status.NewGates(), version: o.Version, started: time.Now(), statusExtra: o.StatusExtra,
		known: o.Adapters.known(o.Transport != nil), reload: o.Reload}
	if err := a.build(o); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// close releases what build built, for a deployment that will not run.
func (a *App) close() {
	for _, g := range a.gateList() {
		_ = g.Close()
	}
	if a.transform != nil {
		if err := a.transform.Close(); err != nil {
			a.log.Warn("closing transforms", "err", err)
		}
		a.transform = nil
	}
	if a.tracing != nil {
		_ = a.tracing.Shutdown(context.Background())
	}
	if a.transport != nil {
		_ = a.transport.Close()
	}
	if a.client != nil {
		a.client.Close()
	}
	a.closeGuard()
}

// closeGuard closes the metrics guard when it has a Close.
func (a *App) closeGuard() {
	if c, ok := a.guard.(io.Closer); ok {
		_ = c.Close()
	}
}

// Pipeline returns the pipeline (for tests and benchmarks).
func (a *App) Pipeline() *pipeline.Pipeline { return a.pipe }

// Registry returns the metrics registry.
func (a *App) Registry() *prometheus.Registry { return a.reg }

// Addr returns the address the named endpoint ("metrics" or "health")
// listens on, once Run started it.
func (a *App) Addr(name string) string { return a.addrs[name] }

// Run serves the endpoints and runs the pipeline until ctx ends, then
// drains (the pipeline closes the gates and the transport).
func (a *App) Run(ctx context.Context) error {
	if err := a.listen(); err != nil {
		a.stopServers(context.Background())
		a.close()
		return redact.Error(err)
	}
	defer a.client.Close()
	if a.reload != nil {
		wctx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			a.watch(wctx, *a.reload)
		}()
		defer func() { stopWatch(); <-watched }()
	}
	err := a.pipe.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if a.tracing != nil {
		if terr := a.tracing.Shutdown(sctx); terr != nil {
			a.log.Warn("flushing traces", "err", terr)
		}
	}
	a.stopServers(sctx)
	a.closeGuard()
	return redact.Error(err)
}

func (a *App) stopServers(ctx context.Context) {
	for _, s := range a.servers {
		_ = s.Shutdown(ctx)
	}
}

// listen starts the metrics and health endpoints that are not disabled.
func (a *App) listen() error {
	for _, ep := range []struct {
		name string
		port int
	}{{"metrics", a.cfg.MetricsPort}, {"health", a.cfg.HealthPort}} {
		if ep.port < 0 {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(a.cfg.ListenHost, strconv.Itoa(ep.port)))
		if err != nil {
			return fmt.Errorf("%s endpoint: %w", ep.name, err)
		}
		a.addrs[ep.name] = ln.Addr().String()
		rht := 10 * time.Second
		if ep.name == "health" {
			rht = 5 * time.Second // upstream's health server
		}
		srv := &http.Server{Handler: a.mux(ep.name), ReadHeaderTimeout: rht}
		a.servers = append(a.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Error("endpoint stopped", "endpoint", ep.name, "err", err)
			}
		}()
	}
	return nil
}

// mux returns the handlers of the named endpoint.
func (a *App) mux(name string) *http.ServeMux {
	m := http.NewServeMux()
	switch name {
	case "metrics":
		var h http.Handler = promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg})
		if a.guard != nil {
			h = a.guard.Wrap(h)
		}
		m.Handle("/metrics", h)
		if a.cfg.StatusPageEnabled() { // core/status: GET / and /status.json, behind the same guard
			var page http.Handler = status.New(status.Config{Pipeline: a.pipe, Gates: a.gateState,
				Transport: a.cfg.Transport, Version: a.version, Started: a.started, Extra: a.statusExtra})
			if a.guard != nil {
				page = a.guard.Wrap(page)
			}
			m.Handle("GET /{$}", page)
			m.Handle("GET /status.json", page)
		}
	case "health":
		m.HandleFunc("/healthz", handleHealthz) // health.go: upstream's bodies and checks
		m.HandleFunc("/readyz", a.handleReadyz)
	}
	return m
}

// NewLogger builds the structured logger of a config's log section (an
// empty level or format reads as the config's default: info, text).
func NewLogger(c config.Log, w *os.File) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
