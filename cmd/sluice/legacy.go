package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/transport"
)

// legacyFlags are upstream's flags (llm-d-async v0.9), still rendered by its
// Helm chart. They map onto the same config as the newer flags; a newer flag
// or the config file wins where both are given.
type legacyFlags struct {
	impl string

	ssQueuesFile    string
	ssQueues        string
	ssResultQueue   string
	ssRequestQueue  string
	ssIGWBaseURL    string
	ssRequestPath   string
	ssPollMS        int
	ssBatchSize     int
	ssGateType      string
	ssGateParams    string
	psRequestQueue  string
	psResultQueue   string
	psRetryQueue    string
	psIGWBaseURL    string
	psRequestPath   string
	gcpProject      string
	gcpSubscription string
	gcpResultTopic  string
	gcpTopicsFile   string
	gcpIGWBaseURL   string
	gcpRequestPath  string

	psQueuesFile string
	psQueues     string
	psObjective  string
	ssObjective  string
	gcpObjective string
	gcpBatchSize int
	redisTracing bool
}

// implNames maps --message-queue-impl values to transport names.
var implNames = map[string]string{
	"redis-sortedset": "redis-sortedset",
	"redis-pubsub":    "redis-pubsub",
	"gcp-pubsub":      "gcp-pubsub",
	// gcp-pubsub-gated is gcp-pubsub with the topics' gates on; upstream's
	// plain legacy gcp-pubsub turns them off.
	"gcp-pubsub-gated": "gcp-pubsub",
	"redis-stream":     "redis-stream",
	"memory":           "memory",
}

func (l *legacyFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&l.impl, "message-queue-impl", "redis-pubsub", "legacy: transport (redis-sortedset, redis-pubsub, gcp-pubsub, gcp-pubsub-gated); same as --transport")
	fs.StringVar(&l.ssQueuesFile, "redis.ss.queues-config-file", "", "legacy: queues config file (JSON array of queues, or an object with \"queues\")")
	fs.StringVar(&l.ssQueues, "redis.ss.queues-config", "", "legacy: queues config as inline JSON")
	fs.StringVar(&l.ssResultQueue, "redis.ss.result-queue-name", "result-list", "legacy: result list of the sorted-set transport")
	fs.StringVar(&l.ssRequestQueue, "redis.ss.request-queue-name", "request-sortedset", "legacy: request sorted set, when no queues config is given")
	fs.StringVar(&l.ssIGWBaseURL, "redis.ss.igw-base-url", "", "legacy: gateway base URL, when no queues config is given")
	fs.StringVar(&l.ssRequestPath, "redis.ss.request-path-url", dispatch.DefaultPath, "legacy: request path, when no queues config is given")
	fs.IntVar(&l.ssPollMS, "redis.ss.poll-interval-ms", 1000, "legacy: longest idle wait between claims, in ms (sluice claims again at once while work is waiting)")
	fs.IntVar(&l.ssBatchSize, "redis.ss.batch-size", 10, "legacy: most requests claimed per round trip (sluice raises it to the free credits, up to its own batch size)")
	fs.StringVar(&l.ssGateType, "redis.ss.gate-type", "", "legacy: gate type, when no queues config is given")
	fs.StringVar(&l.ssGateParams, "redis.ss.gate-params", "", "legacy: gate params as JSON, when no queues config is given")
	fs.StringVar(&l.psRequestQueue, "redis.request-queue-name", "request-queue", "legacy: pub/sub request channel")
	fs.StringVar(&l.psResultQueue, "redis.result-queue-name", "result-queue", "legacy: pub/sub result channel")
	fs.StringVar(&l.psRetryQueue, "redis.retry-queue-name", "retry-sortedset", "legacy: pub/sub retry set")
	fs.StringVar(&l.psIGWBaseURL, "redis.igw-base-url", "", "legacy: pub/sub gateway base URL")
	fs.StringVar(&l.psRequestPath, "redis.request-path-url", dispatch.DefaultPath, "legacy: pub/sub request path")
	fs.StringVar(&l.gcpProject, "pubsub.project-id", "", "legacy: GCP project")
	fs.StringVar(&l.gcpSubscription, "pubsub.request-subscriber-id", "", "legacy: request subscription")
	fs.StringVar(&l.gcpResultTopic, "pubsub.result-topic-id", "", "legacy: result topic")
	fs.StringVar(&l.gcpTopicsFile, "pubsub.topics-config-file", "", "legacy: subscriptions config file (JSON array of queues)")
	fs.StringVar(&l.gcpIGWBaseURL, "pubsub.igw-base-url", "", "legacy: gateway base URL for Pub/Sub")
	fs.StringVar(&l.gcpRequestPath, "pubsub.request-path-url", dispatch.DefaultPath, "legacy: request path for Pub/Sub")
	fs.StringVar(&l.psQueuesFile, "redis.queues-config-file", "", "legacy: pub/sub queues config file (JSON array of queues, or an object with \"queues\")")
	fs.StringVar(&l.psQueues, "redis.queues-config", "", "legacy: pub/sub queues config as inline JSON (wins over the file and the single-queue flags)")
	fs.StringVar(&l.psObjective, "redis.inference-objective", "", "legacy: inference objective of the pub/sub single queue (sent as x-gateway-inference-objective)")
	fs.StringVar(&l.ssObjective, "redis.ss.inference-objective", "", "legacy: inference objective of the sorted-set single queue (sent as x-gateway-inference-objective)")
	fs.StringVar(&l.gcpObjective, "pubsub.inference-objective", "", "legacy: inference objective of the Pub/Sub single queue (sent as x-gateway-inference-objective)")
	fs.IntVar(&l.gcpBatchSize, "pubsub.batch-size", 10, "legacy: the most messages one subscription has in flight (each topic's max_concurrency unless it sets one)")
	fs.BoolVar(&l.redisTracing, "redis-tracing", false, "legacy: trace Redis commands; accepted, not implemented yet")
	// Accepted, but kept out of --help; legacyHelp lists them.
	fs.VisitAll(func(f *pflag.Flag) {
		if strings.HasPrefix(f.Usage, "legacy: ") {
			_ = fs.MarkHidden(f.Name)
		}
	})
}

// legacyHelp is the part of serve's help about the hidden legacy flags.
const legacyHelp = `
Upstream's legacy flags are accepted and mapped onto the same configuration
(hidden from the list below; see the README): --message-queue-impl, the
--redis.ss.* family (queues-config-file, queues-config, result-queue-name,
request-queue-name, igw-base-url, request-path-url, poll-interval-ms,
batch-size, gate-type, gate-params, inference-objective), the --redis.*
pub/sub family (queues-config, queues-config-file, request-queue-name,
result-queue-name, retry-queue-name, igw-base-url, request-path-url,
inference-objective), the --pubsub.* family (project-id,
request-subscriber-id, result-topic-id, topics-config-file, igw-base-url,
request-path-url, batch-size, inference-objective) and --redis-tracing.
Upstream's -v and --zap-* flags are accepted too.`

// implFamily is the prefix of the single-queue flags of each transport.
var implFamily = map[string]string{"redis-pubsub": "redis.inference", "redis-sortedset": "redis.ss.", "gcp-pubsub": "pubsub."}

// upstreamResultDefault is the result_queue_name upstream's binary uses
// when a --transport document names none (pkg/redis options).
var upstreamResultDefault = map[string]string{"redis-sortedset": "result-list", "redis-pubsub": "result-queue"}

// newTransportFlags are the flags of upstream's newer path; when one is set,
// upstream ignores every legacy transport flag.
var newTransportFlags = []string{"transport", "transport-config", "transport-config-file"}

// apply maps the legacy flags onto cfg and returns the warnings to log at
// start. Under `sluice serve` (upstream false) only the flags that were set
// count, and a newer flag or the config file wins where both are given. As
// upstream's binary (upstream true) it does what upstream's legacy path does:
// it runs unless a --transport* flag or the config file chose the
// transport, --message-queue-impl defaults to redis-pubsub, the single-queue
// flags' defaults make a queue when no queues config is given, and every
// legacy flag that was set is named in a deprecation warning.
func (l *legacyFlags) apply(fs *pflag.FlagSet, cfg *config.Config, upstream bool) ([]string, error) {
	changed := func(names ...string) bool {
		for _, n := range names {
			if fs.Changed(n) {
				return true
			}
		}
		return false
	}
	var warn, set []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed && strings.HasPrefix(f.Usage, "legacy: ") && f.Name != "request-merge-policy-config" {
			set = append(set, "--"+f.Name)
		}
	})
	if upstream {
		if changed(newTransportFlags...) || cfg.Transport != "" {
			if cfg.Transport == "" {
				cfg.Transport = "redis-pubsub" // upstream's --transport default
			}
			// Upstream's transport documents default the result
			// destination; its chart renders documents without one.
			if d := upstreamResultDefault[cfg.Transport]; d != "" && cfg.TransportConfig.ResultQueueName == "" && len(cfg.TransportConfig.Queues) > 0 {
				cfg.TransportConfig.ResultQueueName = d
			}
			if len(set) > 0 {
				warn = append(warn, fmt.Sprintf("legacy flags ignored because --transport, --transport-config or --transport-config-file (or the config file) sets the transport: %s", strings.Join(set, " ")))
			}
			return warn, nil
		}
		for _, name := range set {
			warn = append(warn, fmt.Sprintf("flag %s is deprecated: use --transport and --transport-config-file", name))
		}
	}
	if (upstream || fs.Changed("message-queue-impl")) && !fs.Changed("transport") {
		name, ok := implNames[l.impl]
		if !ok {
			return nil, fmt.Errorf("--message-queue-impl: unknown value %q (want redis-pubsub, redis-sortedset, gcp-pubsub or gcp-pubsub-gated)", l.impl)
		}
		cfg.Transport = name
	}
	single := func(names ...string) bool { return upstream || changed(names...) }
	tc := &cfg.TransportConfig
	options := map[string]any{}
	switch cfg.Transport {
	case "redis-sortedset":
		if err := l.queues(tc, l.ssQueuesFile, l.ssQueues, "--redis.ss.queues-config"); err != nil {
			return nil, err
		}
		if len(tc.Queues) == 0 && single("redis.ss.request-queue-name", "redis.ss.igw-base-url") {
			q := config.Queue{Queue: transport.Queue{Name: l.ssRequestQueue}, IGWBaseURL: l.ssIGWBaseURL, RequestPathURL: l.ssRequestPath, GateType: l.ssGateType, InferenceObjective: l.ssObjective}
			if l.ssGateParams != "" {
				if err := json.Unmarshal([]byte(l.ssGateParams), &q.GateParams); err != nil {
					return nil, fmt.Errorf("--redis.ss.gate-params: %w", err)
				}
			}
			tc.Queues = append(tc.Queues, q)
		}
		if tc.ResultQueueName == "" && (len(tc.Queues) > 0 || changed("redis.ss.result-queue-name")) {
			tc.ResultQueueName = l.ssResultQueue
		}
		if changed("redis.ss.poll-interval-ms") {
			options["poll_interval_ms"] = l.ssPollMS
		}
		if changed("redis.ss.batch-size") {
			options["batch_size"] = l.ssBatchSize
		}
	case "redis-pubsub":
		if err := l.queues(tc, l.psQueuesFile, l.psQueues, "--redis.queues-config"); err != nil {
			return nil, err
		}
		if len(tc.Queues) == 0 && single("redis.request-queue-name", "redis.igw-base-url") {
			tc.Queues = append(tc.Queues, config.Queue{Queue: transport.Queue{Name: l.psRequestQueue}, IGWBaseURL: l.psIGWBaseURL, RequestPathURL: l.psRequestPath, InferenceObjective: l.psObjective})
		}
		if tc.ResultQueueName == "" && (len(tc.Queues) > 0 || changed("redis.result-queue-name")) {
			tc.ResultQueueName = l.psResultQueue
		}
		if changed("redis.retry-queue-name") {
			options["retry_queue_name"] = l.psRetryQueue
		}
	case "gcp-pubsub":
		if err := l.queues(tc, l.gcpTopicsFile, "", ""); err != nil {
			return nil, err
		}
		if len(tc.Queues) == 0 && single("pubsub.request-subscriber-id") {
			tc.Queues = append(tc.Queues, config.Queue{Queue: transport.Queue{Name: l.gcpSubscription}, IGWBaseURL: l.gcpIGWBaseURL, RequestPathURL: l.gcpRequestPath, InferenceObjective: l.gcpObjective})
		}
		if tc.ResultQueueName == "" && changed("pubsub.result-topic-id") {
			tc.ResultQueueName = l.gcpResultTopic
		}
		if changed("pubsub.project-id") {
			options["project_id"] = l.gcpProject
		}
		if l.impl == "gcp-pubsub" && (upstream || changed("message-queue-impl")) {
			// Upstream's plain legacy gcp-pubsub runs the topics ungated.
			var off []string
			for i := range tc.Queues {
				if tc.Queues[i].GateType != "" {
					off = append(off, tc.Queues[i].Name)
					tc.Queues[i].GateType, tc.Queues[i].GateParams = "", nil
				}
			}
			if len(off) > 0 {
				warn = append(warn, fmt.Sprintf("--message-queue-impl=gcp-pubsub runs topics without their gates, as upstream does (use gcp-pubsub-gated to keep them): gates off on %s", strings.Join(off, ", ")))
			}
		}
	}
	if err := l.check(cfg, upstream); err != nil {
		return nil, err
	}
	for _, o := range []struct{ flag, value string }{{"redis.inference-objective", l.psObjective}, {"redis.ss.inference-objective", l.ssObjective}, {"pubsub.inference-objective", l.gcpObjective}} {
		if o.value != "" && !strings.HasPrefix(o.flag, implFamily[cfg.Transport]) {
			warn = append(warn, fmt.Sprintf("--%s=%s is ignored: it applies only to the single queue of its own transport, and the transport is %s", o.flag, o.value, cfg.Transport))
		}
	}
	if changed("pubsub.batch-size") {
		if cfg.Transport != "gcp-pubsub" {
			warn = append(warn, fmt.Sprintf("--pubsub.batch-size is ignored: it applies to gcp-pubsub, and the transport is %s", cfg.Transport))
		} else {
			// Upstream's batch size is the most messages one subscription has
			// in flight: sluice's max_concurrency, for topics that set none (as
			// batch_size in a topics config file).
			for i := range tc.Queues {
				if tc.Queues[i].MaxConcurrency == 0 {
					tc.Queues[i].MaxConcurrency = l.gcpBatchSize
				}
			}
		}
	}
	if l.redisTracing {
		warn = append(warn, "--redis-tracing is accepted and ignored: Redis commands are not traced yet (requests still are, with OTEL_EXPORTER_OTLP_ENDPOINT or --otlp-endpoint)")
	}
	if len(options) == 0 {
		return warn, nil
	}
	merged := map[string]any{}
	if len(tc.Options) > 0 {
		if err := json.Unmarshal(tc.Options, &merged); err != nil {
			return nil, fmt.Errorf("transport options: %w", err)
		}
	}
	for k, v := range options {
		if _, set := merged[k]; !set {
			merged[k] = v
		}
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return nil, fmt.Errorf("transport options: %w", err)
	}
	tc.Options = b
	return warn, nil
}

// check runs upstream's start-up checks of the legacy path
// (server/options.go): redis implementations need a Redis URL, gcp ones a
// project. They run only as upstream's binary; under `sluice serve` the
// transports' own checks report the same.
func (l *legacyFlags) check(cfg *config.Config, upstream bool) error {
	if !upstream {
		return nil
	}
	opts := map[string]any{}
	if len(cfg.TransportConfig.Options) > 0 {
		_ = json.Unmarshal(cfg.TransportConfig.Options, &opts)
	}
	switch cfg.Transport {
	case "redis-sortedset", "redis-pubsub":
		if cfg.RedisURL == "" && opts["url"] == nil {
			return fmt.Errorf("--message-queue-impl=%s needs a Redis URL: set --redis.url or REDIS_URL", l.impl)
		}
	case "gcp-pubsub":
		if l.gcpProject == "" && opts["project_id"] == nil {
			return fmt.Errorf("--message-queue-impl=%s needs --pubsub.project-id", l.impl)
		}
	}
	return nil
}

// queues reads a legacy queues config (inline, else file, as upstream) into
// tc, unless a newer transport config already set the queues.
func (l *legacyFlags) queues(tc *config.TransportConfig, file, inline, inlineName string) error {
	if len(tc.Queues) > 0 {
		return nil
	}
	data, where := []byte(inline), inlineName
	if strings.TrimSpace(inline) == "" && file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("%s-file: %w", inlineName, err)
		}
		data, where = b, file
	}
	if strings.TrimSpace(string(data)) == "" {
		return nil
	}
	parsed, err := config.ParseQueues(data, where)
	if err != nil {
		return err
	}
	tc.Queues = parsed.Queues
	if parsed.ResultQueueName != "" && tc.ResultQueueName == "" {
		tc.ResultQueueName = parsed.ResultQueueName
	}
	if len(parsed.Options) > 0 && len(tc.Options) == 0 {
		tc.Options = parsed.Options
	}
	return nil
}
