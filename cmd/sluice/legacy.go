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
}

// implNames maps --message-queue-impl values to transport names.
var implNames = map[string]string{
	"redis-sortedset": "redis-sortedset",
	"redis-pubsub":    "redis-pubsub",
	"gcp-pubsub":      "gcp-pubsub",
	"redis-stream":    "redis-stream",
	"memory":          "memory",
}

func (l *legacyFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&l.impl, "message-queue-impl", "", "legacy: transport (redis-sortedset, redis-pubsub, gcp-pubsub); same as --transport")
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
batch-size, gate-type, gate-params), the --redis.* pub/sub family
(request-queue-name, result-queue-name, retry-queue-name, igw-base-url,
request-path-url) and the --pubsub.* family (project-id,
request-subscriber-id, result-topic-id, topics-config-file, igw-base-url).`

// apply maps the legacy flags that were set onto cfg.
func (l *legacyFlags) apply(fs *pflag.FlagSet, cfg *config.Config) error {
	changed := func(names ...string) bool {
		for _, n := range names {
			if fs.Changed(n) {
				return true
			}
		}
		return false
	}
	if fs.Changed("message-queue-impl") && !fs.Changed("transport") {
		name, ok := implNames[l.impl]
		if !ok {
			return fmt.Errorf("--message-queue-impl: unknown value %q (want redis-sortedset, redis-pubsub or gcp-pubsub)", l.impl)
		}
		cfg.Transport = name
	}
	tc := &cfg.TransportConfig
	options := map[string]any{}
	switch cfg.Transport {
	case "redis-sortedset":
		if err := l.queues(tc, l.ssQueuesFile, l.ssQueues, "--redis.ss.queues-config"); err != nil {
			return err
		}
		if len(tc.Queues) == 0 && changed("redis.ss.request-queue-name", "redis.ss.igw-base-url") {
			q := config.Queue{Queue: transport.Queue{Name: l.ssRequestQueue}, IGWBaseURL: l.ssIGWBaseURL, RequestPathURL: l.ssRequestPath, GateType: l.ssGateType}
			if l.ssGateParams != "" {
				if err := json.Unmarshal([]byte(l.ssGateParams), &q.GateParams); err != nil {
					return fmt.Errorf("--redis.ss.gate-params: %w", err)
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
		if len(tc.Queues) == 0 && changed("redis.request-queue-name", "redis.igw-base-url") {
			tc.Queues = append(tc.Queues, config.Queue{Queue: transport.Queue{Name: l.psRequestQueue}, IGWBaseURL: l.psIGWBaseURL, RequestPathURL: l.psRequestPath})
		}
		if tc.ResultQueueName == "" && (len(tc.Queues) > 0 || changed("redis.result-queue-name")) {
			tc.ResultQueueName = l.psResultQueue
		}
		if changed("redis.retry-queue-name") {
			options["retry_queue_name"] = l.psRetryQueue
		}
	case "gcp-pubsub":
		if err := l.queues(tc, l.gcpTopicsFile, "", ""); err != nil {
			return err
		}
		if len(tc.Queues) == 0 && changed("pubsub.request-subscriber-id") {
			tc.Queues = append(tc.Queues, config.Queue{Queue: transport.Queue{Name: l.gcpSubscription}, IGWBaseURL: l.gcpIGWBaseURL, RequestPathURL: l.gcpRequestPath})
		}
		if tc.ResultQueueName == "" && changed("pubsub.result-topic-id") {
			tc.ResultQueueName = l.gcpResultTopic
		}
		if changed("pubsub.project-id") {
			options["project_id"] = l.gcpProject
		}
	}
	if len(options) == 0 {
		return nil
	}
	merged := map[string]any{}
	if len(tc.Options) > 0 {
		if err := json.Unmarshal(tc.Options, &merged); err != nil {
			return fmt.Errorf("transport options: %w", err)
		}
	}
	for k, v := range options {
		if _, set := merged[k]; !set {
			merged[k] = v
		}
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return err
	}
	tc.Options = b
	return nil
}

// queues reads a legacy queues config (file or inline) into tc, unless a
// newer transport config already set the queues.
func (l *legacyFlags) queues(tc *config.TransportConfig, file, inline, inlineName string) error {
	if len(tc.Queues) > 0 {
		return nil
	}
	data, where := []byte(inline), inlineName
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("queues config: %w", err)
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
