package redissortedset

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestQueueScore(t *testing.T) {
	for _, tc := range []struct{ name, member, want string }{
		{"envelope with sequence", `{"internal":{"enqueue_seq":3},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":{}}}`, "1700000000.0000014"},
		{"sequence capped", `{"internal":{"enqueue_seq":99999999},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":{}}}`, "1700000000.9999995"},
		{"no sequence", `{"internal":{"request_token":"t"},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":{}}}`, "1700000000"},
		{"payload kept apart", `{"internal":{"enqueue_seq":1,"payload_ref":"k"},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":null}}`, "1700000000.0000005"},
		{"flat, ms deadline", `{"id":"a","deadline":1700000000.25,"payload":{}}`, "1700000000.25"},
		{"not a request", `{"id":"a"}`, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := QueueScore([]byte(tc.member)); got != tc.want {
				t.Errorf("QueueScore = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestWithRequestToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"id":"a","payload":"x"}`, `{"id":"a","payload":"x","request_token":"t\"1"}`},
		{`{}`, `{"request_token":"t\"1"}`},
		{`{"id":"a","request_token":"old"}`, `{"id":"a","request_token":"old"}`},
	} {
		if got := string(withRequestToken([]byte(tc.in), `t"1`)); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestScanEnvelopeAgreesWithJSON: the scan reads what json.Unmarshal reads,
// or leaves the message to it.
func TestScanEnvelopeAgreesWithJSON(t *testing.T) {
	for _, in := range []string{
		benchEnvelope,
		`{"internal":{"request_token":"t","enqueue_seq":3,"result_routing_resolved":true,"result_ttl_seconds":60},"request_kind":"plain","data":{"id":"a","deadline":"1700000000","payload":{}}}`,
		`{"internal":null,"request_kind":"plain","data":{"id":"a"}}`,
		`{"internal":{"queue_id":null,"payload_ref":"k","kept_result":{"x":1}},"data":null}`,
		`{"Internal":{"request_token":"t"},"data":{"id":"a"}}`,
		`{"internal":{"Request_Token":"t"},"data":{"ID":"a"}}`,
		`{"internal":{"request_token":"t"},"internal":{"enqueue_seq":1},"data":{"id":"a"}}`,
		`{"internal":{"request_token":"t","request_token":"u"},"data":{"id":"a","id":"b"}}`,
		`{"internal":5,"data":{"id":"a"}}`,
		`{"internal":{"request_token":"t"},"data":[1]}`,
		`{"internal":{"request\u005ftoken":"t"},"data":{"id":"a"}}`,
		`{"internal":{"request_token":"t"},"data":{"id":"a"}`,
		`[{"internal":{}}]`,
	} {
		var want envelopeInfo
		wantErr := json.Unmarshal([]byte(in), &want) != nil
		var got envelopeInfo
		if !scanEnvelope([]byte(in), &got) {
			continue // left to json.Unmarshal
		}
		if wantErr {
			t.Errorf("%s: scanned, but json.Unmarshal fails", in)
			continue
		}
		if !reflect.DeepEqual(normal(got), normal(want)) {
			t.Errorf("%s:\nscan %+v\njson %+v", in, normal(got), normal(want))
		}
	}
}

// normal is e as comparable strings (nil and empty raw values alike).
func normal(e envelopeInfo) []string {
	out := []string{string(e.RequestKind)}
	if e.Internal != nil {
		in := e.Internal
		out = append(out, "internal", string(in.QueueID), string(in.RequestQueueName), string(in.ResultQueueName), string(in.ResultTTLSeconds),
			string(in.ResultRoutingResolved), string(in.EnqueueSeq), string(in.PayloadRef), string(in.KeptResult), string(in.RequestToken))
	}
	if e.Data != nil {
		out = append(out, "data", string(e.Data.ID), string(e.Data.Deadline))
	}
	return out
}

// TestEnvelopeKeys: the id and token read from the scanned envelope are
// upstreamKeysOf's.
func TestEnvelopeKeys(t *testing.T) {
	for _, in := range []string{
		benchEnvelope,
		`{"internal":{"request_token":"t\u0041"},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":{}}}`,
		`{"internal":{"request_token":""},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":{}}}`,
		`{"internal":{"enqueue_seq":1},"request_kind":"plain","data":{"id":"a","deadline":1700000000,"payload":{}}}`,
	} {
		e, ok := parseEnvelope([]byte(in))
		if !ok {
			t.Fatalf("%s: not an envelope", in)
		}
		id, tok := e.keys([]byte(in))
		wid, wtok := upstreamKeysOf([]byte(in))
		if id != wid || tok != wtok {
			t.Errorf("%s: keys %q %q, upstreamKeysOf %q %q", in, id, tok, wid, wtok)
		}
	}
}
