package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/metricsauth"
)

// upstreamFlags are the current flags of upstream's binary (llm-d-async,
// server/options.go) that sluice has no flag of its own for. Each is
// accepted; where sluice has the feature it maps onto the config, and where
// the feature comes later the flag's file is read and checked as JSON and
// one warning at start says what sluice does instead.
type upstreamFlags struct {
	verbosity           int
	metricsAuth         bool
	poolConfigFile      string
	mergePolicyFile     string
	mergePolicyAlias    string
	transformConfigFile string
	backlogPoll         time.Duration
	zapDevel            bool
	zapEncoder          string
	zapLogLevel         string
	zapStacktraceLevel  string
	zapTimeEncoding     string

	// authConfig is where the metrics guard finds the API server and the
	// service-account files (zero: in-cluster defaults; tests point it at
	// a fake).
	authConfig metricsauth.Config
	// guard protects /metrics when --metrics-endpoint-auth is true and
	// /metrics is served.
	guard *metricsauth.Guard
}

// register adds the flags. upstream says whether the binary runs as
// upstream's (no subcommand): then --metrics-endpoint-auth defaults to true
// as upstream's binary does; under `sluice serve` it defaults to false.
func (u *upstreamFlags) register(fs *pflag.FlagSet, upstream bool) {
	fs.IntVarP(&u.verbosity, "v", "v", 2, "upstream: log verbosity; 0 logs at info, 1 or more at debug (--log-level wins)")
	fs.BoolVar(&u.metricsAuth, "metrics-endpoint-auth", upstream, "Kubernetes authn/authz in front of /metrics: each scrape's bearer token is checked by a TokenReview and a SubjectAccessReview (get /metrics) against the in-cluster API; true refuses to start outside a cluster")
	fs.StringVar(&u.poolConfigFile, "pool-config-file", "", "worker pools (JSON array of {id, workers, gate_type, gate_params}); needs a queue config; without it one pool \"default\" of --concurrency workers serves every queue")
	fs.StringVar(&u.mergePolicyFile, "request-merge-policy-config-file", "", "request merge policy ({\"type\": \"random-robin\"|\"tier-priority\", \"parameters\": {...}}): how a pool's workers are shared, fairness and priority headers")
	fs.StringVar(&u.mergePolicyAlias, "request-merge-policy-config", "", "legacy: same as --request-merge-policy-config-file")
	fs.StringVar(&u.transformConfigFile, "transform-config-file", "", "request body transforms ({\"requestTransforms\": [{\"name\", \"type\", \"parameters\"}]}), e.g. gcs_uri_multipart")
	fs.DurationVar(&u.backlogPoll, "metrics-backlog-poll-interval", 15*time.Second, "interval of the broker backlog poll (broker_backlog gauge); 0 disables it")
	fs.BoolVar(&u.zapDevel, "zap-devel", true, "upstream: zap development mode; accepted and ignored")
	fs.StringVar(&u.zapEncoder, "zap-encoder", "", "upstream: json or console; same as --log-format json or text")
	fs.StringVar(&u.zapLogLevel, "zap-log-level", "", "upstream: accepted and ignored, with a warning (as in upstream, -v decides; sluice: --log-level)")
	fs.StringVar(&u.zapStacktraceLevel, "zap-stacktrace-level", "", "upstream: accepted and ignored")
	fs.StringVar(&u.zapTimeEncoding, "zap-time-encoding", "", "upstream: accepted and ignored")
	for _, name := range []string{"v", "zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding", "request-merge-policy-config"} {
		_ = fs.MarkHidden(name)
	}
}

// errMetricsAuth starts the message when --metrics-endpoint-auth=true cannot
// protect /metrics (outside a cluster, unreadable service-account files);
// the cause and what to do instead follow.
const errMetricsAuth = "--metrics-endpoint-auth=true: /metrics is protected by Kubernetes TokenReview/SubjectAccessReview " +
	"against the in-cluster API server, and sluice will not serve it unprotected"

// metricsAuthInstead is what the refusal suggests.
const metricsAuthInstead = "run in a Kubernetes pod, pass --metrics-endpoint-auth=false (what upstream's Helm chart renders " +
	"by default, ap.metrics.secure=false) to serve /metrics without auth, or --metrics-port=-1 to turn /metrics off"

// apply maps the flags onto cfg, checks the files they name, and returns
// the warnings to log at start. It runs after the other flags are applied
// and before the defaults.
func (u *upstreamFlags) apply(fs *pflag.FlagSet, cfg *config.Config) ([]string, error) {
	var warn []string
	if fs.Changed("v") && !fs.Changed("log-level") {
		if u.verbosity >= 1 {
			cfg.Log.Level = "debug"
		} else {
			cfg.Log.Level = "info"
		}
	}
	if fs.Changed("zap-encoder") && !fs.Changed("log-format") {
		switch u.zapEncoder {
		case "json":
			cfg.Log.Format = "json"
		case "console":
			cfg.Log.Format = "text"
		default:
			return nil, fmt.Errorf("--zap-encoder: unknown value %q (want json or console)", u.zapEncoder)
		}
	}
	for _, name := range []string{"zap-devel", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding"} {
		if fs.Changed(name) {
			warn = append(warn, fmt.Sprintf("--%s is accepted and ignored: sluice logs with log/slog (--log-level, --log-format)", name))
		}
	}
	policyFlag, policyFile := "request-merge-policy-config-file", u.mergePolicyFile
	if policyFile == "" && u.mergePolicyAlias != "" {
		policyFlag, policyFile = "request-merge-policy-config", u.mergePolicyAlias
		warn = append(warn, "--request-merge-policy-config is deprecated: use --request-merge-policy-config-file")
	}
	if policyFile != "" {
		if err := checkJSONFile(policyFlag, policyFile); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(policyFile)
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", policyFlag, err)
		}
		if cfg.MergePolicy, err = config.ParseMergePolicy(data, policyFile); err != nil {
			return nil, fmt.Errorf("--%s: %w", policyFlag, err)
		}
	}
	if u.transformConfigFile != "" {
		if err := checkJSONFile("transform-config-file", u.transformConfigFile); err != nil {
			return nil, err
		}
		cfg.TransformConfigFile = u.transformConfigFile
	}
	if u.poolConfigFile != "" {
		if len(cfg.TransportConfig.Queues) == 0 {
			return nil, errors.New("--pool-config-file: pool-config-file can only be specified when a transport/queues config is also specified")
		}
		if err := checkJSONFile("pool-config-file", u.poolConfigFile); err != nil {
			return nil, err
		}
		data, err := os.ReadFile(u.poolConfigFile)
		if err != nil {
			return nil, fmt.Errorf("--pool-config-file: %w", err)
		}
		pools, err := config.ParseWorkerPools(data, u.poolConfigFile)
		if err != nil {
			return nil, fmt.Errorf("--pool-config-file: %w", err)
		}
		if len(cfg.WorkerPools) > 0 {
			warn = append(warn, fmt.Sprintf("--pool-config-file=%s replaces the config's worker_pools", u.poolConfigFile))
		}
		cfg.WorkerPools = pools
	}
	if fs.Changed("metrics-backlog-poll-interval") {
		cfg.BacklogPollInterval = config.Duration(u.backlogPoll)
		if u.backlogPoll <= 0 {
			cfg.BacklogPollInterval = -1 // upstream: 0 disables the poll
		}
	}
	u.guard = nil
	if u.metricsAuth && cfg.MetricsPort != -1 {
		ac := u.authConfig
		if ac.Logger == nil {
			ac.Logger = app.NewLogger(cfg.Log, os.Stderr) // review failures (500s) are logged
		}
		g, err := metricsauth.New(ac)
		if err != nil {
			return nil, fmt.Errorf("%s: %w; %s", errMetricsAuth, err, metricsAuthInstead)
		}
		u.guard = g
	}
	return warn, nil
}

// metricsGuard returns the guard for app.Options (nil, not a nil pointer,
// when /metrics is open).
func (u *upstreamFlags) metricsGuard() app.MetricsGuard {
	if u.guard == nil {
		return nil
	}
	return u.guard
}

// checkJSONFile reads path and checks that it holds one JSON value, naming
// flag in the error.
func checkJSONFile(flag, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	if strings.TrimSpace(string(data)) == "" {
		return fmt.Errorf("--%s: %s is empty, want a JSON document", flag, path)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("--%s: %s is not valid JSON: %w", flag, path, err)
	}
	return nil
}
