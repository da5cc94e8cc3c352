package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
)

// serveFlags are the flags of serve and validate.
type serveFlags struct {
	configFile          string
	transport           string
	transportConfig     string
	transportConfigFile string
	watchInterval       time.Duration
	concurrency         int
	requestTimeout      time.Duration
	drainTimeout        time.Duration
	prometheusURL       string
	prometheusCacheTTL  time.Duration
	metricsPort         int
	healthPort          int
	listenHost          string
	statusPage          bool
	tlsCA, tlsCert      string
	tlsKey              string
	tlsInsecure         bool
	redisURL            string
	redisURLFile        string
	redisMode           string
	redisAddrs          []string
	redisMasterName     string
	redisTLS            config.TLS
	prometheusURLFile   string
	retryBase           time.Duration
	retryMax            time.Duration
	gateWaitTimeout     time.Duration
	retryMaxAttempts    int
	deadlineHeader      string
	timeoutHeader       string
	gatewayProtocol     string
	otlpEndpoint        string
	traceSampleRatio    float64
	logLevel, logFormat string
	legacy              legacyFlags
	upstreamFlags       upstreamFlags
	// upstream is set when the binary runs as upstream's (no subcommand):
	// upstream's defaults apply (see legacyFlags.apply and
	// upstreamFlags.register).
	upstream bool
	// warnings are the flags' warnings found by load, to be logged at
	// start (the config's own are app.New's to log).
	warnings []string
}

func (f *serveFlags) register(fs *pflag.FlagSet) {
	fs.StringVarP(&f.configFile, "config", "c", "", "sluice config file (JSON); flags override it")
	fs.StringVar(&f.transport, "transport", "", "transport: memory, redis-sortedset, redis-pubsub, redis-stream, gcp-pubsub (default memory)")
	fs.StringVar(&f.transportConfig, "transport-config", "", "transport config as inline JSON: {\"queues\":[...], \"result_queue_name\":..., <transport options>}")
	fs.StringVar(&f.transportConfigFile, "transport-config-file", "", "transport config file (JSON object, or a bare array of queues)")
	fs.DurationVar(&f.watchInterval, "transport-config-watch-interval", 0, "re-read the queue config file this often and apply changed queues without a restart (0: off); needs the queues in a file (--transport-config-file, --config or a legacy queues file), not --transport-config")
	fs.IntVar(&f.concurrency, "concurrency", 0, "workers of the default worker pool: requests in flight of all queues together, when no worker pools are configured (default 64)")
	fs.DurationVar(&f.requestTimeout, "request-timeout", 0, "upper bound of one gateway call when the deadline is further away (default 5m)")
	fs.DurationVar(&f.gateWaitTimeout, "gate-wait-timeout", 5*time.Minute, "how long a request waits on a gate's Wait verdict before it is re-queued with no result (0: until its deadline)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 0, "on SIGTERM, how long requests in flight may finish before they are handed back (default 2m)")
	fs.StringVar(&f.prometheusURL, "prometheus-url", "", "Prometheus server for prometheus-* gates")
	fs.DurationVar(&f.prometheusCacheTTL, "prometheus-cache-ttl", 0, "how long Prometheus answers are reused (default 5s; 0s turns the cache off, as upstream)")
	fs.IntVar(&f.metricsPort, "metrics-port", 0, "port of /metrics (default 9090; -1 disables)")
	fs.IntVar(&f.healthPort, "health-port", 0, "port of /healthz and /readyz (default 8081; -1 disables)")
	fs.StringVar(&f.listenHost, "listen-host", "", "address the metrics and health ports bind to (default all interfaces)")
	fs.BoolVar(&f.statusPage, "status-page", true, "serve the live status page (GET / and /status.json) on the metrics port")
	fs.StringVar(&f.tlsCA, "tls-ca-cert", "", "CA bundle to verify the gateway's certificate")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate for the gateway (with --tls-key)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "client key for the gateway")
	fs.BoolVar(&f.tlsInsecure, "tls-insecure-skip-verify", false, "do not verify the gateway's certificate (testing only)")
	fs.StringVar(&f.redisURL, "redis.url", "", "Redis URL (default $REDIS_URL); redis://, rediss:// (TLS), with user:password for AUTH")
	fs.StringVar(&f.redisURLFile, "redis.url-file", "", "file holding the Redis URL (a mounted secret)")
	fs.StringVar(&f.redisMode, "redis.mode", "", "how the Redis URL is reached: single (default; standalone too), cluster (a Redis Cluster; URL redis://host:port?addr=host2:port2) or sentinel (the URL's host is a sentinel; with --redis.master-name)")
	fs.StringSliceVar(&f.redisAddrs, "redis.addrs", nil, "more cluster nodes or sentinels beside the Redis URL's host (host:port, comma-separated; cluster or sentinel mode)")
	fs.StringVar(&f.redisMasterName, "redis.master-name", "", "the master the sentinels monitor (required with --redis.mode sentinel)")
	fs.StringVar(&f.redisTLS.CACert, "redis.tls-ca-cert", "", "CA bundle to verify the Redis server's certificate (rediss://; redis-stream and redis-pubsub)")
	fs.StringVar(&f.redisTLS.Cert, "redis.tls-cert", "", "client certificate for Redis (mutual TLS, with --redis.tls-key)")
	fs.StringVar(&f.redisTLS.Key, "redis.tls-key", "", "client key for Redis")
	fs.BoolVar(&f.redisTLS.InsecureSkipVerify, "redis.tls-insecure-skip-verify", false, "do not verify the Redis server's certificate (testing only)")
	fs.StringVar(&f.prometheusURLFile, "prometheus-url-file", "", "file holding the Prometheus URL (a mounted secret, when it carries credentials)")
	fs.DurationVar(&f.retryBase, "retry-base", 0, "first retry backoff, doubling per attempt (default 2s)")
	fs.DurationVar(&f.retryMax, "retry-max", 0, "backoff cap (default 60s)")
	fs.IntVar(&f.retryMaxAttempts, "retry-max-attempts", 0, "give up after this many attempts (default 0: retry until the deadline)")
	fs.StringVar(&f.deadlineHeader, "deadline-header", "", "header carrying the deadline in Unix ms (default x-request-deadline; \"off\" disables)")
	fs.StringVar(&f.timeoutHeader, "timeout-header", "", "header carrying the remaining ms (default x-envoy-upstream-rq-timeout-ms; \"off\" disables)")
	fs.StringVar(&f.gatewayProtocol, "gateway-protocol", "", "auto (default: h2c to http:// gateways that accept it, HTTP/1.1 to the others, detected per gateway), http1, or h2c: HTTP/2 with prior knowledge (Envoy accepts it), many requests per connection")
	fs.StringVar(&f.otlpEndpoint, "otlp-endpoint", "", "OpenTelemetry collector (OTLP/HTTP), e.g. http://otel-collector:4318; enables tracing")
	fs.Float64Var(&f.traceSampleRatio, "trace-sample-ratio", 0, "share of requests traced when the producer sent no sampled traceparent (default 0.01)")
	fs.StringVar(&f.logLevel, "log-level", "", "debug, info, warn or error (default info)")
	fs.StringVar(&f.logFormat, "log-format", "", "text or json (default text)")
	f.legacy.register(fs)
	f.upstreamFlags.register(fs, f.upstream)
}

// load builds the config: file, then transport config, then flags set on
// the command line, then the environment.
func (f *serveFlags) load(fs *pflag.FlagSet) (*config.Config, error) {
	cfg := &config.Config{}
	if f.configFile != "" {
		data, err := os.ReadFile(f.configFile)
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		if err := config.ParseInto(data, f.configFile, cfg); err != nil {
			return nil, err
		}
	}
	tcData, tcWhere := []byte(f.transportConfig), "--transport-config"
	if f.transportConfigFile != "" {
		data, err := os.ReadFile(f.transportConfigFile)
		if err != nil {
			return nil, fmt.Errorf("transport config: %w", err)
		}
		tcData, tcWhere = data, f.transportConfigFile
	}
	if len(strings.TrimSpace(string(tcData))) > 0 {
		tc, err := config.ParseQueues(tcData, tcWhere)
		if err != nil {
			return nil, err
		}
		cfg.TransportConfig = tc
	}
	set := func(name string, apply func()) {
		if fs.Changed(name) {
			apply()
		}
	}
	set("transport", func() { cfg.Transport = f.transport })
	set("concurrency", func() { cfg.Concurrency = f.concurrency })
	set("request-timeout", func() { cfg.RequestTimeout = config.Duration(f.requestTimeout) })
	set("gate-wait-timeout", func() { d := config.Duration(f.gateWaitTimeout); cfg.GateWaitTimeout = &d })
	set("drain-timeout", func() { cfg.DrainTimeout = config.Duration(f.drainTimeout) })
	set("prometheus-url", func() { cfg.Prometheus.URL = f.prometheusURL })
	set("prometheus-cache-ttl", func() {
		cfg.Prometheus.CacheTTL = config.Duration(f.prometheusCacheTTL)
		if f.prometheusCacheTTL == 0 {
			// Upstream's 0s turns the cache off; sluice's config reads 0
			// as the default, so the shortest TTL stands for "off".
			cfg.Prometheus.CacheTTL = config.Duration(time.Nanosecond)
		}
	})
	set("metrics-port", func() { cfg.MetricsPort = f.metricsPort })
	set("health-port", func() { cfg.HealthPort = f.healthPort })
	set("listen-host", func() { cfg.ListenHost = f.listenHost })
	set("status-page", func() { cfg.StatusPage = &f.statusPage })
	set("tls-ca-cert", func() { cfg.TLS.CACert = f.tlsCA })
	set("tls-cert", func() { cfg.TLS.Cert = f.tlsCert })
	set("tls-key", func() { cfg.TLS.Key = f.tlsKey })
	set("tls-insecure-skip-verify", func() { cfg.TLS.InsecureSkipVerify = f.tlsInsecure })
	set("redis.tls-ca-cert", func() { cfg.RedisTLS.CACert = f.redisTLS.CACert })
	set("redis.tls-cert", func() { cfg.RedisTLS.Cert = f.redisTLS.Cert })
	set("redis.tls-key", func() { cfg.RedisTLS.Key = f.redisTLS.Key })
	set("redis.tls-insecure-skip-verify", func() { cfg.RedisTLS.InsecureSkipVerify = f.redisTLS.InsecureSkipVerify })
	set("retry-base", func() { cfg.Retry.Base = config.Duration(f.retryBase) })
	set("retry-max", func() { cfg.Retry.Max = config.Duration(f.retryMax) })
	set("retry-max-attempts", func() { cfg.Retry.MaxAttempts = f.retryMaxAttempts })
	set("deadline-header", func() { cfg.Dispatch.DeadlineHeader = f.deadlineHeader })
	set("timeout-header", func() { cfg.Dispatch.TimeoutHeader = f.timeoutHeader })
	set("gateway-protocol", func() { cfg.Dispatch.Protocol = f.gatewayProtocol })
	set("otlp-endpoint", func() { cfg.Tracing.OTLPEndpoint = f.otlpEndpoint })
	set("trace-sample-ratio", func() { cfg.Tracing.SampleRatio = f.traceSampleRatio })
	set("log-level", func() { cfg.Log.Level = f.logLevel })
	set("log-format", func() { cfg.Log.Format = f.logFormat })
	set("redis.url", func() { cfg.RedisURL = f.redisURL })
	set("redis.mode", func() { cfg.RedisMode = f.redisMode })
	set("redis.addrs", func() { cfg.RedisAddrs = f.redisAddrs })
	set("redis.master-name", func() { cfg.RedisMasterName = f.redisMasterName })
	if f.redisURLFile != "" {
		data, err := os.ReadFile(f.redisURLFile)
		if err != nil {
			return nil, fmt.Errorf("--redis.url-file: %w", err)
		}
		cfg.RedisURL = strings.TrimSpace(string(data))
	}
	if cfg.RedisURL == "" {
		cfg.RedisURL = os.Getenv("REDIS_URL")
	}
	if f.prometheusURLFile != "" {
		data, err := os.ReadFile(f.prometheusURLFile)
		if err != nil {
			return nil, fmt.Errorf("--prometheus-url-file: %w", err)
		}
		cfg.Prometheus.URL = strings.TrimSpace(string(data))
	}
	warn, err := f.legacy.apply(fs, cfg, f.upstream)
	if err != nil {
		return nil, err
	}
	more, err := f.upstreamFlags.apply(fs, cfg)
	if err != nil {
		return nil, err
	}
	cfg.SetDefaults()
	// The config's own warnings (config.Warnings) are app.New's and
	// app.CheckWarnings' to say; these are the flags'.
	f.warnings = append(warn, more...)
	return cfg, nil
}

func newServe() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the dispatcher",
		Long: `Run the dispatcher until SIGTERM or SIGINT, then stop claiming, let requests
in flight finish within --drain-timeout, and hand the rest back to the queue.

Configuration comes from --config (a JSON file), then --transport-config-file
or --transport-config (the queues and the transport's options), then flags.
The Redis URL comes from --redis.url, --redis.url-file or $REDIS_URL.
` + legacyHelp,
		Example: `  sluice serve --config sluice.json
  sluice serve --transport redis-sortedset --transport-config-file queues.json
  REDIS_URL=redis://redis:6379 sluice serve --message-queue-impl=redis-sortedset \
      --redis.ss.queues-config-file queues.json --redis.ss.result-queue-name results`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.serve(cmd) },
	}
	f.register(cmd.Flags())
	return cmd
}

// newUpstream is the command run when the binary is started as upstream's
// llm-d-async is: no subcommand, upstream's flags. It is serve with
// upstream's defaults (transport redis-pubsub through --message-queue-impl,
// --metrics-endpoint-auth=true).
func newUpstream() *cobra.Command {
	f := &serveFlags{upstream: true}
	cmd := &cobra.Command{
		Use:   "sluice [flags]",
		Short: "Run the dispatcher as upstream's llm-d-async binary does",
		Long: `Run as a drop-in for upstream's llm-d-async binary: no subcommand, upstream's
flags and defaults (transport redis-pubsub, --metrics-endpoint-auth=true).
Same as "sluice serve" otherwise. Run "sluice help" for the subcommands.
` + legacyHelp,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(cmd *cobra.Command, _ []string) error { return f.serve(cmd) },
	}
	f.register(cmd.Flags())
	return cmd
}

// serve loads the config, logs the start-up warnings and runs until the
// command's context ends.
func (f *serveFlags) serve(cmd *cobra.Command) error {
	cfg, err := f.load(cmd.Flags())
	if err != nil {
		return err
	}
	ad, err := adapters()
	if err != nil {
		return err
	}
	log := app.NewLogger(cfg.Log, os.Stderr)
	setRedisLogger(log)
	for _, w := range f.warnings {
		log.Warn(w)
	}
	reload, err := f.reload(cmd.Flags())
	if err != nil {
		return err
	}
	opts := app.Options{Adapters: ad, Logger: log, MetricsGuard: f.upstreamFlags.metricsGuard(), Version: version, Reload: reload}
	var fr *fronts
	if written(cfg.BatchAPI) || written(cfg.OpenAIAPI) {
		if err := app.Check(cfg, ad); err != nil {
			return err
		}
		if fr, opts.Transport, err = newFronts(cfg, ad, log); err != nil {
			return err
		}
		if fr != nil {
			opts.StatusExtra = fr.figures
		}
	}
	a, err := app.New(cfg, opts)
	if err != nil {
		if fr != nil {
			fr.close()
		}
		return err
	}
	log.Info("sluice starting", "version", version, "transport", cfg.Transport, "queues", len(cfg.TransportConfig.Queues), "flags", flagSummary(cmd.Flags()))
	if fr == nil {
		return a.Run(cmd.Context())
	}
	return runWithFronts(cmd.Context(), a, fr)
}

// reload is the hot reload --transport-config-watch-interval asks for (nil:
// off). It watches the files the queues and the settings around them are
// read from, and loads the config again exactly as at start.
func (f *serveFlags) reload(fs *pflag.FlagSet) (*app.Reload, error) {
	switch {
	case f.watchInterval < 0:
		return nil, fmt.Errorf("--transport-config-watch-interval %s must not be negative (0 turns the reload off)", f.watchInterval)
	case f.watchInterval == 0:
		return nil, nil
	case fs.Changed("transport-config"):
		return nil, errors.New("--transport-config-watch-interval cannot be combined with --transport-config (inline JSON cannot change): give the queues in --transport-config-file")
	}
	var queueFiles []string
	for _, file := range []string{f.transportConfigFile, f.configFile, f.legacy.ssQueuesFile, f.legacy.psQueuesFile, f.legacy.gcpTopicsFile} {
		if file != "" {
			queueFiles = append(queueFiles, file)
		}
	}
	if len(queueFiles) == 0 {
		return nil, errors.New("--transport-config-watch-interval needs the queues in a file: --transport-config-file, --config or a legacy queues file")
	}
	files := queueFiles
	for _, file := range []string{f.upstreamFlags.poolConfigFile, f.upstreamFlags.mergePolicyFile, f.upstreamFlags.mergePolicyAlias} {
		if file != "" {
			files = append(files, file) // a change there is refused, and said so
		}
	}
	return &app.Reload{Interval: f.watchInterval, Files: files, Load: func() (*config.Config, error) { return f.load(fs) }}, nil
}

// flagSummary lists the flags set on the command line, as upstream logs
// them at start, with the secrets redacted.
func flagSummary(fs *pflag.FlagSet) string {
	var parts []string
	fs.Visit(func(fl *pflag.Flag) {
		v := fl.Value.String()
		switch fl.Name {
		case "redis.url", "transport-config":
			v = "<redacted>"
		}
		parts = append(parts, "--"+fl.Name+"="+v)
	})
	return strings.Join(parts, " ")
}

func newValidate() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a configuration and print every problem with where it is",
		Long: `Load the configuration exactly as serve would (same flags) and check it:
unknown fields, missing or invalid values, unknown transports and gate types,
and what each component checks itself: the transport's options, the gates'
parameters, the HTTP client's and the retry policy's settings (with their
defaults). Exit 0 when it is valid, 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			ad, err := adapters()
			if err != nil {
				return err
			}
			cfg, err := f.load(cmd.Flags())
			var warnings []string
			if err == nil {
				_, err = f.reload(cmd.Flags())
			}
			if err == nil {
				warnings, err = app.CheckWarnings(cfg, ad)
				err = errors.Join(err, frontProblems(cfg, ad))
			}
			if err != nil {
				for _, line := range strings.Split(err.Error(), "\n") {
					fmt.Fprintln(out, "error:", line)
				}
				return exitError{1}
			}
			for _, w := range append(f.warnings, warnings...) {
				fmt.Fprintln(out, "warning:", w)
			}
			fmt.Fprintf(out, "ok: transport %s, %d queue(s)\n", cfg.Transport, len(cfg.TransportConfig.Queues))
			return nil
		},
	}
	f.register(cmd.Flags())
	return cmd
}
