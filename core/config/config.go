// Package config is sluice's configuration: one JSON document (file, flags
// and the legacy flags of upstream all land here), defaults, and validation
// that reports every problem with where it is.
//
// Defaults live in one place per setting. A setting that a component reads
// (the HTTP client, the pipeline, a gate) is that
// component's to default: config leaves it zero, meaning "the component's
// default", and its doc comment names that default. SetDefaults fills only
// the settings that the assembly alone reads (transport, ports, concurrency,
// logging, tracing, the queues' ids, gates and result destinations).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/configtypes"
	"github.com/sluice-io/sluice/internal/redistopology"
)

// Duration is a time.Duration that reads "250ms"/"5m" or a number of
// seconds (configtypes.Duration, which the components that own their
// config sections use without importing this package).
type Duration = configtypes.Duration

// Config is a whole deployment.
type Config struct {
	// Transport is the transport's registry name (default "memory").
	Transport string `json:"transport,omitempty"`
	// TransportConfig holds the queues and the transport's own options.
	TransportConfig TransportConfig `json:"transport_config"`
	// Concurrency is the workers of the default worker pool, shared by
	// every queue, when WorkerPools is empty (default 64): upstream's
	// --concurrency.
	Concurrency int `json:"concurrency,omitempty"`
	// WorkerPools are upstream's worker pools (--pool-config-file): the
	// requests in flight of all the queues naming a pool (worker_pool_id)
	// stay within its workers, and its gate decides per request. Empty: one
	// pool "default" of Concurrency workers shared by every queue.
	WorkerPools []WorkerPool `json:"worker_pools,omitempty"`
	// RequestTimeout bounds one gateway call when the deadline is further
	// away (0: core/dispatch's default, 5m).
	RequestTimeout Duration `json:"request_timeout,omitempty"`
	// GateWaitTimeout bounds how long a request waits on a gate's Wait
	// verdict (or for a worker of the tier-priority lanes) before it is
	// re-queued with no result (--gate-wait-timeout; nil: 5m; 0: until its
	// deadline).
	GateWaitTimeout *Duration `json:"gate_wait_timeout,omitempty"`
	// DrainTimeout is how long requests in flight may finish on shutdown
	// (0: core/pipeline's default, 2m).
	DrainTimeout Duration `json:"drain_timeout,omitempty"`
	// ResultWriteTimeout is how long writing a result is retried while the
	// request is held (0: the default, 5m); then the request is handed back
	// with its result kept, so it is not sent to the gateway again.
	ResultWriteTimeout Duration `json:"result_write_timeout,omitempty"`
	// ResultHandBackDelay is when a request handed back with its result
	// kept comes back to be written again (0: the default, 30s).
	ResultHandBackDelay Duration `json:"result_hand_back_delay,omitempty"`
	// MergePolicy is upstream's request merge policy
	// (--request-merge-policy-config-file): how a worker pool's workers are
	// shared by its queues, and the fairness header.
	MergePolicy MergePolicy `json:"merge_policy"`
	// TransformConfigFile names upstream's request body transforms file
	// (--transform-config-file; empty: none).
	TransformConfigFile string `json:"transform_config_file,omitempty"`
	// BacklogPollInterval is how often each queue's depth is read from the
	// broker for the broker_backlog and sluice_delayed_requests gauges
	// (0: the pipeline's gauge interval, 2s; negative: never; upstream's
	// --metrics-backlog-poll-interval).
	BacklogPollInterval Duration `json:"backlog_poll_interval,omitempty"`
	// MetricsPort serves /metrics (default 9090; -1 disables).
	MetricsPort int `json:"metrics_port,omitempty"`
	// HealthPort serves /healthz and /readyz (default 8081; -1 disables).
	HealthPort int `json:"health_port,omitempty"`
	// ListenHost is the address the two ports bind to (default all interfaces).
	ListenHost string `json:"listen_host,omitempty"`
	// StatusPage serves the live status page (GET / and /status.json,
	// core/status) on the metrics port (default true; see StatusPageEnabled).
	StatusPage *bool `json:"status_page,omitempty"`
	// Limits bound what one request may carry (zero fields: the defaults
	// of wire.Limits; negative: off).
	Limits wire.Limits `json:"limits"`
	// Retry is the backoff of retryable failures.
	Retry Retry `json:"retry"`
	// Dispatch configures the HTTP calls to the gateway.
	Dispatch Dispatch `json:"dispatch"`
	// Prometheus is where Prometheus gates query.
	Prometheus Prometheus `json:"prometheus"`
	// TLS configures the client side of gateway calls.
	TLS TLS `json:"tls"`
	// RedisURL is the deployment's Redis (REDIS_URL); used by Redis transports and gates.
	RedisURL string `json:"redis_url,omitempty"`
	// RedisMode is how RedisURL is reached: "single" (default;
	// upstream's "standalone" too), "cluster" (a Redis Cluster; the URL in
	// go-redis's cluster form, redis://host:port?addr=host2:port2, or with
	// RedisAddrs) or "sentinel" (the URL's host is a sentinel; RedisAddrs
	// more sentinels; RedisMasterName the master). It applies to the Redis
	// transports and the Redis gates that name no topology of their own
	// (--redis.mode).
	RedisMode string `json:"redis_mode,omitempty"`
	// RedisAddrs are more cluster nodes or sentinels beside RedisURL's host
	// (upstream's addrs; --redis.addrs). Cluster or sentinel mode only.
	RedisAddrs []string `json:"redis_addrs,omitempty"`
	// RedisMasterName is the name the sentinels monitor the master under
	// (upstream's master_name; --redis.master-name): required in sentinel
	// mode, refused otherwise.
	RedisMasterName string `json:"redis_master_name,omitempty"`
	// RedisTLS is the TLS of rediss:// connections of the redis-stream and
	// redis-pubsub transports: CAs to trust, a client certificate (mutual
	// TLS), and insecure_skip_verify (off by default; testing only).
	RedisTLS TLS `json:"redis_tls"`
	// Log configures the structured logs.
	Log Log `json:"log"`
	// Tracing configures OpenTelemetry tracing (off unless an endpoint is set).
	Tracing Tracing `json:"tracing"`
	// BatchAPI is the batch_api section as written: the OpenAI Batch API
	// front (front/batch), off by default. The front and its file store
	// own its keys: cmd/sluice decodes it into their Config types, which
	// check them (this package cannot import the fronts).
	BatchAPI json.RawMessage `json:"batch_api,omitempty"`
	// OpenAIAPI is the openai_api section as written: the
	// OpenAI-compatible synchronous front (front/openai), off by default;
	// decoded and checked as BatchAPI is.
	OpenAIAPI json.RawMessage `json:"openai_api,omitempty"`
}

// Tracing configures OpenTelemetry traces, exported over OTLP/HTTP.
type Tracing struct {
	// OTLPEndpoint is the collector's URL, e.g. http://otel-collector:4318
	// (empty: tracing off).
	OTLPEndpoint string `json:"otlp_endpoint,omitempty"`
	// SampleRatio is the share of requests traced when the producer sent no
	// sampled trace context (default 0.01); a producer's sampled traceparent
	// is always followed.
	SampleRatio float64 `json:"sample_ratio,omitempty"`
	// ServiceName is the service.name resource attribute (default "sluice").
	ServiceName string `json:"service_name,omitempty"`
}

// TransportConfig is the transport config object of upstream: the queues,
// the default result destination, and the transport's own options (passed
// to its factory, which rejects unknown ones).
//
// Upstream's spellings are accepted beside sluice's: the GCP Pub/Sub form
// {"topics": [...], "result_topic_id": ..., "batch_size": ...} reads as
// "queues" and "result_queue_name" (each topic's "subscriber_id" is its
// queue_name, see Queue), and its batch_size, upstream's per-subscription
// bound of messages in flight, becomes each topic's max_concurrency unless
// the topic sets one (batch_size also stays a transport option); on the
// gcp-pubsub transport it does the same in the queues form. Other
// transports read batch_size as their own option (a claim batch).
// "enable_tracing" is accepted on every transport and ignored, with a
// warning (Config.Warnings).
type TransportConfig struct {
	// Queues are the request queues ("queues", or upstream's GCP "topics").
	Queues []Queue `json:"queues"`
	// ResultQueueName is the default result destination of every queue
	// ("result_queue_name", or upstream's GCP "result_topic_id").
	ResultQueueName string `json:"result_queue_name,omitempty"`
	// EnableTracing is upstream's Redis "enable_tracing" option (spans for
	// Redis commands). It is accepted and kept so that upstream's files
	// load, but it turns nothing on: sluice's tracing is configured once
	// for the whole process (Config.Tracing, --otlp-endpoint and the
	// OTEL_* environment), and sluice makes no per-command Redis spans.
	EnableTracing bool `json:"enable_tracing,omitempty"`
	// Options are the transport's own options, every other key.
	Options json.RawMessage `json:"-"`
}

// coreKeys are the keys of the transport config object that TransportConfig
// reads itself; every other key is a transport option.
var coreKeys = []string{"queues", "topics", "result_queue_name", "result_topic_id", "enable_tracing"}

// UnmarshalJSON splits the core's fields from the transport's options.
func (t *TransportConfig) UnmarshalJSON(b []byte) error {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	_, hasQueues := all["queues"]
	_, hasTopics := all["topics"]
	if hasQueues && hasTopics {
		return errors.New("queues and topics: give one of them (topics is upstream's GCP spelling of queues)")
	}
	for _, key := range []string{"queues", "topics"} {
		if q, ok := all[key]; ok {
			if err := strictUnmarshal(q, &t.Queues); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			if err := normalizeQueues(t.Queues, key); err != nil {
				return err
			}
		}
	}
	if b, ok := all["batch_size"]; ok && hasTopics {
		// Upstream's GCP batch_size is the most messages one subscription
		// has in flight at budget 1: a topic's max_concurrency. It also
		// stays a transport option (gcp-pubsub accepts it).
		var n int
		if err := json.Unmarshal(b, &n); err != nil || n < 0 {
			return fmt.Errorf("batch_size: want a non-negative integer, got %s", b)
		}
		for i := range t.Queues {
			if t.Queues[i].MaxConcurrency == 0 {
				t.Queues[i].MaxConcurrency = n
			}
		}
	}
	var rt string
	for _, f := range []struct {
		key string
		dst *string
	}{{"result_queue_name", &t.ResultQueueName}, {"result_topic_id", &rt}} {
		if r, ok := all[f.key]; ok {
			if err := json.Unmarshal(r, f.dst); err != nil {
				return fmt.Errorf("%s: %w", f.key, err)
			}
		}
	}
	if rt != "" {
		if t.ResultQueueName != "" && t.ResultQueueName != rt {
			return fmt.Errorf("result_queue_name %q and result_topic_id %q differ (result_topic_id is upstream's GCP spelling of result_queue_name)", t.ResultQueueName, rt)
		}
		t.ResultQueueName = rt
	}
	if r, ok := all["enable_tracing"]; ok {
		if err := json.Unmarshal(r, &t.EnableTracing); err != nil {
			return fmt.Errorf("enable_tracing: %w", err)
		}
	}
	for _, k := range coreKeys {
		delete(all, k)
	}
	if len(all) > 0 {
		opts, err := json.Marshal(all)
		if err != nil {
			return err
		}
		t.Options = opts
	} else {
		t.Options = nil
	}
	return nil
}

// batchSize is the batch_size option when it is a positive integer, else 0
// (the transport checks its own option).
func (t TransportConfig) batchSize() int {
	var opts struct {
		BatchSize int `json:"batch_size"`
	}
	if json.Unmarshal(t.Options, &opts) != nil || opts.BatchSize < 0 {
		return 0
	}
	return opts.BatchSize
}

// normalizeQueues folds upstream's GCP topic spellings into sluice's
// fields: subscriber_id into queue_name and result_topic_id into
// result_queue_name. list names the array in messages.
func normalizeQueues(qs []Queue, list string) error {
	for i := range qs {
		q := &qs[i]
		if q.SubscriberID != "" {
			if q.Name != "" && q.Name != q.SubscriberID {
				return fmt.Errorf("%s[%d]: subscriber_id %q and queue_name %q differ (subscriber_id is upstream's GCP spelling of queue_name)", list, i, q.SubscriberID, q.Name)
			}
			q.Name, q.SubscriberID = q.SubscriberID, ""
		}
		if q.ResultTopicID != "" {
			if q.ResultName != "" && q.ResultName != q.ResultTopicID {
				return fmt.Errorf("%s[%d]: result_topic_id %q and result_queue_name %q differ (result_topic_id is upstream's GCP spelling of result_queue_name)", list, i, q.ResultTopicID, q.ResultName)
			}
			q.ResultName, q.ResultTopicID = q.ResultTopicID, ""
		}
	}
	return nil
}

// MarshalJSON merges the options back in.
func (t TransportConfig) MarshalJSON() ([]byte, error) {
	all := map[string]any{}
	if len(t.Options) > 0 {
		if err := json.Unmarshal(t.Options, &all); err != nil {
			return nil, err
		}
	}
	all["queues"] = t.Queues
	if t.ResultQueueName != "" {
		all["result_queue_name"] = t.ResultQueueName
	}
	if t.EnableTracing {
		all["enable_tracing"] = true
	}
	return json.Marshal(all)
}

// gcpPubSub is the registry name of the GCP Pub/Sub transport, whose
// upstream option batch_size bounds each subscription (see TransportConfig).
const gcpPubSub = "gcp-pubsub"

// DefaultWorkerPoolID is the worker pool a queue belongs to when it names
// none (upstream's default).
const DefaultWorkerPoolID = "default"

// The merge policies.
const (
	// PolicyRandomRobin: a pool's workers are taken as requests are claimed,
	// its queues served side by side (upstream's default).
	PolicyRandomRobin = "random-robin"
	// PolicyTierPriority: a pool's workers go to requests in six lanes by
	// classification and tier, strictly in order.
	PolicyTierPriority = "tier-priority"
)

// MergePolicy is upstream's merge-policy file: {"type", "parameters"}.
// Parameters: fairness_header and fairness_attribute (both policies),
// priority_header, tier_label, objective_header, lane_objectives and
// lane_min_share (tier-priority; core/app checks them); other keys are ignored, as
// upstream ignores them.
type MergePolicy struct {
	// Type is PolicyRandomRobin (default) or PolicyTierPriority.
	Type string `json:"type,omitempty"`
	// Parameters are the policy's parameters (a JSON object).
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ParseMergePolicy reads upstream's merge-policy file: unknown top-level
// keys are errors, anything after the first JSON value is ignored (as
// upstream), and the type must be known.
func ParseMergePolicy(data []byte, where string) (MergePolicy, error) {
	var mp MergePolicy
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&mp); err != nil {
		return MergePolicy{}, fmt.Errorf("%s: %s", where, jsonErr(data, err))
	}
	if err := mp.check(); err != nil {
		return MergePolicy{}, fmt.Errorf("%s: %w", where, err)
	}
	return mp, nil
}

func (mp MergePolicy) check() error {
	switch mp.Type {
	case "", PolicyRandomRobin, PolicyTierPriority:
	default:
		return fmt.Errorf("unknown request merge policy type: %s (known: %s, %s)", mp.Type, PolicyRandomRobin, PolicyTierPriority)
	}
	if len(mp.Parameters) > 0 && !bytes.Equal(bytes.TrimSpace(mp.Parameters), []byte("null")) {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(mp.Parameters, &obj); err != nil {
			return fmt.Errorf("parameters: not a JSON object: %v", err)
		}
	}
	return nil
}

// Param returns the string parameter key of the policy ("" when absent,
// null or not a string).
func (mp MergePolicy) Param(key string) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(mp.Parameters, &obj) != nil {
		return ""
	}
	var v string
	if json.Unmarshal(obj[key], &v) != nil {
		return ""
	}
	return v
}

// WorkerPool is one of upstream's worker pools (an entry of the JSON array
// of --pool-config-file).
type WorkerPool struct {
	// ID names the pool (required, unique); queues name it in worker_pool_id.
	ID string `json:"id"`
	// Workers is the most requests of the pool's queues in flight at once (≥ 1).
	Workers int `json:"workers"`
	// GateType is the pool gate's registry name (optional): it decides per
	// request, after the queue's gate, for every queue of the pool.
	GateType string `json:"gate_type,omitempty"`
	// GateParams are the pool gate's parameters (as a queue's gate_params).
	GateParams map[string]json.RawMessage `json:"gate_params,omitempty"`
}

// ParseWorkerPools reads upstream's pool file: a JSON array of pools.
// Unknown fields are reported (upstream ignores them).
func ParseWorkerPools(data []byte, where string) ([]WorkerPool, error) {
	var generic any
	if err := json.Unmarshal(data, &generic); err != nil {
		return nil, Problems{{where, "not valid JSON: " + jsonErr(data, err)}}
	}
	if ps := unknownFields(generic, reflect.TypeOf([]WorkerPool{}), ""); len(ps) > 0 {
		for i := range ps {
			ps[i].Where = where + ": " + ps[i].Where
		}
		return nil, ps
	}
	var pools []WorkerPool
	if err := json.Unmarshal(data, &pools); err != nil {
		return nil, Problems{{where, jsonErr(data, err)}}
	}
	return pools, nil
}

// Pool returns the worker pool named id (nil when there is none).
func (c *Config) Pool(id string) *WorkerPool {
	for i := range c.WorkerPools {
		if c.WorkerPools[i].ID == id {
			return &c.WorkerPools[i]
		}
	}
	return nil
}

// Queue is one request queue (upstream's queue object, and upstream's GCP
// topic object): the transport's queue (transport.Queue: id, queue_name,
// result_queue_name, pool, max_concurrency) and the fields the assembly
// reads.
type Queue struct {
	// Queue holds the names and the in-flight limit. ID defaults to Name;
	// Name (queue_name) is required; ResultName overrides the transport's
	// result destination; Pool defaults to the one a name of the form
	// <prefix>:requests:<pool> names; MaxConcurrency overrides
	// Config.Concurrency for this queue.
	transport.Queue
	// SubscriberID is upstream's GCP topic key: the Pub/Sub subscription,
	// read as queue_name (giving both with different values is an error).
	// Parsing moves it into Name and leaves it empty.
	SubscriberID string `json:"subscriber_id,omitempty"`
	// ResultTopicID is upstream's GCP per-topic result topic, read as
	// result_queue_name (both with different values is an error). Parsing
	// moves it into ResultName and leaves it empty.
	ResultTopicID string `json:"result_topic_id,omitempty"`
	// WorkerPoolID names the worker pool (worker_pools, --pool-config-file)
	// whose workers dispatch the queue's requests (default "default"): the
	// requests in flight of all the pool's queues stay within its workers,
	// and its gate, if any, decides per request after the queue's.
	WorkerPoolID string `json:"worker_pool_id,omitempty"`
	// IGWBaseURL is the inference gateway's base URL (required).
	IGWBaseURL string `json:"igw_base_url"`
	// RequestPathURL is the request path (empty: core/dispatch's default,
	// /v1/completions).
	RequestPathURL string `json:"request_path_url,omitempty"`
	// InferenceObjective is sent as x-gateway-inference-objective.
	InferenceObjective string `json:"inference_objective,omitempty"`
	// GateType is the gate's registry name (default constant).
	GateType string `json:"gate_type,omitempty"`
	// GateParams are the gate's parameters, read as upstream reads them
	// (gate.ParseParams): values may be strings, numbers or booleans, and a
	// composite's "gates" may be an array or a JSON string holding one.
	GateParams map[string]json.RawMessage `json:"gate_params,omitempty"`
	// Labels are upstream's queue labels: set on each request taken from the
	// queue that does not carry them (its tier, for instance); gates and the
	// tier-priority policy read them.
	Labels map[string]string `json:"labels,omitempty"`
	// Evict (sluice's own, off by default) takes requests back from the
	// pool when the gate's measured budget falls below what the queue has
	// in flight: the youngest calls over the new limit are aborted (the
	// inference server frees their seats) and their requests re-queued at
	// once, in deadline order, without counting an attempt. Off, a falling
	// budget only stops new claims and seats come back as requests finish.
	Evict bool `json:"evict,omitempty"`
	// EvictLimit is how many times evict may take one request back (0: the
	// default, 2; negative: no limit); a request taken back that often runs
	// to its end.
	EvictLimit int `json:"evict_limit,omitempty"`
	// Resume (with evict; off by default) lets a request taken back
	// continue from the tokens its aborted call had made instead of
	// starting again: the call streams, and the next attempt sends the text
	// made as the prompt's continuation (core/resume). The answer written is
	// the non-streamed one the producer asked for.
	Resume bool `json:"resume,omitempty"`
}

// Retry is the retry policy. Zero fields take core/pipeline's defaults
// (RetryPolicy.SetDefaults).
type Retry struct {
	// Base is the first backoff, doubling per attempt (0: the default, 2s).
	Base Duration `json:"base,omitempty"`
	// Max caps the backoff (0: the default, 60s).
	Max Duration `json:"max,omitempty"`
	// Jitter spreads each backoff by ±Jitter (0: the default, 0.2).
	Jitter float64 `json:"jitter,omitempty"`
	// MaxAttempts ends retries after that many attempts (0: only the
	// deadline ends them).
	MaxAttempts int `json:"max_attempts,omitempty"`
}

// Dispatch configures the gateway calls. Zero fields take core/dispatch's
// defaults (Config.SetDefaults).
type Dispatch struct {
	// DeadlineHeader carries the deadline in Unix ms (empty: the default,
	// x-request-deadline; "off" disables).
	DeadlineHeader string `json:"deadline_header,omitempty"`
	// TimeoutHeader carries the remaining ms (empty: the default,
	// x-envoy-upstream-rq-timeout-ms; "off" disables).
	TimeoutHeader string `json:"timeout_header,omitempty"`
	// MaxResponseBytes caps a response body (0: the default, 64 MiB).
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
	// Protocol is how http:// gateways are spoken to: "auto" (empty: the
	// default; h2c to the gateways that accept it, HTTP/1.1 to the others,
	// detected per gateway address), "http1" or "h2c" (HTTP/2 with prior
	// knowledge, for gateways that accept it).
	Protocol string `json:"protocol,omitempty"`
}

// Prometheus is the Prometheus server gates query.
type Prometheus struct {
	// URL is the server's base URL (a gate's params may name their own).
	URL string `json:"url,omitempty"`
	// CacheTTL is how long gates reuse an answer (0: each gate's default,
	// 5s for the built-in Prometheus gates).
	CacheTTL Duration `json:"cache_ttl,omitempty"`
}

// TLS configures gateway calls over https (tls), or Redis connections over
// rediss:// (redis_tls).
type TLS struct {
	CACert             string `json:"ca_cert,omitempty"`
	Cert               string `json:"cert,omitempty"`
	Key                string `json:"key,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
}

// Log configures logging.
type Log struct {
	Level  string `json:"level,omitempty"`  // debug, info (default), warn, error
	Format string `json:"format,omitempty"` // text (default) or json
}

// StatusPageEnabled reports whether the status page is on: StatusPage, true
// when unset.
func (c *Config) StatusPageEnabled() bool { return c.StatusPage == nil || *c.StatusPage }

// SetDefaults fills the unset fields that only the assembly reads; the
// settings of components stay zero (see the package doc).
func (c *Config) SetDefaults() {
	if c.Transport == "" {
		c.Transport = "memory"
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.MetricsPort == 0 {
		c.MetricsPort = 9090
	}
	if c.HealthPort == 0 {
		c.HealthPort = 8081
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Tracing.SampleRatio == 0 {
		c.Tracing.SampleRatio = 0.01
	}
	if c.Tracing.ServiceName == "" {
		c.Tracing.ServiceName = "sluice"
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if len(c.WorkerPools) == 0 {
		c.WorkerPools = []WorkerPool{{ID: DefaultWorkerPoolID, Workers: c.Concurrency}}
	}
	gcpBatch := 0
	if c.Transport == gcpPubSub {
		gcpBatch = c.TransportConfig.batchSize()
	}
	for i := range c.TransportConfig.Queues {
		q := &c.TransportConfig.Queues[i]
		if gcpBatch > 0 && q.MaxConcurrency == 0 {
			q.MaxConcurrency = gcpBatch // as in upstream's topics form
		}
		if q.ID == "" {
			q.ID = q.Name
		}
		if q.WorkerPoolID == "" {
			q.WorkerPoolID = DefaultWorkerPoolID
		}
		if q.ResultName == "" {
			q.ResultName = c.TransportConfig.ResultQueueName
			q.ResultFromMessage = true // upstream routes such a queue's results by the message first
		}
		if q.GateType == "" {
			q.GateType = "constant"
		}
		if q.MaxConcurrency == 0 {
			// A queue alone may use its whole pool.
			q.MaxConcurrency = c.Concurrency
			if p := c.Pool(q.WorkerPoolID); p != nil && p.Workers > 0 {
				q.MaxConcurrency = p.Workers
			}
		}
	}
}

// FindQueue returns the queue whose id or broker name is name (nil when
// none is); "" is the only queue.
func (c *Config) FindQueue(name string) *Queue {
	qs := c.TransportConfig.Queues
	if name == "" {
		if len(qs) == 1 {
			return &qs[0]
		}
		return nil
	}
	for i := range qs {
		if qs[i].ID == name || qs[i].Name == name {
			return &qs[i]
		}
	}
	return nil
}

// Problem is one thing wrong with a configuration, and where it is.
type Problem struct {
	Where string
	What  string
}

func (p Problem) String() string { return p.Where + ": " + p.What }

// Problems is every problem found; as an error it lists them all.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Known says which names exist in the deployment's registries.
type Known struct {
	Transport func(string) bool
	Gate      func(string) bool
	// Transports and Gates list the names, for messages.
	Transports []string
	Gates      []string
}

// Validate returns every problem of a defaulted config (nil when none).
func (c *Config) Validate(k Known) error {
	var ps Problems
	add := func(where, format string, a ...any) { ps = append(ps, Problem{where, fmt.Sprintf(format, a...)}) }
	if k.Transport != nil && !k.Transport(c.Transport) {
		add("transport", "unknown transport %q (known: %s)", c.Transport, strings.Join(k.Transports, ", "))
	}
	if c.Concurrency < 1 {
		add("concurrency", "must be at least 1, got %d", c.Concurrency)
	}
	if c.RequestTimeout < 0 {
		add("request_timeout", "must not be negative")
	}
	if c.GateWaitTimeout != nil && *c.GateWaitTimeout < 0 {
		add("gate_wait_timeout", "must not be negative (0 waits until the deadline)")
	}
	if c.DrainTimeout < 0 {
		add("drain_timeout", "must not be negative")
	}
	if c.ResultWriteTimeout < 0 {
		add("result_write_timeout", "must not be negative")
	}
	if c.ResultHandBackDelay < 0 {
		add("result_hand_back_delay", "must not be negative")
	}
	for name, port := range map[string]int{"metrics_port": c.MetricsPort, "health_port": c.HealthPort} {
		if port < -1 || port > 65535 {
			add(name, "%d is not a port (-1 disables)", port)
		}
	}
	if c.MetricsPort > 0 && c.MetricsPort == c.HealthPort {
		add("health_port", "same port as metrics_port (%d)", c.MetricsPort)
	}
	if c.Retry.Base < 0 || c.Retry.Max < 0 {
		add("retry", "base and max must not be negative, got base %s, max %s", c.Retry.Base.D(), c.Retry.Max.D())
	}
	if c.Retry.Jitter < 0 {
		add("retry.jitter", "must be in [0,1], got %v", c.Retry.Jitter)
	}
	c.componentProblems(add)
	if c.Prometheus.URL != "" {
		if u, err := url.Parse(c.Prometheus.URL); err != nil || u.Scheme == "" || u.Host == "" {
			add("prometheus.url", "%q is not an absolute URL", c.Prometheus.URL)
		}
	}
	if (c.RedisTLS.Cert == "") != (c.RedisTLS.Key == "") {
		add("redis_tls", "cert and key go together")
	}
	if c.RedisTLS != (TLS{}) && !strings.HasPrefix(c.Transport, "redis-") {
		// Only the Redis transports read it; it would change nothing.
		add("redis_tls", "applies to the Redis transports only (redis-sortedset, redis-stream, redis-pubsub), and the transport is %s; the Redis gates take tls, tls_ca_cert, tls_cert, tls_key in gate_params", c.Transport)
	}
	_, redisTopology := redistopology.Check(deploymentRedisKeys, c.RedisMode, c.RedisAddrs, c.RedisMasterName)
	for _, p := range redisTopology {
		add(p.Key, "%s", p.What)
	}
	for _, f := range []struct{ where, path string }{{"tls.ca_cert", c.TLS.CACert}, {"tls.cert", c.TLS.Cert}, {"tls.key", c.TLS.Key},
		{"redis_tls.ca_cert", c.RedisTLS.CACert}, {"redis_tls.cert", c.RedisTLS.Cert}, {"redis_tls.key", c.RedisTLS.Key}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				add(f.where, "%v", err)
			}
		}
	}
	if c.Tracing.SampleRatio < 0 || c.Tracing.SampleRatio > 1 {
		add("tracing.sample_ratio", "must be in [0,1], got %v", c.Tracing.SampleRatio)
	}
	if e := c.Tracing.OTLPEndpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add("tracing.otlp_endpoint", "%q is not an http(s) URL", e)
		}
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "%q: want debug, info, warn or error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add("log.format", "%q: want text or json", c.Log.Format)
	}
	if err := c.MergePolicy.check(); err != nil {
		add("merge_policy", "%v", err)
	}
	pools := map[string]int{}
	for i, p := range c.WorkerPools {
		where := fmt.Sprintf("worker_pools[%d]", i)
		switch prev, dup := pools[p.ID]; {
		case p.ID == "":
			add(where+".id", "required")
		case dup:
			add(where+".id", "duplicate of worker_pools[%d] (%q)", prev, p.ID)
		}
		pools[p.ID] = i
		if p.Workers < 1 {
			add(where+".workers", "pool %q must have at least 1 worker, got %d", p.ID, p.Workers)
		}
		if p.GateType != "" && k.Gate != nil && !k.Gate(p.GateType) {
			add(where+".gate_type", "unknown gate type %q (known: %s)", p.GateType, strings.Join(k.Gates, ", "))
		}
	}
	qs := c.TransportConfig.Queues
	if len(qs) == 0 {
		add("transport_config.queues", "no queues configured")
	}
	ids, names := map[string]int{}, map[string]int{}
	for i, q := range qs {
		where := fmt.Sprintf("transport_config.queues[%d]", i)
		if q.Name == "" {
			add(where+".queue_name", "required")
		}
		if q.Evict && c.MergePolicy.Type == PolicyTierPriority {
			add(where+".evict", "not supported under merge_policy %s (its lanes, not the queue's credits, bound what runs)", PolicyTierPriority)
		}
		if q.Resume && !q.Evict {
			add(where+".resume", "needs evict: true (only a request taken back is resumed)")
		}
		if prev, dup := ids[q.ID]; dup && q.ID != "" {
			add(where+".id", "duplicate queue id %q: queues[%d] and queues[%d] both use it", q.ID, prev, i)
		} else {
			ids[q.ID] = i
		}
		// Upstream refuses two entries reading the same queue; so does sluice,
		// since both would race for the same messages under different settings.
		if prev, dup := names[q.Name]; dup && q.Name != "" {
			add(where+".queue_name", "duplicate queue_name %q: queues[%d] and queues[%d] both read it", q.Name, prev, i)
		} else {
			names[q.Name] = i
		}
		if q.IGWBaseURL == "" {
			add(where+".igw_base_url", "required")
		} else if u, err := url.Parse(q.IGWBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add(where+".igw_base_url", "%q is not an http(s) URL", q.IGWBaseURL)
		}
		if q.RequestPathURL != "" && !strings.HasPrefix(q.RequestPathURL, "/") {
			add(where+".request_path_url", "%q must start with /", q.RequestPathURL)
		}
		if q.ResultName == "" {
			add(where+".result_queue_name", "no result queue (set it here or transport_config.result_queue_name)")
		}
		if k.Gate != nil && !k.Gate(q.GateType) {
			add(where+".gate_type", "unknown gate type %q (known: %s)", q.GateType, strings.Join(k.Gates, ", "))
		}
		if q.MaxConcurrency < 1 {
			add(where+".max_concurrency", "must be at least 1")
		}
		if _, ok := pools[q.WorkerPoolID]; !ok && len(c.WorkerPools) > 0 {
			add(where+".worker_pool_id", "worker pool %q specified in queue config not found in pool configuration (pools: %s)", q.WorkerPoolID, poolIDs(c.WorkerPools))
		}
	}
	if len(ps) == 0 {
		return nil
	}
	return ps
}

func poolIDs(ps []WorkerPool) string {
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = strconv.Quote(p.ID)
	}
	return strings.Join(ids, ", ")
}

// Parse reads a config document strictly: every unknown field is reported
// (with its path), not only the first. Transport options are left to the
// transport. where names the document in messages (a file name).
func Parse(data []byte, where string) (*Config, error) {
	var c Config
	if err := ParseInto(data, where, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// ParseInto is Parse into an existing config (fields absent from data keep their values).
func ParseInto(data []byte, where string, c *Config) error {
	var generic any
	if err := json.Unmarshal(data, &generic); err != nil {
		return Problems{{where, "not valid JSON: " + jsonErr(data, err)}}
	}
	if ps := unknownFields(generic, reflect.TypeOf(Config{}), ""); len(ps) > 0 {
		for i := range ps {
			ps[i].Where = where + ": " + ps[i].Where
		}
		return ps
	}
	if err := json.Unmarshal(data, c); err != nil {
		return Problems{{where, jsonErr(data, err)}}
	}
	return nil
}

// ParseQueues reads upstream's queues config: a bare array of queue
// objects, or the transport config object (with "queues", or upstream's GCP
// "topics"). It returns the queues and, for the object form, the whole
// transport config.
func ParseQueues(data []byte, where string) (TransportConfig, error) {
	trimmed := bytes.TrimSpace(data)
	var tc TransportConfig
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var generic any
		if err := json.Unmarshal(trimmed, &generic); err != nil {
			return tc, Problems{{where, "not valid JSON: " + jsonErr(trimmed, err)}}
		}
		if ps := unknownFields(generic, reflect.TypeOf([]Queue{}), "queues"); len(ps) > 0 {
			for i := range ps {
				ps[i].Where = where + ": " + ps[i].Where
			}
			return tc, ps
		}
		if err := json.Unmarshal(trimmed, &tc.Queues); err != nil {
			return tc, Problems{{where, jsonErr(trimmed, err)}}
		}
		if err := normalizeQueues(tc.Queues, "queues"); err != nil {
			return tc, Problems{{where, err.Error()}}
		}
		return tc, nil
	}
	var generic any
	if err := json.Unmarshal(trimmed, &generic); err != nil {
		return tc, Problems{{where, "not valid JSON: " + jsonErr(trimmed, err)}}
	}
	if ps := unknownFields(generic, reflect.TypeOf(TransportConfig{}), ""); len(ps) > 0 {
		for i := range ps {
			ps[i].Where = where + ": " + ps[i].Where
		}
		return tc, ps
	}
	if err := json.Unmarshal(trimmed, &tc); err != nil {
		return tc, Problems{{where, jsonErr(trimmed, err)}}
	}
	return tc, nil
}

func strictUnmarshal(b []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

// jsonErr adds a line and column to JSON syntax and type errors.
func jsonErr(data []byte, err error) string {
	var off int64 = -1
	switch e := err.(type) {
	case *json.SyntaxError:
		off = e.Offset
	case *json.UnmarshalTypeError:
		off = e.Offset
		if e.Field != "" {
			return fmt.Sprintf("%s: %s (line %s)", e.Field, fmt.Sprintf("want %s, got JSON %s", e.Type, e.Value), lineCol(data, off))
		}
	}
	if off < 0 {
		return err.Error()
	}
	return fmt.Sprintf("%v (line %s)", err, lineCol(data, off))
}

func lineCol(data []byte, off int64) string {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	line := 1 + bytes.Count(data[:off], []byte("\n"))
	col := off - int64(bytes.LastIndexByte(data[:off], '\n'))
	return fmt.Sprintf("%d col %d", line, col)
}

// UnknownKeys reports every key of the JSON object raw, and of the objects
// it holds, that the Go type of shape has no field for (fields of embedded
// structs count as encoding/json promotes them), each at its path under
// path and with the closest known key: what Parse reports for the config's
// own sections, for the sections that components own and decode
// themselves (batch_api, openai_api).
func UnknownKeys(raw json.RawMessage, shape any, path string) Problems {
	var generic any
	if json.Unmarshal(raw, &generic) != nil {
		return nil // syntax and type errors are the decoder's to report
	}
	return unknownFields(generic, reflect.TypeOf(shape), path)
}

// unknownFields walks a decoded JSON value against the Go type it will be
// decoded into and reports every object key that has no field.
func unknownFields(v any, t reflect.Type, path string) Problems {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var ps Problems
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil // type errors are the decoder's to report
		}
		if t == reflect.TypeOf(TransportConfig{}) {
			// Only the core's fields are checked here; the transport checks its options.
			for _, key := range []string{"queues", "topics"} {
				if qs, ok := obj[key]; ok {
					ps = append(ps, unknownFields(qs, reflect.TypeOf([]Queue{}), join(path, key))...)
				}
			}
			return ps
		}
		fields := map[string]reflect.Type{}
		jsonFields(t, fields)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				ps = append(ps, Problem{join(path, k), "unknown field" + suggest(k, fields)})
				continue
			}
			ps = append(ps, unknownFields(obj[k], ft, join(path, k))...)
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok || t.Elem().Kind() == reflect.Uint8 {
			return nil
		}
		for i, e := range arr {
			ps = append(ps, unknownFields(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	}
	return ps
}

// jsonFields collects the JSON names of struct type t's fields into fields,
// with the fields of embedded structs promoted as encoding/json does.
func jsonFields(t reflect.Type, fields map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			jsonFields(f.Type, fields)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// suggest names the closest field: one that differs only in case or
// separators, or by at most two edits.
func suggest(k string, fields map[string]reflect.Type) string {
	norm := func(s string) string { return strings.NewReplacer("_", "", "-", "").Replace(strings.ToLower(s)) }
	best, bestD := "", 3
	for name := range fields {
		d := editDistance(norm(name), norm(k))
		if d < bestD || (d == bestD && name < best) {
			best, bestD = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// deploymentRedisKeys name the deployment's Redis topology in problems:
// redistopology.Check holds the rules, the same as a Redis transport's or
// gate's mode, addrs and master_name.
var deploymentRedisKeys = redistopology.Keys{Mode: "redis_mode", Addrs: "redis_addrs", MasterName: "redis_master_name"}
