package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

func known() Known {
	return Known{
		Transport:  func(s string) bool { return s == "memory" || s == "redis-sortedset" },
		Gate:       func(s string) bool { return s == "constant" || s == "redis" },
		Transports: []string{"memory", "redis-sortedset"}, Gates: []string{"constant", "redis"},
	}
}

func TestParseReportsEveryUnknownField(t *testing.T) {
	doc := `{"concurency": 5, "retry": {"bse": "1s"},
	 "transport_config": {"queues": [{"queue_name": "q", "igw_base_url": "http://gw", "gatetype": "redis", "max_concurency": 2}], "batch_size": 3}}`
	_, err := Parse([]byte(doc), "f.json")
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v, want Problems", err)
	}
	text := err.Error()
	for _, want := range []string{
		`f.json: concurency: unknown field (did you mean "concurrency"?)`,
		`f.json: retry.bse: unknown field`,
		`f.json: transport_config.queues[0].gatetype: unknown field (did you mean "gate_type"?)`,
		`f.json: transport_config.queues[0].max_concurency: unknown field (did you mean "max_concurrency"?)`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "batch_size") {
		t.Errorf("transport options are the transport's to check:\n%s", text)
	}
}

func TestParseSplitsTransportOptions(t *testing.T) {
	c, err := Parse([]byte(`{"transport":"redis-sortedset","transport_config":{"url":"redis://x","batch_size":3,
		"result_queue_name":"r","queues":[{"queue_name":"q","igw_base_url":"http://gw","gate_params":{"budget":"0.5","n":3}}]}}`), "f")
	if err != nil {
		t.Fatal(err)
	}
	if c.TransportConfig.ResultQueueName != "r" || len(c.TransportConfig.Queues) != 1 {
		t.Fatalf("transport config %+v", c.TransportConfig)
	}
	if got := string(c.TransportConfig.Options); got != `{"batch_size":3,"url":"redis://x"}` {
		t.Errorf("options = %s", got)
	}
	if string(c.TransportConfig.Queues[0].GateParams["n"]) != "3" {
		t.Errorf("gate params %v", c.TransportConfig.Queues[0].GateParams)
	}
}

func TestParseQueuesArrayAndObject(t *testing.T) {
	arr := `[{"queue_name":"llm-d-async:requests:pool-a","igw_base_url":"http://gw:80","gate_type":"redis","gate_params":{"budget_key":"k"}}]`
	tc, err := ParseQueues([]byte(arr), "queues.json")
	if err != nil || len(tc.Queues) != 1 || tc.Queues[0].GateType != "redis" {
		t.Fatalf("array form: %+v %v", tc, err)
	}
	obj := `{"url":"redis://r","result_queue_name":"res","poll_interval_ms":10,"queues":` + arr + `}`
	tc, err = ParseQueues([]byte(obj), "queues.json")
	if err != nil || len(tc.Queues) != 1 || tc.ResultQueueName != "res" || !strings.Contains(string(tc.Options), "poll_interval_ms") {
		t.Fatalf("object form: %+v %v", tc, err)
	}
	_, err = ParseQueues([]byte(`[{"queue_name":"q","igw_base_url":"http://gw","colour":"red"}]`), "queues.json")
	if err == nil || !strings.Contains(err.Error(), "queues.json: queues[0].colour: unknown field") {
		t.Fatalf("unknown field: %v", err)
	}
	_, err = ParseQueues([]byte("[{\"queue_name\": \n 5}]"), "queues.json")
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("type error without a line: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	c := &Config{TransportConfig: TransportConfig{ResultQueueName: "r", Queues: []Queue{{Queue: transport.Queue{Name: "llm-d-async:requests:pool-a"}, IGWBaseURL: "http://gw"}}}}
	c.SetDefaults()
	q := c.TransportConfig.Queues[0]
	if c.Transport != "memory" || c.Concurrency != 64 || c.MetricsPort != 9090 || c.HealthPort != 8081 ||
		c.Log != (Log{Level: "info", Format: "text"}) {
		t.Errorf("defaults: %+v", c)
	}
	// The components' settings stay zero: each component defaults its own.
	if c.RequestTimeout != 0 || c.DrainTimeout != 0 || c.Retry != (Retry{}) || c.Dispatch != (Dispatch{}) || c.Prometheus.CacheTTL != 0 {
		t.Errorf("a component's setting was defaulted here: %+v", c)
	}
	if q.ID != q.Name || q.RequestPathURL != "" || q.ResultName != "r" || q.GateType != "constant" || q.MaxConcurrency != 64 || q.WorkerPoolID != "default" {
		t.Errorf("queue defaults: %+v", q)
	}
	if err := c.Validate(known()); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	c := &Config{Transport: "kafka", Concurrency: -1, Log: Log{Level: "loud"}, TLS: TLS{Cert: "c.pem"},
		TransportConfig: TransportConfig{Queues: []Queue{
			{Queue: transport.Queue{Name: "a"}, IGWBaseURL: "gw:80", GateType: "magic"},
			{Queue: transport.Queue{Name: "a"}, IGWBaseURL: "http://gw", RequestPathURL: "v1"},
		}}}
	c.SetDefaults()
	err := c.Validate(known())
	if err == nil {
		t.Fatal("no problems found")
	}
	text := err.Error()
	for _, want := range []string{
		`transport: unknown transport "kafka" (known: memory, redis-sortedset)`,
		"concurrency: must be at least 1",
		"log.level",
		"dispatch: tls cert and key must be set together",
		`transport_config.queues[0].igw_base_url: "gw:80" is not an http(s) URL`,
		`transport_config.queues[0].gate_type: unknown gate type "magic" (known: constant, redis)`,
		"transport_config.queues[0].result_queue_name: no result queue",
		`transport_config.queues[1].id: duplicate queue id "a": queues[0] and queues[1] both use it`,
		`transport_config.queues[1].queue_name: duplicate queue_name "a": queues[0] and queues[1] both read it`,
		`transport_config.queues[1].request_path_url: "v1" must start with /`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
}

// Zero means "the component's default"; negative values are problems, and
// so is what the component itself refuses once its defaults are applied.
func TestValidateComponentSettings(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"zero", func(*Config) {}, ""},
		{"negative request timeout", func(c *Config) { c.RequestTimeout = -1 }, "request_timeout: must not be negative"},
		{"negative gate wait timeout", func(c *Config) { d := Duration(-1); c.GateWaitTimeout = &d }, "gate_wait_timeout: must not be negative"},
		{"negative drain", func(c *Config) { c.DrainTimeout = -1 }, "drain_timeout: must not be negative"},
		{"negative result write timeout", func(c *Config) { c.ResultWriteTimeout = -1 }, "result_write_timeout: must not be negative"},
		{"negative result hand-back delay", func(c *Config) { c.ResultHandBackDelay = -1 }, "result_hand_back_delay: must not be negative"},
		{"a limit off", func(c *Config) { c.Limits.MaxHeaders = -1 }, ""},
		{"negative retry base", func(c *Config) { c.Retry.Base = Duration(-time.Second) }, "retry: base and max must not be negative"},
		{"max below base", func(c *Config) { c.Retry.Base, c.Retry.Max = Duration(time.Minute), Duration(time.Second) },
			"retry: max backoff 1s is below the base 1m0s"},
		// The retry policy's and the dispatcher's own checks, with their defaults.
		{"base above the default max", func(c *Config) { c.Retry.Base = Duration(90 * time.Second) }, "retry: max backoff 1m0s is below the base 1m30s"},
		{"jitter above 1", func(c *Config) { c.Retry.Jitter = 1.5 }, "retry: jitter 1.5 is above 1"},
		{"negative attempts", func(c *Config) { c.Retry.MaxAttempts = -1 }, "retry: max attempts -1 is negative"},
		{"reserved deadline header", func(c *Config) { c.Dispatch.DeadlineHeader = "Content-Length" }, `dispatch: deadline header "Content-Length" is a reserved header`},
		{"fairness header", func(c *Config) { c.MergePolicy.Parameters = []byte(`{"fairness_header":"bad header"}`) }, `merge_policy: merge policy parameters: fairness_header: "bad header" is not a valid header name`},
		{"only base", func(c *Config) { c.Retry.Base = Duration(time.Second) }, ""},
		{"protocol", func(c *Config) { c.Dispatch.Protocol = "h3" }, `dispatch: protocol "h3": want "auto", "http1" or "h2c"`},
		{"h2c", func(c *Config) { c.Dispatch.Protocol = "h2c" }, ""},
		{"redis_tls without a Redis transport", func(c *Config) { c.RedisTLS.InsecureSkipVerify = true },
			"redis_tls: applies to the Redis transports only (redis-sortedset, redis-stream, redis-pubsub), and the transport is memory"},
		{"redis_tls with a Redis transport", func(c *Config) { c.Transport, c.RedisTLS.InsecureSkipVerify = "redis-sortedset", true }, ""},
		{"auto", func(c *Config) { c.Dispatch.Protocol = "auto" }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &Config{TransportConfig: TransportConfig{ResultQueueName: "r", Queues: []Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}}}
			tc.set(c)
			c.SetDefaults()
			err := c.Validate(known())
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestDurationForms(t *testing.T) {
	c, err := Parse([]byte(`{"request_timeout":"90s","drain_timeout":1.5}`), "f")
	if err != nil {
		t.Fatal(err)
	}
	if c.RequestTimeout.D() != 90*time.Second || c.DrainTimeout.D() != 1500*time.Millisecond {
		t.Errorf("durations %v %v", c.RequestTimeout.D(), c.DrainTimeout.D())
	}
	if _, err := Parse([]byte(`{"request_timeout":"soon"}`), "f"); err == nil || !strings.Contains(err.Error(), "not a duration") {
		t.Errorf("bad duration: %v", err)
	}
}

func TestTracingConfig(t *testing.T) {
	c := &Config{Tracing: Tracing{OTLPEndpoint: "collector:4318", SampleRatio: 2},
		TransportConfig: TransportConfig{ResultQueueName: "r", Queues: []Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}}}
	c.SetDefaults()
	err := c.Validate(known())
	if err == nil || !strings.Contains(err.Error(), "tracing.sample_ratio") || !strings.Contains(err.Error(), "tracing.otlp_endpoint") {
		t.Fatalf("bad tracing config accepted: %v", err)
	}
	ok := &Config{TransportConfig: c.TransportConfig}
	ok.SetDefaults()
	if ok.Tracing.SampleRatio != 0.01 || ok.Tracing.ServiceName != "sluice" || ok.Tracing.OTLPEndpoint != "" {
		t.Errorf("tracing defaults %+v", ok.Tracing)
	}
}

// A queue without a result destination of its own takes the transport's and
// lets a request name its own (upstream's routing order); one with its own
// keeps it for every request.
func TestResultFromMessage(t *testing.T) {
	c := &Config{TransportConfig: TransportConfig{ResultQueueName: "default", Queues: []Queue{
		{Queue: transport.Queue{Name: "a"}, IGWBaseURL: "http://gw"},
		{Queue: transport.Queue{Name: "b", ResultName: "own"}, IGWBaseURL: "http://gw"},
	}}}
	c.SetDefaults()
	a, b := c.TransportConfig.Queues[0], c.TransportConfig.Queues[1]
	if a.ResultName != "default" || !a.ResultFromMessage {
		t.Errorf("queue a: result %q, from message %v; want the default, true", a.ResultName, a.ResultFromMessage)
	}
	if b.ResultName != "own" || b.ResultFromMessage {
		t.Errorf("queue b: result %q, from message %v; want its own, false", b.ResultName, b.ResultFromMessage)
	}
}

func TestLimitsAndResultWriteKeys(t *testing.T) {
	c, err := Parse([]byte(`{"limits":{"max_payload_bytes":10,"max_headers":2,"max_header_bytes":-1,"max_metadata_keys":3,"max_metadata_bytes":40},
		"result_write_timeout":"90s","result_hand_back_delay":"5s"}`), "f")
	if err != nil {
		t.Fatal(err)
	}
	want := wire.Limits{MaxPayloadBytes: 10, MaxHeaders: 2, MaxHeaderBytes: -1, MaxMetadataKeys: 3, MaxMetadataBytes: 40}
	if c.Limits != want || c.ResultWriteTimeout.D() != 90*time.Second || c.ResultHandBackDelay.D() != 5*time.Second {
		t.Errorf("got %+v %v %v", c.Limits, c.ResultWriteTimeout.D(), c.ResultHandBackDelay.D())
	}
}

func TestLimitsUnknownKey(t *testing.T) {
	if _, err := Parse([]byte(`{"limits":{"max_payload":1}}`), "f"); err == nil || !strings.Contains(err.Error(), "max_payload") {
		t.Errorf("unknown limits key: %v", err)
	}
}

// What upstream accepts and sluice does not act on is said once each, by
// Warnings; a clean config has none.
func TestWarnings(t *testing.T) {
	base := `"transport_config":{"result_queue_name":"r","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]%s}`
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"clean", `{` + fmt.Sprintf(base, "") + `}`, nil},
		{"enable_tracing", `{` + fmt.Sprintf(base, `,"enable_tracing":true`) + `}`,
			[]string{"transport_config.enable_tracing is accepted and ignored"}},
		{"misspelled merge parameter", `{"merge_policy":{"type":"random-robin","parameters":{"fairness_heder":"x-t","fairness_attribute":"tenant"}},` + fmt.Sprintf(base, "") + `}`,
			[]string{`merge_policy.parameters.fairness_heder is not a parameter sluice reads (did you mean "fairness_header"?): ignored`}},
		{"unknown merge parameter", `{"merge_policy":{"parameters":{"colour":"red"}},` + fmt.Sprintf(base, "") + `}`,
			[]string{"merge_policy.parameters.colour is not a parameter sluice reads: ignored"}},
		{"tier parameter under random-robin", `{"merge_policy":{"parameters":{"priority_header":"x-p"}},` + fmt.Sprintf(base, "") + `}`,
			[]string{"merge_policy.parameters.priority_header applies to the tier-priority policy only: ignored with random-robin"}},
		{"tier parameter under tier-priority", `{"merge_policy":{"type":"tier-priority","parameters":{"priority_header":"x-p","tier_label":"t"}},` + fmt.Sprintf(base, "") + `}`, nil},
		{"lane parameters under tier-priority", `{"merge_policy":{"type":"tier-priority","parameters":{"objective_header":"x-o","lane_objectives":{},"lane_min_share":{"overflow-batch":0.1}}},` + fmt.Sprintf(base, "") + `}`, nil},
		{"lane_min_share under random-robin", `{"merge_policy":{"parameters":{"lane_min_share":{"overflow-batch":0.1}}},` + fmt.Sprintf(base, "") + `}`,
			[]string{"merge_policy.parameters.lane_min_share applies to the tier-priority policy only: ignored with random-robin"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.doc), "f")
			if err != nil {
				t.Fatal(err)
			}
			c.SetDefaults()
			if err := c.Validate(known()); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			got := c.Warnings()
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want %d", got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q, want %q in it", got[i], w)
				}
			}
		})
	}
}

// batch_size, upstream's per-subscription bound on GCP, bounds each queue
// without a max_concurrency on gcp-pubsub in the queues form as in the
// topics form; other transports read it as their own option only.
func TestGCPBatchSizeInQueuesForm(t *testing.T) {
	doc := `{"transport":%q,"transport_config":{"batch_size":7,"result_queue_name":"r","queues":[
	  {"queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"b","igw_base_url":"http://gw","max_concurrency":3}]}}`
	for _, tc := range []struct {
		transport string
		a, b      int
	}{{"gcp-pubsub", 7, 3}, {"redis-sortedset", 64, 3}} {
		c, err := Parse(fmt.Appendf(nil, doc, tc.transport), "f")
		if err != nil {
			t.Fatal(err)
		}
		c.SetDefaults()
		qs := c.TransportConfig.Queues
		if qs[0].MaxConcurrency != tc.a || qs[1].MaxConcurrency != tc.b {
			t.Errorf("%s: max_concurrency %d, %d; want %d, %d", tc.transport, qs[0].MaxConcurrency, qs[1].MaxConcurrency, tc.a, tc.b)
		}
		if !strings.Contains(string(c.TransportConfig.Options), `"batch_size":7`) {
			t.Errorf("%s: batch_size no longer a transport option: %s", tc.transport, c.TransportConfig.Options)
		}
	}
}

// Duplicate ids and duplicate queue names are refused separately, each
// naming both entries.
func TestValidateDuplicateQueues(t *testing.T) {
	tests := []struct {
		name   string
		queues []Queue
		want   []string
		absent []string
	}{
		{"distinct", []Queue{{Queue: transport.Queue{ID: "x", Name: "a"}}, {Queue: transport.Queue{ID: "y", Name: "b"}}}, nil,
			[]string{"duplicate"}},
		{"same id", []Queue{{Queue: transport.Queue{ID: "x", Name: "a"}}, {Queue: transport.Queue{ID: "x", Name: "b"}}},
			[]string{`transport_config.queues[1].id: duplicate queue id "x": queues[0] and queues[1]`}, []string{"duplicate queue_name"}},
		{"same name", []Queue{{Queue: transport.Queue{ID: "x", Name: "a"}}, {Queue: transport.Queue{ID: "y", Name: "a"}}},
			[]string{`transport_config.queues[1].queue_name: duplicate queue_name "a": queues[0] and queues[1]`}, []string{"duplicate queue id"}},
		{"third repeats first", []Queue{{Queue: transport.Queue{Name: "a"}}, {Queue: transport.Queue{Name: "b"}}, {Queue: transport.Queue{Name: "a"}}},
			[]string{`queues[2].id: duplicate queue id "a": queues[0] and queues[2]`, `queues[2].queue_name: duplicate queue_name "a": queues[0] and queues[2]`}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.queues {
				tc.queues[i].IGWBaseURL = "http://gw"
			}
			c := &Config{TransportConfig: TransportConfig{ResultQueueName: "r", Queues: tc.queues}}
			c.SetDefaults()
			text := ""
			if err := c.Validate(known()); err != nil {
				text = err.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("missing %q in %q", w, text)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(text, a) {
					t.Errorf("unexpected %q in %q", a, text)
				}
			}
		})
	}
}

// evict is refused under tier-priority, accepted otherwise.
func TestValidateEvict(t *testing.T) {
	for _, policy := range []string{"", PolicyTierPriority} {
		c := &Config{MergePolicy: MergePolicy{Type: policy}, TransportConfig: TransportConfig{ResultQueueName: "r",
			Queues: []Queue{{Queue: transport.Queue{Name: "a"}, IGWBaseURL: "http://gw", Evict: true, EvictLimit: -1}}}}
		c.SetDefaults()
		err := c.Validate(known())
		refused := err != nil && strings.Contains(err.Error(), "transport_config.queues[0].evict: not supported under merge_policy tier-priority")
		if refused != (policy == PolicyTierPriority) {
			t.Errorf("merge_policy %q: err %v", policy, err)
		}
	}
}

// resume needs evict: only a request taken back is resumed.
func TestValidateResume(t *testing.T) {
	for _, evict := range []bool{false, true} {
		c := &Config{TransportConfig: TransportConfig{ResultQueueName: "r",
			Queues: []Queue{{Queue: transport.Queue{Name: "a"}, IGWBaseURL: "http://gw", Evict: evict, Resume: true}}}}
		c.SetDefaults()
		err := c.Validate(known())
		refused := err != nil && strings.Contains(err.Error(), "transport_config.queues[0].resume: needs evict: true")
		if refused == evict {
			t.Errorf("evict %v: err %v", evict, err)
		}
	}
}

// The fronts' sections are kept as written, for their components to read
// (cmd/sluice); UnknownKeys reports their unknown keys as Parse reports
// the config's own.
func TestFrontSectionsKeptRaw(t *testing.T) {
	doc := `{"batch_api": {"enabled": true, "files": {"store": "disk"}}, "openai_api": {"enabled": true},
	  "transport_config": {"queues": [{"queue_name": "q", "igw_base_url": "http://gw"}]}}`
	c, err := Parse([]byte(doc), "f.json")
	if err != nil {
		t.Fatal(err)
	}
	if string(c.BatchAPI) != `{"enabled": true, "files": {"store": "disk"}}` || string(c.OpenAIAPI) != `{"enabled": true}` {
		t.Errorf("sections: %s, %s", c.BatchAPI, c.OpenAIAPI)
	}
	shape := struct {
		Listen string `json:"listen"`
		State  struct {
			Path string `json:"path"`
		} `json:"state"`
	}{}
	ps := UnknownKeys([]byte(`{"listne": "x", "state": {"path": "p", "pth": "p"}}`), shape, "batch_api")
	want := `batch_api.listne: unknown field (did you mean "listen"?)` + "\n" + `batch_api.state.pth: unknown field (did you mean "path"?)`
	if ps.Error() != want {
		t.Errorf("UnknownKeys:\n%v\nwant\n%s", ps, want)
	}
	if ps := UnknownKeys([]byte(`{"listen": "x"}`), shape, "batch_api"); ps != nil {
		t.Errorf("UnknownKeys of known keys: %v", ps)
	}
}
