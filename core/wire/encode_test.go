package wire

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestEncodeRequestExact(t *testing.T) {
	tests := []struct {
		name string
		req  *Request
		want string
	}{
		{"seed", &seedRequest, `{"id":"batch_req_xyz","created":1700000000,"deadline":1700086400,` +
			`"payload":{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":128},` +
			`"metadata":{"job_id":"batch_abc123","request_index":"42"},` +
			`"headers":{"x-llm-d-inference-fairness-id":"tenant-7"},"endpoint":"/v1/chat/completions"}`},
		{"minimal", minimal(nil), `{"id":"a","deadline":1700086400,"payload":{}}`},
		{"fractional times", minimal(func(r *Request) {
			r.Created = ts(1700000000, 250_000_000)
			r.Deadline = ts(1700086400, 123_000_000)
		}), `{"id":"a","created":1700000000.25,"deadline":1700086400.123,"payload":{}}`},
		{"times rounded to the millisecond", minimal(func(r *Request) {
			r.Created = ts(1700000000, 999_600_000)
			r.Deadline = ts(1700086400, 1_400_000)
		}), `{"id":"a","created":1700000001,"deadline":1700086400.001,"payload":{}}`},
		{"payload verbatim, outer whitespace dropped", minimal(func(r *Request) {
			r.Payload = []byte(" {\"b\" : \"caf\\u00e9\",\n\"a\":1}\n")
		}), "{\"id\":\"a\",\"deadline\":1700086400,\"payload\":{\"b\" : \"caf\\u00e9\",\n\"a\":1}}"},
		{"queue names and escapes", minimal(func(r *Request) {
			r.ID = `a"<b>`
			r.RequestQueueName, r.ResultQueueName = "rq", "res"
			r.Kind, r.RetryCount, r.Token = "redis", 4, "t" // envelope-only, not written
		}), `{"id":"a\"\u003cb\u003e","deadline":1700086400,"payload":{},"request_queue_name":"rq","result_queue_name":"res"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EncodeRequest(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("EncodeRequest:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestEncodeRequestRoundTrip(t *testing.T) {
	reqs := []*Request{
		&seedRequest,
		minimal(nil),
		minimal(func(r *Request) {
			r.Created = ts(1700000000, 1_000_000)
			r.Deadline = ts(1700086400, 999_000_000)
			r.Metadata = map[string]string{"job_id": "j", "é": "ü\n", "": ""}
			r.Headers = map[string]string{"X-A": "b\tc"}
			r.Endpoint = "/v1/completions"
			r.RequestQueueName, r.ResultQueueName = "llm-d-async:requests:p", "llm-d-async:results:p:$batch"
			r.Labels = map[string]string{"tier": "batch"} // envelope-only, not written
		}),
		minimal(func(r *Request) { r.Deadline = ts(maxUnixSeconds, 999_000_000) }),
		minimal(func(r *Request) { r.Deadline = ts(0, 1_000_000) }),
	}
	for _, p := range payloadCases {
		reqs = append(reqs, minimal(func(r *Request) { r.Payload = []byte(p) }))
	}
	for _, r := range reqs {
		b, err := EncodeRequest(r)
		if err != nil {
			t.Fatalf("EncodeRequest(%+v): %v", r, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%s): %v", b, err)
		}
		want := *r
		want.Kind, want.RetryCount, want.Token, want.Labels = "", 0, "", nil
		if d := diffRequest(got, &want); d != "" {
			t.Errorf("round trip of %s: %s", b, d)
		}
	}
}

func TestEncodeRequestRejects(t *testing.T) {
	tests := []struct {
		name string
		req  *Request
		want string
	}{
		{"no id", minimal(func(r *Request) { r.ID = "" }), `encode request "": id: missing or empty`},
		{"no deadline", minimal(func(r *Request) { r.Deadline = time.Time{} }), `encode request "a": deadline: must not be before the Unix epoch`},
		{"deadline at the epoch", minimal(func(r *Request) { r.Deadline = ts(0, 400_000) }), `encode request "a": deadline: must be after the Unix epoch`},
		{"deadline after 9999", minimal(func(r *Request) { r.Deadline = ts(maxUnixSeconds+1, 0) }), `encode request "a": deadline: is out of range (after year 9999)`},
		{"created before the epoch", minimal(func(r *Request) { r.Created = ts(-10, 0) }), `encode request "a": created: must not be before the Unix epoch`},
		{"payload missing", minimal(func(r *Request) { r.Payload = nil }), `encode request "a": payload: not valid JSON`},
		{"payload invalid", minimal(func(r *Request) { r.Payload = []byte(`{"a":}`) }), `encode request "a": payload: not valid JSON`},
		{"payload array", minimal(func(r *Request) { r.Payload = []byte(`[]`) }), `encode request "a": payload: must be a JSON object, got array`},
		{"header value CRLF", minimal(func(r *Request) { r.Headers = map[string]string{"a": "\r\n"} }), `encode request "a": headers["a"]: header value holds a control character`},
		{"endpoint relative", minimal(func(r *Request) { r.Endpoint = "v1" }), `encode request "a": endpoint: must be a path starting with a single "/", got "v1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := EncodeRequest(tt.req)
			if err == nil {
				t.Fatalf("EncodeRequest accepted it: %s", b)
			}
			if err.Error() != tt.want {
				t.Errorf("error %q, want %q", err, tt.want)
			}
		})
	}
}

func TestWithRetryCount(t *testing.T) {
	const data = `{"id":"a","deadline":1700086400,"payload":{ "x" : "\u00e9" }}`
	tests := []struct {
		name string
		raw  string
		n    int
		want string
	}{
		{"flat is wrapped verbatim", data, 1,
			`{"request_kind":"plain","internal":{"retry_count":1},"data":` + data + `}`},
		{"flat with surrounding whitespace", "\n " + data + " \n", 2,
			`{"request_kind":"plain","internal":{"retry_count":2},"data":` + data + `}`},
		{"envelope: only retry_count changes", `{"request_kind":"redis", "internal" : {"queue_id":"q", "retry_count" : 0 ,"request_token":"t"},"data":` + data + `,"extra":[1]}`, 12,
			`{"request_kind":"redis", "internal" : {"queue_id":"q", "retry_count" : 12 ,"request_token":"t"},"data":` + data + `,"extra":[1]}`},
		{"envelope without retry_count", `{"request_kind":"redis","internal":{"queue_id":"q"},"data":` + data + `}`, 3,
			`{"request_kind":"redis","internal":{"retry_count":3,"queue_id":"q"},"data":` + data + `}`},
		{"envelope with empty internal", `{"request_kind":"redis","internal":{ },"data":` + data + `}`, 3,
			`{"request_kind":"redis","internal":{"retry_count":3 },"data":` + data + `}`},
		{"envelope without internal", `{"request_kind":"redis","data":` + data + `}`, 4,
			`{"internal":{"retry_count":4},"request_kind":"redis","data":` + data + `}`},
		{"envelope with null internal", `{"request_kind":"redis","internal":null,"data":` + data + `}`, 5,
			`{"request_kind":"redis","internal":{"retry_count":5},"data":` + data + `}`},
		{"last of duplicate retry_counts is replaced", `{"request_kind":"redis","internal":{"retry_count":1,"RETRY_COUNT":null},"data":` + data + `}`, 6,
			`{"request_kind":"redis","internal":{"retry_count":1,"RETRY_COUNT":6},"data":` + data + `}`},
		{"last of duplicate internals is rewritten", `{"request_kind":"redis","internal":{"retry_count":1,"request_token":"t"},"Internal":{"queue_id":"q"},"data":` + data + `}`, 7,
			`{"request_kind":"redis","internal":{"retry_count":1,"request_token":"t"},"Internal":{"retry_count":7,"queue_id":"q"},"data":` + data + `}`},
		{"names are matched after unescaping", `{"request_kind":"redis","intern\u0061l":{"retry_\u0063ount":1},"data":` + data + `}`, 9,
			`{"request_kind":"redis","intern\u0061l":{"retry_\u0063ount":9},"data":` + data + `}`},
		{"a null last internal stays the only one", `{"request_kind":"redis","internal":{"request_token":"t"},"internal":null,"data":` + data + `}`, 8,
			`{"request_kind":"redis","internal":null,"internal":{"retry_count":8},"data":` + data + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithRetryCount([]byte(tt.raw), tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("WithRetryCount:\n got %s\nwant %s", got, tt.want)
			}
			checkRetryRoundTrip(t, []byte(tt.raw), got, tt.n)
		})
	}
}

// checkRetryRoundTrip checks that out, made by WithRetryCount(raw, n), decodes
// to raw's request with RetryCount n (and Kind "plain" when raw was flat).
func checkRetryRoundTrip(t testing.TB, raw, out []byte, n int) {
	t.Helper()
	checkRequeued(t, "WithRetryCount", raw, out, n, nil, false)
}

// checkEnvelopeRoundTrip checks that out, made by WithEnvelope(raw, n,
// labels), decodes to raw's request with RetryCount n and Labels labels (and
// Kind "plain" when raw was flat).
func checkEnvelopeRoundTrip(t testing.TB, raw, out []byte, n int, labels map[string]string) {
	t.Helper()
	checkRequeued(t, "WithEnvelope", raw, out, n, labels, true)
}

// checkRequeued checks what fn (WithRetryCount or WithEnvelope) made of raw:
// out decodes as an envelope to raw's request with RetryCount n, Labels
// labels when setLabels is set and raw's labels otherwise, and every other
// field unchanged (Kind "plain" when raw was flat); the payload bytes are
// kept.
func checkRequeued(t testing.TB, fn string, raw, out []byte, n int, labels map[string]string, setLabels bool) {
	t.Helper()
	before, env, err := decode(raw)
	if err != nil {
		t.Fatalf("decode(raw): %v", err)
	}
	after, envAfter, err := decode(out)
	if err != nil {
		t.Fatalf("decode(%s(%q, %d) = %q): %v", fn, raw, n, out, err)
	}
	want := *before
	want.RetryCount = n
	if setLabels {
		want.Labels = labels
	}
	if !env {
		want.Kind = "plain"
	}
	if d := diffRequest(after, &want); d != "" || !envAfter {
		t.Fatalf("%s(%q, %d) = %q decodes differently (envelope %v): %s", fn, raw, n, out, envAfter, d)
	}
	if !bytes.Contains(out, before.Payload) {
		t.Fatalf("%s(%q, %d) = %q lost the payload bytes", fn, raw, n, out)
	}
}

func TestWithRetryCountKeepsLabels(t *testing.T) {
	const raw = `{"request_kind":"redis","internal":{"labels":{"b":"2","a":"1"},"retry_count":1},"data":{"id":"a","deadline":1700086400,"payload":{}}}`
	got, err := WithRetryCount([]byte(raw), 2)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(raw, `"retry_count":1`, `"retry_count":2`, 1); string(got) != want {
		t.Errorf("WithRetryCount:\n got %s\nwant %s", got, want)
	}
	checkRetryRoundTrip(t, []byte(raw), got, 2)
}

func TestWithEnvelope(t *testing.T) {
	const data = `{"id":"a","deadline":1700086400,"payload":{ "x" : "\u00e9" }}`
	ab := map[string]string{"b": "2", "a": "1"}
	tests := []struct {
		name   string
		raw    string
		n      int
		labels map[string]string
		want   string
	}{
		{"flat is wrapped verbatim", data, 1, ab,
			`{"request_kind":"plain","internal":{"retry_count":1,"labels":{"a":"1","b":"2"}},"data":` + data + `}`},
		{"flat without labels", " " + data + "\n", 1, nil,
			`{"request_kind":"plain","internal":{"retry_count":1},"data":` + data + `}`},
		{"flat with empty labels", data, 1, map[string]string{},
			`{"request_kind":"plain","internal":{"retry_count":1},"data":` + data + `}`},
		{"keys sorted, strings escaped as json.Marshal does", data, 0, map[string]string{"z": "<\n>", "classification": "reserved", "é": "\u2028"},
			`{"request_kind":"plain","internal":{"retry_count":0,"labels":{"classification":"reserved","z":"\u003c\n\u003e","é":"\u2028"}},"data":` + data + `}`},
		{"envelope: only retry_count and labels change", `{"request_kind":"redis", "internal" : {"labels" : {"old":"x"} , "queue_id":"q", "retry_count" : 0 },"data":` + data + `,"extra":[1]}`, 12, ab,
			`{"request_kind":"redis", "internal" : {"labels" : {"a":"1","b":"2"} , "queue_id":"q", "retry_count" : 12 },"data":` + data + `,"extra":[1]}`},
		{"envelope without labels", `{"request_kind":"redis","internal":{"queue_id":"q","retry_count":0},"data":` + data + `}`, 3, ab,
			`{"request_kind":"redis","internal":{"labels":{"a":"1","b":"2"},"queue_id":"q","retry_count":3},"data":` + data + `}`},
		{"envelope without retry_count or labels", `{"request_kind":"redis","internal":{"queue_id":"q"},"data":` + data + `}`, 3, ab,
			`{"request_kind":"redis","internal":{"retry_count":3,"labels":{"a":"1","b":"2"},"queue_id":"q"},"data":` + data + `}`},
		{"envelope with empty internal", `{"request_kind":"redis","internal":{ },"data":` + data + `}`, 3, ab,
			`{"request_kind":"redis","internal":{"retry_count":3,"labels":{"a":"1","b":"2"} },"data":` + data + `}`},
		{"envelope without internal", `{"request_kind":"redis","data":` + data + `}`, 4, ab,
			`{"internal":{"retry_count":4,"labels":{"a":"1","b":"2"}},"request_kind":"redis","data":` + data + `}`},
		{"envelope with null internal", `{"request_kind":"redis","internal":null,"data":` + data + `}`, 5, ab,
			`{"request_kind":"redis","internal":{"retry_count":5,"labels":{"a":"1","b":"2"}},"data":` + data + `}`},
		{"existing labels replaced, not merged", `{"request_kind":"redis","internal":{"retry_count":1,"labels":{"a":"0","c":"3"}},"data":` + data + `}`, 2, ab,
			`{"request_kind":"redis","internal":{"retry_count":2,"labels":{"a":"1","b":"2"}},"data":` + data + `}`},
		{"existing labels cleared with {}", `{"request_kind":"redis","internal":{"retry_count":1,"labels":{"a":"0"}},"data":` + data + `}`, 2, nil,
			`{"request_kind":"redis","internal":{"retry_count":2,"labels":{}},"data":` + data + `}`},
		{"ignored labels left alone when there are none to write", `{"request_kind":"redis","internal":{"retry_count":1,"labels":7},"data":` + data + `}`, 2, nil,
			`{"request_kind":"redis","internal":{"retry_count":2,"labels":7},"data":` + data + `}`},
		{"ignored labels replaced", `{"request_kind":"redis","internal":{"retry_count":1,"labels":[]},"data":` + data + `}`, 2, ab,
			`{"request_kind":"redis","internal":{"retry_count":2,"labels":{"a":"1","b":"2"}},"data":` + data + `}`},
		{"last of duplicate labels is replaced", `{"request_kind":"redis","internal":{"labels":{"a":"0"},"LABELS":null},"data":` + data + `}`, 6, ab,
			`{"request_kind":"redis","internal":{"retry_count":6,"labels":{"a":"0"},"LABELS":{"a":"1","b":"2"}},"data":` + data + `}`},
		{"labels of an earlier internal overridden in the last", `{"request_kind":"redis","internal":{"retry_count":1,"labels":{"c":"3"}},"Internal":{"queue_id":"q"},"data":` + data + `}`, 7, ab,
			`{"request_kind":"redis","internal":{"retry_count":1,"labels":{"c":"3"}},"Internal":{"retry_count":7,"labels":{"a":"1","b":"2"},"queue_id":"q"},"data":` + data + `}`},
		{"labels of an earlier internal cleared in the last", `{"request_kind":"redis","internal":{"labels":{"c":"3"}},"internal":{"retry_count":1},"data":` + data + `}`, 7, nil,
			`{"request_kind":"redis","internal":{"labels":{"c":"3"}},"internal":{"labels":{},"retry_count":7},"data":` + data + `}`},
		{"names are matched after unescaping", `{"request_kind":"redis","intern\u0061l":{"l\u0061bels":{},"retry_\u0063ount":1},"data":` + data + `}`, 9, ab,
			`{"request_kind":"redis","intern\u0061l":{"l\u0061bels":{"a":"1","b":"2"},"retry_\u0063ount":9},"data":` + data + `}`},
		{"a null last internal stays the only one", `{"request_kind":"redis","internal":{"labels":{"c":"3"}},"internal":null,"data":` + data + `}`, 8, ab,
			`{"request_kind":"redis","internal":null,"internal":{"retry_count":8,"labels":{"a":"1","b":"2"}},"data":` + data + `}`},
		{"a null last internal, no labels", `{"request_kind":"redis","internal":{"labels":{"c":"3"}},"internal":null,"data":` + data + `}`, 8, nil,
			`{"request_kind":"redis","internal":null,"internal":{"retry_count":8},"data":` + data + `}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := WithEnvelope([]byte(tt.raw), tt.n, tt.labels)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("WithEnvelope:\n got %s\nwant %s", got, tt.want)
			}
			checkEnvelopeRoundTrip(t, []byte(tt.raw), got, tt.n, tt.labels)
		})
	}
}

func TestWithEnvelopeRejects(t *testing.T) {
	if _, err := WithEnvelope([]byte(seedFlat), -1, nil); err == nil || err.Error() != "rewrite envelope: retry count -1 must not be negative" {
		t.Errorf("negative retry count: err = %v", err)
	}
	_, err := WithEnvelope([]byte(`{"request_kind":"redis","internal":{"labels":{"k":[]}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`), 1, nil)
	if de, ok := AsDecodeError(err); !ok || de.ID != "a" {
		t.Errorf("invalid message: err = %v, want a *DecodeError for id a", err)
	}
	if err == nil || err.Error() != `rewrite envelope: invalid request a: internal.labels["k"]: must be a string, number or bool, got array` {
		t.Errorf("invalid message: err = %v", err)
	}
}

func TestWithRetryCountKeepsPayloadBytes(t *testing.T) {
	for _, p := range payloadCases {
		for _, raw := range []string{
			`{"id":"a","deadline":1700086400,"payload":` + p + `}`,
			`{"request_kind":"redis","internal":{"retry_count":2},"data":{"id":"a","deadline":1700086400,"payload":` + p + `}}`,
		} {
			out := []byte(raw)
			for n := 1; n <= 3; n++ { // again and again, as retries do
				var err error
				if out, err = WithRetryCount(out, n); err != nil {
					t.Fatal(err)
				}
				req, err := Decode(out)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(req.Payload, []byte(p)) || req.RetryCount != n {
					t.Fatalf("after WithRetryCount(_, %d): payload %s retry %d, want %s", n, req.Payload, req.RetryCount, p)
				}
			}
		}
	}
}

func TestWithRetryCountRejects(t *testing.T) {
	if _, err := WithRetryCount([]byte(seedFlat), -1); err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Errorf("negative n: err = %v", err)
	}
	_, err := WithRetryCount([]byte(`{"id":"a","payload":{}}`), 1)
	if de, ok := AsDecodeError(err); !ok || de.ID != "a" {
		t.Errorf("invalid message: err = %v, want a *DecodeError for id a", err)
	}
	if err == nil || err.Error() != "set retry count: invalid request a: deadline: missing" {
		t.Errorf("invalid message: err = %v", err)
	}
}
