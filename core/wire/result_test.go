package wire

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestResultMarshal(t *testing.T) {
	tests := []struct {
		name string
		r    Result
		want string
	}{
		{"success", Result{ID: "batch_req_xyz", StatusCode: 200, Payload: `{"id":"chatcmpl-1","choices":[]}`,
			Metadata: map[string]string{"request_index": "42", "job_id": "batch_abc123"}},
			`{"id":"batch_req_xyz","status_code":200,"payload":"{\"id\":\"chatcmpl-1\",\"choices\":[]}","metadata":{"job_id":"batch_abc123","request_index":"42"}}`},
		{"no response", Result{ID: "a", Payload: `{"error":"deadline exceeded"}`, ErrorCode: CodeDeadlineExceeded, ErrorMessage: "deadline exceeded"},
			`{"id":"a","payload":"{\"error\":\"deadline exceeded\"}","error_code":"DEADLINE_EXCEEDED","error_message":"deadline exceeded"}`},
		{"http error", Result{ID: "a", StatusCode: 400, Payload: "bad", ErrorCode: CodeInferenceError},
			`{"id":"a","status_code":400,"payload":"bad","error_code":"INFERENCE_ERROR"}`},
		{"empty payload still written", Result{ID: "a", Metadata: map[string]string{}},
			`{"id":"a","payload":""}`},
		{"escapes", Result{ID: "<&>", Payload: "\x00\x1f\t\n\r\b\f\"\\\u2028\u2029é😀\xff", Metadata: map[string]string{"k\n": "<v>"}},
			`{"id":"\u003c\u0026\u003e","payload":"\u0000\u001f\t\n\r\b\f\"\\\u2028\u2029é😀\ufffd","metadata":{"k\n":"\u003cv\u003e"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.r.Marshal()
			if string(got) != tt.want {
				t.Errorf("Marshal:\n got %s\nwant %s", got, tt.want)
			}
			std, err := json.Marshal(tt.r)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(std) {
				t.Errorf("Marshal differs from json.Marshal:\n got %s\n std %s", got, std)
			}
			if got := string(tt.r.AppendJSON([]byte("x"))); got != "x"+tt.want {
				t.Errorf("AppendJSON = %s", got)
			}
		})
	}
}

func TestResultMarshalManyKeys(t *testing.T) {
	r := Result{ID: "a", Metadata: map[string]string{}}
	for i := 0; i < 40; i++ {
		r.Metadata[strings.Repeat("k", i)] = strings.Repeat("v", 40-i)
	}
	std, _ := json.Marshal(r)
	if got := r.Marshal(); string(got) != string(std) {
		t.Errorf("Marshal:\n got %s\nwant %s", got, std)
	}
}

func TestDecodeResult(t *testing.T) {
	in := Result{ID: "a", StatusCode: 503, Payload: `{"error":"x"}`, Metadata: map[string]string{"job_id": "j"},
		ErrorCode: CodeInferenceError, ErrorMessage: "gateway: 503"}
	got, err := DecodeResult(in.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*got, in) {
		t.Errorf("DecodeResult = %+v, want %+v", *got, in)
	}
	got, err = DecodeResult([]byte(`{"id":"a","payload":"p","error_code":"","error_message":"","extra":1}`))
	if err != nil || !got.OK() || got.Payload != "p" {
		t.Errorf("upstream-style result: %+v, %v", got, err)
	}

	for _, tt := range []struct{ in, want string }{
		{`{"payload":"p"}`, "decode result: id: missing or empty"},
		{`null`, "decode result: id: missing or empty"},
		{`{"id":"a","payload":{}}`, "decode result: json: cannot unmarshal object into Go struct field Result.payload of type string"},
		{`{"id":"a","status_code":"200"}`, "decode result: json: cannot unmarshal string into Go struct field Result.status_code of type int"},
		{`{"id":`, "decode result: unexpected end of JSON input"},
	} {
		if _, err := DecodeResult([]byte(tt.in)); err == nil || err.Error() != tt.want {
			t.Errorf("DecodeResult(%s) error = %v, want %s", tt.in, err, tt.want)
		}
	}
}

func TestErrorPayload(t *testing.T) {
	for _, msg := range []string{"", "deadline exceeded", `dial tcp: "x" <refused> & co`, "line\nbreak\x01\xfe"} {
		got := ErrorPayload(msg)
		want, _ := json.Marshal(map[string]string{"error": msg})
		if got != string(want) {
			t.Errorf("ErrorPayload(%q) = %s, want %s", msg, got, want)
		}
	}
	if got, want := ErrorPayload(`gate "x" closed`), `{"error":"gate \"x\" closed"}`; got != want {
		t.Errorf("ErrorPayload = %s, want %s", got, want)
	}
}

func TestErrorResult(t *testing.T) {
	req := minimal(func(r *Request) { r.ID, r.Metadata = "req-1", map[string]string{"job_id": "j"} })
	got := ErrorResult(req, CodeCancelled, "cancelled by producer")
	want := `{"id":"req-1","payload":"{\"error\":\"cancelled by producer\"}","metadata":{"job_id":"j"},"error_code":"CANCELLED","error_message":"cancelled by producer"}`
	if string(got.Marshal()) != want {
		t.Errorf("ErrorResult:\n got %s\nwant %s", got.Marshal(), want)
	}
	if got.OK() {
		t.Error("ErrorResult is OK")
	}
}

func TestDecodeErrorResult(t *testing.T) {
	_, err := Decode([]byte(`{"id":"req-1","deadline":1700086400,"payload":[],"metadata":{"job_id":"j"}}`))
	de, ok := AsDecodeError(err)
	if !ok {
		t.Fatalf("err = %v", err)
	}
	got := string(de.Result().Marshal())
	want := `{"id":"req-1","payload":"{\"error\":\"payload: must be a JSON object, got array\"}","metadata":{"job_id":"j"},` +
		`"error_code":"INVALID_REQUEST","error_message":"payload: must be a JSON object, got array"}`
	if got != want {
		t.Errorf("DecodeError.Result:\n got %s\nwant %s", got, want)
	}
}
