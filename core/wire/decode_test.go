package wire

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// ts builds a time from Unix seconds and nanoseconds, as Decode does.
func ts(sec, nsec int64) time.Time { return time.Unix(sec, nsec) }

// diffRequest describes how got differs from want, or returns "".
func diffRequest(got, want *Request) string {
	var d []string
	if got.ID != want.ID {
		d = append(d, "ID "+got.ID+" != "+want.ID)
	}
	if !got.Created.Equal(want.Created) || got.Created.IsZero() != want.Created.IsZero() {
		d = append(d, "Created "+got.Created.String()+" != "+want.Created.String())
	}
	if !got.Deadline.Equal(want.Deadline) {
		d = append(d, "Deadline "+got.Deadline.String()+" != "+want.Deadline.String())
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		d = append(d, "Payload "+string(got.Payload)+" != "+string(want.Payload))
	}
	if len(got.Metadata) != 0 || len(want.Metadata) != 0 {
		if !reflect.DeepEqual(got.Metadata, want.Metadata) {
			d = append(d, "Metadata differs")
		}
	}
	if len(got.Headers) != 0 || len(want.Headers) != 0 {
		if !reflect.DeepEqual(got.Headers, want.Headers) {
			d = append(d, "Headers differ")
		}
	}
	if len(got.Labels) != 0 || len(want.Labels) != 0 {
		if !reflect.DeepEqual(got.Labels, want.Labels) {
			d = append(d, fmt.Sprintf("Labels %v != %v", got.Labels, want.Labels))
		}
	}
	for _, f := range []struct{ name, got, want string }{
		{"Endpoint", got.Endpoint, want.Endpoint},
		{"Kind", got.Kind, want.Kind},
		{"Token", got.Token, want.Token},
		{"QueueID", got.QueueID, want.QueueID},
		{"RequestQueueName", got.RequestQueueName, want.RequestQueueName},
		{"ResultQueueName", got.ResultQueueName, want.ResultQueueName},
	} {
		if f.got != f.want {
			d = append(d, f.name+" "+f.got+" != "+f.want)
		}
	}
	if got.RetryCount != want.RetryCount {
		d = append(d, "RetryCount differs")
	}
	return strings.Join(d, "; ")
}

const seedFlat = `{"id":"batch_req_xyz","created":1700000000,"deadline":1700086400,` +
	`"payload":{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":128},` +
	`"metadata":{"job_id":"batch_abc123","request_index":"42"},` +
	`"headers":{"x-llm-d-inference-fairness-id":"tenant-7"}, "endpoint":"/v1/chat/completions"}`

var seedRequest = Request{
	ID:       "batch_req_xyz",
	Created:  ts(1700000000, 0),
	Deadline: ts(1700086400, 0),
	Payload:  []byte(`{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"What is 2+2?"}],"max_tokens":128}`),
	Metadata: map[string]string{"job_id": "batch_abc123", "request_index": "42"},
	Headers:  map[string]string{"x-llm-d-inference-fairness-id": "tenant-7"},
	Endpoint: "/v1/chat/completions",
}

// with returns a copy of seedRequest changed by f.
func with(f func(r *Request)) *Request {
	r := seedRequest
	f(&r)
	return &r
}

// minimal returns a minimal valid request with fields changed by f.
func minimal(f func(r *Request)) *Request {
	r := Request{ID: "a", Deadline: ts(1700086400, 0), Payload: []byte(`{}`)}
	if f != nil {
		f(&r)
	}
	return &r
}

func TestDecodeAccepts(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want *Request
	}{
		{"seed flat form", seedFlat, &seedRequest},
		{"minimal", `{"id":"a","deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"whitespace everywhere", " \n{ \"id\" : \"a\" ,\r\n\t\"deadline\" : 1700086400 , \"payload\" : { } } \n",
			minimal(func(r *Request) { r.Payload = []byte(`{ }`) })},
		{"deadline fractional", `{"id":"a","deadline":1700086400.25,"payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(1700086400, 250_000_000) })},
		{"deadline milliseconds exact", `{"id":"a","deadline":1700086400.123,"payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(1700086400, 123_000_000) })},
		{"deadline nanoseconds, digits past truncated", `{"id":"a","deadline":1700086400.1234567891,"payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(1700086400, 123_456_789) })},
		{"deadline exponent", `{"id":"a","deadline":1.7000864005E9,"payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(1700086400, 500_000_000) })},
		{"deadline negative exponent", `{"id":"a","deadline":17000864001e-1,"payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(1700086400, 100_000_000) })},
		{"deadline string integer (v0.6)", `{"id":"a","deadline":"1700086400","payload":{}}`, minimal(nil)},
		{"deadline string fraction", `{"id":"a","deadline":"1700086400.5","payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(1700086400, 500_000_000) })},
		{"deadline string with escape", `{"id":"a","deadline":"\u0031700086400","payload":{}}`, minimal(nil)},
		{"deadline below a second", `{"id":"a","deadline":0.001,"payload":{}}`,
			minimal(func(r *Request) { r.Deadline = ts(0, 1_000_000) })},
		{"created int and string", `{"id":"a","created":"1700000000","deadline":1700086400,"payload":{}}`,
			minimal(func(r *Request) { r.Created = ts(1700000000, 0) })},
		{"created fractional", `{"id":"a","created":1700000000.999,"deadline":1700086400,"payload":{}}`,
			minimal(func(r *Request) { r.Created = ts(1700000000, 999_000_000) })},
		{"created zero means absent", `{"id":"a","created":0,"deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"created negative zero", `{"id":"a","created":-0.0,"deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"created null", `{"id":"a","created":null,"deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"metadata numbers and bools become strings", `{"id":"a","deadline":1700086400,"payload":{},"metadata":{"i":42,"f":-1.50,"e":1e3,"t":true,"f2":false,"n":null,"s":"x"}}`,
			minimal(func(r *Request) {
				r.Metadata = map[string]string{"i": "42", "f": "-1.50", "e": "1e3", "t": "true", "f2": "false", "n": "", "s": "x"}
			})},
		{"metadata escapes and unicode", `{"id":"a","deadline":1700086400,"payload":{},"metadata":{"k\u00e9y":"v\"\\\n\ud83d\ude00","ü":"ß"}}`,
			minimal(func(r *Request) { r.Metadata = map[string]string{"kéy": "v\"\\\n😀", "ü": "ß"} })},
		{"metadata empty and null", `{"id":"a","deadline":1700086400,"payload":{},"metadata":{},"headers":null}`, minimal(nil)},
		{"metadata duplicate key: last wins", `{"id":"a","deadline":1700086400,"payload":{},"metadata":{"k":"1","k":"2"}}`,
			minimal(func(r *Request) { r.Metadata = map[string]string{"k": "2"} })},
		{"endpoint with query", `{"id":"a","deadline":1700086400,"payload":{},"endpoint":"/v1/completions?api-version=2"}`,
			minimal(func(r *Request) { r.Endpoint = "/v1/completions?api-version=2" })},
		{"queue names in flat form", `{"id":"a","deadline":1700086400,"payload":{},"request_queue_name":"rq","result_queue_name":"res"}`,
			minimal(func(r *Request) { r.RequestQueueName, r.ResultQueueName = "rq", "res" })},
		{"unknown fields ignored", `{"id":"a","deadline":1700086400,"payload":{},"priority":3,"extra":{"x":[1,2]},"data":"junk","labels":7}`, minimal(nil)},
		{"flat with data but no request_kind or internal", `{"id":"a","deadline":1700086400,"payload":{},"data":{"id":5}}`, minimal(nil)},
		{"flat with request_kind but no data", `{"request_kind":"plain","id":"a","deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"envelope with null data is flat", `{"request_kind":"plain","data":null,"id":"a","deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"names match case-insensitively, as encoding/json does", `{"ID":"a","Deadline":1700086400,"PayLoad":{}}`, minimal(nil)},
		{"duplicate id: last wins", `{"id":"x","id":"a","deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"null id before a string", `{"id":"a","id":null,"deadline":1700086400,"payload":{}}`, minimal(nil)},
		{"id with escapes", `{"id":"a\u0062\/c","deadline":1700086400,"payload":{}}`, minimal(func(r *Request) { r.ID = "ab/c" })},
		{"envelope", `{"request_kind":"redis","internal":{"retry_count":3,"queue_id":"q","request_token":"00112233aabbccdd",` +
			`"request_queue_name":"ireq","result_queue_name":"ires","labels":{"a":"b"}},` +
			`"data":{"id":"a","deadline":1700086400,"payload":{},"request_queue_name":"dreq","result_queue_name":"dres"}}`,
			minimal(func(r *Request) {
				r.Kind, r.RetryCount, r.Token, r.QueueID = "redis", 3, "00112233aabbccdd", "q"
				r.RequestQueueName, r.ResultQueueName = "ireq", "ires"
				r.Labels = map[string]string{"a": "b"}
			})},
		{"envelope queue names from data when internal has none", `{"request_kind":"pubsub","internal":{"retry_count":0,"result_queue_name":""},` +
			`"data":{"id":"a","deadline":1700086400,"payload":{},"request_queue_name":"dreq","result_queue_name":"dres"}}`,
			minimal(func(r *Request) { r.Kind, r.RequestQueueName, r.ResultQueueName = "pubsub", "dreq", "dres" })},
		{"envelope without internal", `{"request_kind":"plain","data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "plain" })},
		{"envelope without request_kind", `{"internal":{"retry_count":1},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.RetryCount = 1 })},
		{"envelope with the seed as data", `{"request_kind":"plain","internal":{"retry_count":0},"data":` + seedFlat + `}`,
			with(func(r *Request) { r.Kind = "plain" })},
		{"envelope ignores top-level flat fields, even of wrong types", `{"id":5,"deadline":"x","payload":[],"request_kind":"plain","data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "plain" })},
		{"envelope ignores unknown internal and data fields", `{"request_kind":"redis","internal":{"labels":7,"queue_id":[],"x":1},"data":{"id":"a","deadline":1700086400,"payload":{},"x":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope duplicate internal objects merge", `{"request_kind":"redis","internal":{"retry_count":2,"request_token":"t"},"internal":{"retry_count":5},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind, r.RetryCount, r.Token = "redis", 5, "t" })},
		{"envelope internal null drops earlier ones", `{"request_kind":"redis","internal":{"retry_count":2,"request_token":"t"},"internal":null,"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels", `{"request_kind":"redis","internal":{"labels":{"tier":"batch","classification":"overflow","k\u00e9":"v\n"}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) {
				r.Kind, r.Labels = "redis", map[string]string{"tier": "batch", "classification": "overflow", "ké": "v\n"}
			})},
		{"envelope labels numbers and bools become strings, null empty", `{"request_kind":"redis","internal":{"labels":{"i":42,"f":-1.50,"t":true,"n":null,"s":"x"}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) {
				r.Kind, r.Labels = "redis", map[string]string{"i": "42", "f": "-1.50", "t": "true", "n": "", "s": "x"}
			})},
		{"envelope labels empty object", `{"request_kind":"redis","internal":{"labels":{ }},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels null", `{"request_kind":"redis","internal":{"labels":null},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels not an object are ignored", `{"request_kind":"redis","internal":{"labels":[{"a":"b"}]},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels string ignored", `{"request_kind":"redis","internal":{"labels":"{\"a\":\"b\"}"},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels duplicate key: last wins", `{"request_kind":"redis","internal":{"labels":{"k":"1","k":"2"}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind, r.Labels = "redis", map[string]string{"k": "2"} })},
		{"envelope duplicate labels: the last object replaces", `{"request_kind":"redis","internal":{"labels":{"a":"1","b":"2"},"Labels":{"a":"3"}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind, r.Labels = "redis", map[string]string{"a": "3"} })},
		{"envelope duplicate labels: a later non-object is ignored", `{"request_kind":"redis","internal":{"labels":{"a":"1"},"LABELS":7},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind, r.Labels = "redis", map[string]string{"a": "1"} })},
		{"envelope duplicate labels: a later null clears", `{"request_kind":"redis","internal":{"labels":{"a":"1"},"labels":null},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels kept from an earlier internal", `{"request_kind":"redis","internal":{"labels":{"a":"1"}},"internal":{"retry_count":2},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind, r.RetryCount, r.Labels = "redis", 2, map[string]string{"a": "1"} })},
		{"envelope labels dropped with a null internal", `{"request_kind":"redis","internal":{"labels":{"a":"1"}},"internal":null,"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind = "redis" })},
		{"envelope labels name in other case", `{"request_kind":"redis","internal":{"Labels":{"a":"1"}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`,
			minimal(func(r *Request) { r.Kind, r.Labels = "redis", map[string]string{"a": "1"} })},
		{"flat form ignores internal labels", `{"id":"a","deadline":1700086400,"payload":{},"internal":{"labels":{"a":"1"}}}`, minimal(nil)},
		{"flat form ignores internal labels it would refuse", `{"id":"a","deadline":1700086400,"payload":{},"internal":{"labels":{"a":[]}}}`, minimal(nil)},
		{"envelope with a lenient metadata value", `{"request_kind":"redis","data":{"id":"a","deadline":1700086400,"payload":{},"metadata":{"n":1}}}`,
			minimal(func(r *Request) { r.Kind, r.Metadata = "redis", map[string]string{"n": "1"} })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Decode([]byte(tt.msg))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if d := diffRequest(got, tt.want); d != "" {
				t.Errorf("Decode: %s", d)
			}
			slow, _, derr := decodeSlow([]byte(tt.msg))
			if derr != nil {
				t.Fatalf("decodeSlow: %v", derr)
			}
			if !reflect.DeepEqual(slow, got) {
				t.Errorf("decodeSlow disagrees: %s", diffRequest(slow, got))
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	md := map[string]string{"job_id": "j"}
	tests := []struct {
		name     string
		msg      string
		id       string
		metadata map[string]string
		reason   string
	}{
		// No id can be read: dead letter.
		{"empty", "", "", nil, "empty message"},
		{"blank", " \n", "", nil, "empty message"},
		{"not JSON", `hello`, "", nil, "not valid JSON: invalid character 'h' looking for beginning of value (offset 1)"},
		{"truncated", `{"id":"a","deadline":1`, "", nil, "not valid JSON: unexpected end of JSON input (offset 22)"},
		{"trailing garbage", `{"id":"a","deadline":1,"payload":{}} x`, "", nil, "not valid JSON: invalid character 'x' after top-level value (offset 38)"},
		{"array", `[{"id":"a"}]`, "", nil, "must be a JSON object, got array"},
		{"null", `null`, "", nil, "must be a JSON object, got null"},
		{"string", `"x"`, "", nil, "must be a JSON object, got string"},
		{"no id", `{"deadline":1700086400,"payload":{}}`, "", nil, "id: missing or empty"},
		{"empty id", `{"id":"","deadline":1700086400,"payload":{}}`, "", nil, "id: missing or empty"},
		{"null id", `{"id":null,"deadline":1700086400,"payload":{}}`, "", nil, "id: missing or empty"},
		{"numeric id", `{"id":42,"deadline":1700086400,"payload":{}}`, "", nil, "id: must be a string, got number"},
		{"object id", `{"id":{},"deadline":1700086400,"payload":{}}`, "", nil, "id: must be a string, got object"},
		{"an id of the wrong type, even repeated", `{"id":1,"id":"a","deadline":1700086400,"payload":{}}`, "", nil, "id: must be a string, got number"},
		{"envelope data not an object", `{"request_kind":"plain","data":"x"}`, "", nil, "data: must be a JSON object, got string"},
		{"envelope data string, internal not an object", `{"id":"a","deadline":1700086400,"payload":{},"data":"junk","internal":7}`, "", nil, "data: must be a JSON object, got string"},
		{"envelope data array", `{"internal":{},"data":[1]}`, "", nil, "data: must be a JSON object, got array"},
		{"envelope without data id", `{"request_kind":"plain","id":"a","data":{"deadline":1700086400,"payload":{}}}`, "", nil, "data.id: missing or empty"},
		{"envelope numeric data id", `{"request_kind":"plain","data":{"id":1}}`, "", nil, "data.id: must be a string, got number"},

		// The id can be read: INVALID_REQUEST result.
		{"no deadline", `{"id":"a","payload":{},"metadata":{"job_id":"j"}}`, "a", md, "deadline: missing"},
		{"null deadline", `{"id":"a","deadline":null,"payload":{}}`, "a", nil, "deadline: missing"},
		{"zero deadline", `{"id":"a","deadline":0,"payload":{}}`, "a", nil, "deadline: must be after the Unix epoch (> 0)"},
		{"deadline below a nanosecond", `{"id":"a","deadline":1e-10,"payload":{}}`, "a", nil, "deadline: must be after the Unix epoch (> 0)"},
		{"negative deadline", `{"id":"a","deadline":-5,"payload":{},"metadata":{"job_id":"j"}}`, "a", md, "deadline: must be after the Unix epoch (> 0)"},
		{"deadline bool", `{"id":"a","deadline":true,"payload":{}}`, "a", nil, "deadline: must be a number of Unix seconds, got bool"},
		{"deadline object", `{"id":"a","deadline":{"s":1},"payload":{}}`, "a", nil, "deadline: must be a number of Unix seconds, got object"},
		{"deadline string not a number", `{"id":"a","deadline":"tomorrow","payload":{},"metadata":{"job_id":"j"}}`, "a", md, `deadline: "tomorrow" is not a number`},
		{"deadline empty string", `{"id":"a","deadline":"","payload":{}}`, "a", nil, `deadline: "" is not a number`},
		{"deadline string with spaces", `{"id":"a","deadline":" 1700086400","payload":{}}`, "a", nil, `deadline: " 1700086400" is not a number`},
		{"deadline string with a plus", `{"id":"a","deadline":"+1700086400","payload":{}}`, "a", nil, `deadline: "+1700086400" is not a number`},
		{"deadline string with leading zero", `{"id":"a","deadline":"01700086400","payload":{}}`, "a", nil, `deadline: "01700086400" is not a number`},
		{"deadline string RFC 3339", `{"id":"a","deadline":"2023-11-15T22:13:20Z","payload":{}}`, "a", nil, `deadline: "2023-11-15T22:13:20Z" is not a number`},
		{"deadline in milliseconds, past year 9999", `{"id":"a","deadline":1700086400000000,"payload":{}}`, "a", nil, "deadline: 1700086400000000 is out of range (after year 9999)"},
		{"deadline huge exponent", `{"id":"a","deadline":1e999999999999,"payload":{}}`, "a", nil, "deadline: 1e999999999999 is out of range (after year 9999)"},
		{"deadline first second after year 9999", `{"id":"a","deadline":253402300800,"payload":{}}`, "a", nil, "deadline: 253402300800 is out of range (after year 9999)"},
		{"negative created", `{"id":"a","created":-1,"deadline":1700086400,"payload":{}}`, "a", nil, "created: must not be before the Unix epoch"},
		{"created not a number", `{"id":"a","created":"yesterday","deadline":1700086400,"payload":{}}`, "a", nil, `created: "yesterday" is not a number`},
		{"no payload", `{"id":"a","deadline":1700086400,"metadata":{"job_id":"j"}}`, "a", md, "payload: missing"},
		{"payload array", `{"id":"a","deadline":1700086400,"payload":[1,2],"metadata":{"job_id":"j"}}`, "a", md, "payload: must be a JSON object, got array"},
		{"payload string", `{"id":"a","deadline":1700086400,"payload":"{}"}`, "a", nil, "payload: must be a JSON object, got string"},
		{"payload null", `{"id":"a","deadline":1700086400,"payload":null}`, "a", nil, "payload: must be a JSON object, got null"},
		{"metadata nested object", `{"id":"a","deadline":1700086400,"payload":{},"metadata":{"job_id":"j","k":{"x":1}}}`, "a", nil, `metadata["k"]: must be a string, number or bool, got object`},
		{"metadata array", `{"id":"a","deadline":1700086400,"payload":{},"metadata":["x"]}`, "a", nil, "metadata: must be a JSON object of strings, got array"},
		{"metadata string", `{"id":"a","deadline":1700086400,"payload":{},"metadata":"x"}`, "a", nil, "metadata: must be a JSON object of strings, got string"},
		{"header value number", `{"id":"a","deadline":1700086400,"payload":{},"metadata":{"job_id":"j"},"headers":{"x-n":1}}`, "a", md, `headers["x-n"]: must be a string, got number`},
		{"header value null", `{"id":"a","deadline":1700086400,"payload":{},"headers":{"x-n":null}}`, "a", nil, `headers["x-n"]: must be a string, got null`},
		{"header name invalid", `{"id":"a","deadline":1700086400,"payload":{},"headers":{"x y":"1"}}`, "a", nil, `headers["x y"]: invalid header name`},
		{"header name empty", `{"id":"a","deadline":1700086400,"payload":{},"headers":{"":"1"}}`, "a", nil, `headers[""]: empty header name`},
		{"header value CRLF", `{"id":"a","deadline":1700086400,"payload":{},"headers":{"x-a":"1\r\nHost: evil"}}`, "a", nil, `headers["x-a"]: header value holds a control character`},
		{"endpoint relative", `{"id":"a","deadline":1700086400,"payload":{},"endpoint":"v1/completions"}`, "a", nil, `endpoint: must be a path starting with a single "/", got "v1/completions"`},
		{"endpoint another host", `{"id":"a","deadline":1700086400,"payload":{},"endpoint":"//evil.example/v1"}`, "a", nil, `endpoint: must be a path starting with a single "/", got "//evil.example/v1"`},
		{"endpoint absolute URL", `{"id":"a","deadline":1700086400,"payload":{},"endpoint":"http://evil.example/v1"}`, "a", nil, `endpoint: must be a path starting with a single "/", got "http://evil.example/v1"`},
		{"endpoint with a space", `{"id":"a","deadline":1700086400,"payload":{},"endpoint":"/v1/a b"}`, "a", nil, `endpoint: must not hold spaces or control characters, got "/v1/a b"`},
		{"endpoint number", `{"id":"a","deadline":1700086400,"payload":{},"endpoint":1}`, "a", nil, "endpoint: must be a string, got number"},
		{"queue name number", `{"id":"a","deadline":1700086400,"payload":{},"result_queue_name":1}`, "a", nil, "result_queue_name: must be a string, got number"},
		{"envelope bad data deadline", `{"request_kind":"plain","data":{"id":"a","deadline":"x","payload":{},"metadata":{"job_id":"j"}}}`, "a", md, `data.deadline: "x" is not a number`},
		{"envelope data payload array", `{"request_kind":"plain","data":{"id":"a","deadline":1700086400,"payload":[]}}`, "a", nil, "data.payload: must be a JSON object, got array"},
		{"envelope request_kind number", `{"request_kind":1,"data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, "request_kind: must be a string, got number"},
		{"envelope internal string", `{"internal":"x","data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, "internal: must be a JSON object, got string"},
		{"envelope retry_count string", `{"request_kind":"redis","internal":{"retry_count":"1"},"data":{"id":"a","deadline":1700086400,"payload":{},"metadata":{"job_id":"j"}}}`, "a", md, "internal.retry_count: must be an integer, got string"},
		{"envelope retry_count fraction", `{"request_kind":"redis","internal":{"retry_count":1.5},"data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, "internal.retry_count: must be an integer, got number 1.5"},
		{"envelope retry_count negative", `{"request_kind":"redis","internal":{"retry_count":-1},"data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, "internal.retry_count: must not be negative"},
		{"envelope label nested object", `{"request_kind":"redis","internal":{"labels":{"a":"b","k":{"x":1}}},"data":{"id":"a","deadline":1700086400,"payload":{},"metadata":{"job_id":"j"}}}`, "a", md, `internal.labels["k"]: must be a string, number or bool, got object`},
		{"envelope label array", `{"request_kind":"redis","internal":{"labels":{"k":[]}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, `internal.labels["k"]: must be a string, number or bool, got array`},
		{"envelope label nested in a duplicate internal", `{"request_kind":"redis","internal":{"labels":{"k":[]}},"internal":{"labels":{}},"data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, `internal.labels["k"]: must be a string, number or bool, got array`},
		{"envelope request_token number", `{"request_kind":"redis","internal":{"request_token":12},"data":{"id":"a","deadline":1700086400,"payload":{}}}`, "a", nil, "internal.request_token: must be a string, got number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := Decode([]byte(tt.msg))
			if err == nil {
				t.Fatalf("Decode accepted it: %+v", req)
			}
			de, ok := AsDecodeError(err)
			if !ok {
				t.Fatalf("error %T %v is not a *DecodeError", err, err)
			}
			if de.ID != tt.id || de.Reason != tt.reason {
				t.Errorf("got ID %q reason %q\nwant ID %q reason %q", de.ID, de.Reason, tt.id, tt.reason)
			}
			if !reflect.DeepEqual(de.Metadata, tt.metadata) && (len(de.Metadata) != 0 || len(tt.metadata) != 0) {
				t.Errorf("Metadata = %v, want %v", de.Metadata, tt.metadata)
			}
		})
	}
}

func TestDecodeErrorMessage(t *testing.T) {
	_, err := Decode([]byte(`{"id":"req-1","payload":{}}`))
	if got, want := err.Error(), "invalid request req-1: deadline: missing"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	_, err = Decode([]byte(`{}`))
	if got, want := err.Error(), "invalid request: id: missing or empty"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// payloadCases are payloads whose bytes must survive decoding unchanged.
var payloadCases = []string{
	`{}`,
	`{ }`,
	"{\n\t\"model\" : \"m\" ,\r\n  \"messages\":[ ] }",
	`{"prompt":"caf\u00e9 \ud83d\ude00 \"quoted\" \\ \/ \b\f\n\r\t"}`,
	`{"prompt":"café 😀 — 中文"}`,
	`{"n":1.0e+2,"m":-0.000,"big":123456789012345678901234567890,"t":true,"f":false,"z":null}`,
	`{"nested":{"a":[{"b":{"c":[[],[{}]]}}]},"dup":1,"dup":2}`,
	`{"html":"<script>&amp;</script>","u2028":"` + "\u2028" + `"}`,
	`{"` + strings.Repeat("k", 300) + `":"` + strings.Repeat("v", 5000) + `"}`,
}

func TestDecodePayloadVerbatim(t *testing.T) {
	for _, p := range payloadCases {
		flat := `{"id":"a","deadline":1700086400,"payload":` + p + `}`
		env := `{"request_kind":"plain","internal":{"retry_count":1},"data":{"payload": ` + p + ` ,"id":"a","deadline":1700086400}}`
		for _, msg := range []string{flat, env} {
			req, err := Decode([]byte(msg))
			if err != nil {
				t.Fatalf("Decode(%s): %v", msg, err)
			}
			if !bytes.Equal(req.Payload, []byte(p)) {
				t.Errorf("payload changed:\n got %s\nwant %s", req.Payload, p)
			}
		}
	}
}

func TestDecodeDoesNotRetainInput(t *testing.T) {
	msg := []byte(seedFlat)
	req, err := Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range msg {
		msg[i] = ' '
	}
	if d := diffRequest(req, &seedRequest); d != "" {
		t.Errorf("request changed with its input: %s", d)
	}
}

func TestParseUnixSeconds(t *testing.T) {
	tests := []struct {
		in        string
		sec, nsec int64
		neg       bool
		err       error
	}{
		{"0", 0, 0, false, nil},
		{"-0", 0, 0, false, nil},
		{"0.0e5", 0, 0, false, nil},
		{"1", 1, 0, false, nil},
		{"-1.5", 1, 500_000_000, true, nil},
		{"1700000000.001", 1700000000, 1_000_000, false, nil},
		{"1700000000.999999999999", 1700000000, 999_999_999, false, nil},
		{"0.000000001", 0, 1, false, nil},
		{"0.0000000009", 0, 0, false, nil},
		{"1.7e9", 1700000000, 0, false, nil},
		{"1.7E+09", 1700000000, 0, false, nil},
		{"17e-1", 1, 700_000_000, false, nil},
		{"1e-999999999", 0, 0, false, nil},
		{"253402300799.999", 253402300799, 999_000_000, false, nil},
		{"253402300800", 0, 0, false, errOutOfRange},
		{"1e12", 0, 0, false, errOutOfRange},
		{"-1e12", 0, 0, false, errOutOfRange},
		{"", 0, 0, false, errNotNumber},
		{"-", 0, 0, false, errNotNumber},
		{"01", 0, 0, false, errNotNumber},
		{"1.", 0, 0, false, errNotNumber},
		{".5", 0, 0, false, errNotNumber},
		{"1e", 0, 0, false, errNotNumber},
		{"1e+", 0, 0, false, errNotNumber},
		{"+1", 0, 0, false, errNotNumber},
		{"1 ", 0, 0, false, errNotNumber},
		{"0x10", 0, 0, false, errNotNumber},
		{"NaN", 0, 0, false, errNotNumber},
		{"Infinity", 0, 0, false, errNotNumber},
	}
	for _, tt := range tests {
		got, err := parseUnixSeconds([]byte(tt.in))
		if err != tt.err {
			t.Errorf("parseUnixSeconds(%q) error = %v, want %v", tt.in, err, tt.err)
			continue
		}
		if err == nil && (got.sec != tt.sec || got.nsec != tt.nsec || got.neg != tt.neg || !got.set) {
			t.Errorf("parseUnixSeconds(%q) = %+v, want sec %d nsec %d neg %v", tt.in, got, tt.sec, tt.nsec, tt.neg)
		}
	}
}

// model is read from the flat form's top level and the envelope's data, by
// the fast scanner and the encoding/json path alike; a value that is not a
// string is ignored.
func TestDecodeModel(t *testing.T) {
	tests := []struct{ name, msg, want string }{
		{"flat", `{"id":"a","deadline":4102444800,"payload":{},"model":"m1"}`, "m1"},
		{"envelope", `{"request_kind":"redis","data":{"id":"a","deadline":4102444800,"payload":{},"model":"m2"},"internal":{}}`, "m2"},
		{"absent", `{"id":"a","deadline":4102444800,"payload":{"model":"p"}}`, ""},
		{"not a string", `{"id":"a","deadline":4102444800,"payload":{},"model":7}`, ""},
		{"null", `{"id":"a","deadline":4102444800,"payload":{},"model":null}`, ""},
		{"escaped, slow path", `{"id":"a","deadline":4102444800,"payload":{},"mod\u0065l":"m3"}`, "m3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Decode([]byte(tc.msg))
			if err != nil {
				t.Fatal(err)
			}
			if r.Model != tc.want {
				t.Errorf("model %q, want %q", r.Model, tc.want)
			}
			if tc.want == "" {
				return
			}
			b, err := EncodeRequest(&Request{ID: "a", Deadline: r.Deadline, Payload: r.Payload, Model: r.Model})
			if err != nil {
				t.Fatal(err)
			}
			if back, err := Decode(b); err != nil || back.Model != tc.want {
				t.Errorf("round trip %s: model %v %v", b, back, err)
			}
		})
	}
}
