package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestLimits(t *testing.T) {
	big := func(n int) string { return strings.Repeat("x", n) }
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["k"+big(i)] = "v"
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		limits Limits
		req    Request
		want   string // "" when within the limits; else a part of the error
	}{
		{"defaults, small request", Limits{}, Request{Payload: []byte(`{}`), Headers: map[string]string{"Authorization": "x"}, Metadata: map[string]string{"job_id": "j"}}, ""},
		{"payload at the limit", Limits{MaxPayloadBytes: 4}, Request{Payload: []byte(`{"":1`)[:4]}, ""},
		{"payload over", Limits{MaxPayloadBytes: 4}, Request{Payload: []byte(`{"a":1}`)}, "payload size in bytes is 7, above limits.max_payload_bytes (4)"},
		{"payload over the default", Limits{}, Request{Payload: []byte(big(DefaultMaxPayloadBytes + 1))}, "limits.max_payload_bytes (16777216)"},
		{"payload limit off", Limits{MaxPayloadBytes: -1}, Request{Payload: []byte(big(DefaultMaxPayloadBytes + 1))}, ""},
		{"header count over", Limits{MaxHeaders: 2}, Request{Headers: many(3)}, "header count is 3, above limits.max_headers (2)"},
		{"header count over the default", Limits{}, Request{Headers: many(65)}, "limits.max_headers (64)"},
		{"header bytes over", Limits{MaxHeaderBytes: 10}, Request{Headers: map[string]string{"X-Long": big(5)}}, "header size in bytes (names and values) is 11, above limits.max_header_bytes (10)"},
		{"header bytes at the limit", Limits{MaxHeaderBytes: 11}, Request{Headers: map[string]string{"X-Long": big(5)}}, ""},
		{"metadata keys over", Limits{MaxMetadataKeys: 1}, Request{Metadata: many(2)}, "metadata key count is 2, above limits.max_metadata_keys (1)"},
		{"metadata bytes over", Limits{MaxMetadataBytes: 3}, Request{Metadata: map[string]string{"ab": "cd"}}, "metadata size in bytes (keys and values) is 4, above limits.max_metadata_bytes (3)"},
		{"metadata bytes over the default", Limits{}, Request{Metadata: map[string]string{"blob": big(64 << 10)}}, "limits.max_metadata_bytes (65536)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.limits
			l.SetDefaults()
			err := l.Check(&tc.req)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrLimit)):
				t.Fatalf("Check: %v, want an ErrLimit containing %q", err, tc.want)
			}
		})
	}
}

func TestWithKeptResult(t *testing.T) {
	res := []byte(`{"id":"r1", "payload":"{\"ok\":1}"}`)
	for _, tc := range []struct {
		name string
		raw  string
	}{
		{"flat", `{"id":"r1","deadline":1700000000,"payload":{"a":1}}`},
		{"envelope", `{"request_kind":"plain","internal":{"retry_count":2,"labels":{"tier":"batch"}},"data":{"id":"r1","deadline":1700000000,"payload":{"a":1}}}`},
		{"envelope with a kept result already", `{"request_kind":"plain","internal":{"kept_result":{"id":"old"}},"data":{"id":"r1","deadline":1700000000,"payload":{"a":1}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, err := Decode([]byte(tc.raw))
			if err != nil {
				t.Fatal(err)
			}
			out, err := WithKeptResult([]byte(tc.raw), res)
			if err != nil {
				t.Fatal(err)
			}
			after, err := Decode(out)
			if err != nil {
				t.Fatalf("decode %s: %v", out, err)
			}
			if got, want := string(after.KeptResult), `{"id":"r1","payload":"{\"ok\":1}"}`; got != want {
				t.Errorf("kept result %s, want %s", got, want)
			}
			if after.ID != before.ID || after.RetryCount != before.RetryCount || after.Label("tier") != before.Label("tier") || string(after.Payload) != string(before.Payload) {
				t.Errorf("request changed: %+v, was %+v", after, before)
			}
		})
	}
	if _, err := WithKeptResult([]byte(`{"id":"r1","deadline":1,"payload":{}}`), []byte(`[1]`)); err == nil {
		t.Error("a result that is not an object was kept")
	}
}
