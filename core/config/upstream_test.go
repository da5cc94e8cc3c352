package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
)

// TestParseUpstreamFiles parses queue and topic files written in upstream's
// shapes (its transport configs, its bare queue arrays and its GCP topics
// file) and checks what each field became.
func TestParseUpstreamFiles(t *testing.T) {
	for _, tc := range []struct {
		file    string
		want    []Queue
		result  string
		tracing bool
		options map[string]any
	}{
		{
			file: "upstream-redis-sortedset.json", result: "result-list", tracing: true,
			options: map[string]any{"url": "redis://redis.llm-d.svc:6379/0", "retry_queue_name": "retry-sortedset",
				"poll_interval_ms": 1000.0, "batch_size": 10.0},
			want: []Queue{
				{Queue: transport.Queue{ID: "interactive", Name: "llm-d-async:requests:pool-a", ResultName: "llm-d-async:results:pool-a:$batch"},
					WorkerPoolID: "fast", InferenceObjective: "premium", RequestPathURL: "/v1/chat/completions",
					IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80", GateType: "prometheus-saturation",
					GateParams: raws(`{"pool": "pool-a", "threshold": 0.8, "fallback": "0", "cache_ttl": "5s"}`),
					Labels:     map[string]string{"tier": "interactive", "team": "search"}},
				{Queue: transport.Queue{Name: "request-sortedset"}, IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80",
					GateType: "composite", GateParams: raws(`{"gates": "[{\"gate_type\":\"constant\",\"gate_params\":{\"budget\":0.5}},{\"gate_type\":\"constant\",\"gate_params\":{\"budget\":\"1\"}}]"}`)},
			},
		},
		{
			file: "upstream-redis-pubsub.json", result: "result-queue",
			options: map[string]any{"url": "redis://redis.llm-d.svc:6379/0", "retry_queue_name": "retry-sortedset"},
			want: []Queue{{Queue: transport.Queue{Name: "request-queue"}, WorkerPoolID: "default", InferenceObjective: "batch",
				RequestPathURL: "/v1/completions", IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80",
				Labels: map[string]string{"tier": "batch"}}},
		},
		{
			file: "upstream-gcp-pubsub.json", result: "llm-d-async-results",
			options: map[string]any{"project_id": "my-project", "batch_size": 25.0},
			want: []Queue{
				{Queue: transport.Queue{Name: "llm-d-async-requests-pool-a", MaxConcurrency: 25}, WorkerPoolID: "batch", InferenceObjective: "standard",
					RequestPathURL: "/v1/chat/completions", IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80", GateType: "composite",
					GateParams: raws(`{"gates": [
          {"gate_type": "constant", "gate_params": {"budget": 1}},
          {"gate_type": "constant", "gate_params": {"budget": "0.25"}}
        ]}`),
					Labels: map[string]string{"tier": "batch"}},
				{Queue: transport.Queue{Name: "llm-d-async-requests-pool-b", ResultName: "llm-d-async-results-pool-b", MaxConcurrency: 25},
					IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80"},
			},
		},
		{
			file: "upstream-gcp-topics.json",
			want: []Queue{{Queue: transport.Queue{Name: "llm-d-async-requests"}, WorkerPoolID: "default",
				RequestPathURL: "/v1/completions", IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80",
				GateParams: raws(`{"budget_key": "dispatch-gate-budget", "enabled": true, "n": 100.0, "unset": null, "empty": ""}`)}},
		},
		{
			file: "upstream-redis-ss-queues.json",
			want: []Queue{{Queue: transport.Queue{ID: "q1", Name: "request-sortedset", ResultName: "result-list"}, WorkerPoolID: "default",
				IGWBaseURL: "http://llm-d-inference-gateway.llm-d.svc:80", GateType: "redis",
				GateParams: raws(`{"address": "redis.llm-d.svc:6379", "budget_key": "dispatch-gate-budget"}`)}},
		},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseQueues(data, tc.file)
			if err != nil {
				t.Fatalf("ParseQueues: %v", err)
			}
			if !reflect.DeepEqual(normRaw(t, got.Queues), normRaw(t, tc.want)) {
				t.Errorf("queues:\n got %+v\nwant %+v", got.Queues, tc.want)
			}
			if got.ResultQueueName != tc.result || got.EnableTracing != tc.tracing {
				t.Errorf("result_queue_name %q enable_tracing %v, want %q %v", got.ResultQueueName, got.EnableTracing, tc.result, tc.tracing)
			}
			var opts map[string]any
			if len(got.Options) > 0 {
				if err := json.Unmarshal(got.Options, &opts); err != nil {
					t.Fatal(err)
				}
			}
			if len(opts) != len(tc.options) || (len(opts) > 0 && !reflect.DeepEqual(opts, tc.options)) {
				t.Errorf("transport options %v, want %v", opts, tc.options)
			}

			// The same file as the transport_config of a whole config parses,
			// defaults and validates.
			if data[0] == '[' {
				data = []byte(`{"queues":` + string(data) + `}`)
			}
			c, err := Parse([]byte(`{"transport_config":`+string(data)+`}`), tc.file)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if c.TransportConfig.ResultQueueName == "" {
				c.TransportConfig.ResultQueueName = "results"
			}
			// The pools the queues name, as upstream's --pool-config-file
			// would give them (without it, upstream refuses such queues too).
			for _, q := range c.TransportConfig.Queues {
				if id := q.WorkerPoolID; id != "" && c.Pool(id) == nil {
					c.WorkerPools = append(c.WorkerPools, WorkerPool{ID: id, Workers: 4})
				}
			}
			if len(c.WorkerPools) > 0 && c.Pool(DefaultWorkerPoolID) == nil {
				c.WorkerPools = append(c.WorkerPools, WorkerPool{ID: DefaultWorkerPoolID, Workers: 4})
			}
			c.SetDefaults()
			for i, q := range c.TransportConfig.Queues {
				if want := tc.want[i].WorkerPoolID; q.WorkerPoolID != want && !(want == "" && q.WorkerPoolID == DefaultWorkerPoolID) {
					t.Errorf("queues[%d].worker_pool_id = %q after defaults", i, q.WorkerPoolID)
				}
			}
			if err := c.Validate(Known{}); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

// raws turns a JSON object into gate_params.
func raws(obj string) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(obj), &m); err != nil {
		panic(err)
	}
	return m
}

// normRaw compacts every gate_params value, so that spacing does not count.
func normRaw(t *testing.T, qs []Queue) []Queue {
	t.Helper()
	out := make([]Queue, len(qs))
	for i, q := range qs {
		if q.GateParams != nil {
			gp := map[string]json.RawMessage{}
			for k, v := range q.GateParams {
				var b strings.Builder
				var val any
				if err := json.Unmarshal(v, &val); err != nil {
					t.Fatal(err)
				}
				enc := json.NewEncoder(&b)
				if err := enc.Encode(val); err != nil {
					t.Fatal(err)
				}
				gp[k] = json.RawMessage(b.String())
			}
			q.GateParams = gp
		}
		out[i] = q
	}
	return out
}

func TestUpstreamSpellingsConflict(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"queues and topics", `{"queues":[],"topics":[]}`, "queues and topics: give one of them"},
		{"subscriber_id and queue_name", `{"topics":[{"subscriber_id":"a","queue_name":"b","igw_base_url":"http://gw"}]}`,
			`topics[0]: subscriber_id "a" and queue_name "b" differ`},
		{"result_topic_id and result_queue_name", `{"result_topic_id":"a","result_queue_name":"b","topics":[]}`,
			`result_queue_name "b" and result_topic_id "a" differ`},
		{"per-topic result", `{"topics":[{"subscriber_id":"s","result_topic_id":"a","result_queue_name":"b"}]}`,
			`topics[0]: result_topic_id "a" and result_queue_name "b" differ`},
		{"enable_tracing as a string", `{"enable_tracing":"yes","queues":[]}`, "enable_tracing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseQueues([]byte(tc.doc), "f.json")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// GCP batch_size: each topic's max_concurrency unless the topic sets
	// one; with the "queues" spelling it is only the transport's option.
	tc, err := ParseQueues([]byte(`{"batch_size":10,"topics":[{"subscriber_id":"a"},{"subscriber_id":"b","max_concurrency":50}]}`), "f.json")
	if err != nil || tc.Queues[0].MaxConcurrency != 10 || tc.Queues[1].MaxConcurrency != 50 || string(tc.Options) != `{"batch_size":10}` {
		t.Fatalf("batch_size: %+v %v", tc, err)
	}
	tc, err = ParseQueues([]byte(`{"batch_size":10,"queues":[{"queue_name":"a"}]}`), "f.json")
	if err != nil || tc.Queues[0].MaxConcurrency != 0 {
		t.Fatalf("batch_size with queues: %+v %v", tc, err)
	}
	if _, err := ParseQueues([]byte(`{"batch_size":"ten","topics":[]}`), "f.json"); err == nil || !strings.Contains(err.Error(), "batch_size") {
		t.Fatalf("bad batch_size: %v", err)
	}
	// Equal values in both spellings are fine.
	tc, err = ParseQueues([]byte(`{"result_topic_id":"r","result_queue_name":"r","topics":[{"subscriber_id":"s","queue_name":"s"}]}`), "f.json")
	if err != nil || tc.ResultQueueName != "r" || tc.Queues[0].Name != "s" || tc.Queues[0].SubscriberID != "" {
		t.Fatalf("%+v %v", tc, err)
	}
}

// TestUnknownFieldsStillSuggest: the upstream fields did not loosen the
// strict parser; near misses, including of fields of the embedded
// transport.Queue and of the new upstream fields, get a suggestion.
func TestUnknownFieldsStillSuggest(t *testing.T) {
	doc := `{"transport_config": {"topics": [{"subscriber": "s", "igw_base_url": "http://gw", "queue_nme": "q",
		"workerpool_id": "p", "result_topic": "r", "max_concurency": 3, "colour": "red"}], "batch_size": 3}}`
	_, err := Parse([]byte(doc), "f.json")
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v, want Problems", err)
	}
	text := err.Error()
	for _, want := range []string{
		`f.json: transport_config.topics[0].subscriber: unknown field (did you mean "subscriber_id"?)`,
		`f.json: transport_config.topics[0].queue_nme: unknown field (did you mean "queue_name"?)`,
		`f.json: transport_config.topics[0].workerpool_id: unknown field (did you mean "worker_pool_id"?)`,
		`f.json: transport_config.topics[0].result_topic: unknown field (did you mean "result_topic_id"?)`,
		`f.json: transport_config.topics[0].max_concurency: unknown field (did you mean "max_concurrency"?)`,
		`f.json: transport_config.topics[0].colour: unknown field`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
	_, err = ParseQueues([]byte(`[{"subscriber_id":"s","igw_base_url":"http://gw","worker_pool":"p"}]`), "topics.json")
	if err == nil || !strings.Contains(err.Error(), `topics.json: queues[0].worker_pool: unknown field (did you mean "worker_pool_id"?)`) {
		t.Fatalf("bare array: %v", err)
	}
	_, err = ParseQueues([]byte(`{"topics":[{"subscriber_id":"s","igw_base_url":"http://gw","gate_typ":"x"}]}`), "t.json")
	if err == nil || !strings.Contains(err.Error(), `t.json: topics[0].gate_typ: unknown field (did you mean "gate_type"?)`) {
		t.Fatalf("object form: %v", err)
	}
}

func TestTransportConfigRoundTrip(t *testing.T) {
	in := TransportConfig{Queues: []Queue{{Queue: transport.Queue{Name: "q"}, WorkerPoolID: "p", IGWBaseURL: "http://gw"}},
		ResultQueueName: "r", EnableTracing: true, Options: json.RawMessage(`{"batch_size":25}`)}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out TransportConfig
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip:\n in %+v\nout %+v\n%s", in, out, b)
	}
}
