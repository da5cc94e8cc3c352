package wire

import (
	"reflect"
	"testing"
)

// TestScanMessage pins which messages take the scanner and that what it
// takes decodes as the encoding/json pass decodes it.
func TestScanMessage(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		take bool
	}{
		{"flat", benchFlat, true},
		{"envelope", benchEnvelope, true},
		{"flat with unknown members", `{"id":"a","deadline":1,"payload":{},"extra":[1,{"x":"y"}],"data":null}`, true},
		{"envelope with internal only", `{"internal":{"retry_count":2,"queue_id":"q","labels":{"a":"b"}},"data":{"id":"a","deadline":"1.5","payload":{}}}`, true},
		{"data without request_kind or internal is ignored", `{"id":"a","deadline":1,"payload":{},"data":{"id":"b"}}`, true},
		{"escaped id", `{"id":"caf\u00e9","deadline":1,"payload":{}}`, true},
		{"name in other case", `{"ID":"a","deadline":1,"payload":{}}`, false},
		{"escaped name", `{"i\u0064":"a","deadline":1,"payload":{}}`, false},
		{"repeated member", `{"id":"a","id":"b","deadline":1,"payload":{}}`, false},
		{"id of the wrong type", `{"id":1,"deadline":1,"payload":{}}`, false},
		{"envelope without labels", benchEnvelopeNoLabels, true},
		{"labels with lenient and ignored values", `{"internal":{"labels":{"n":1,"b":false,"z":null}},"data":{"id":"a","deadline":1,"payload":{}}}`, true},
		{"labels not an object", `{"internal":{"labels":[1]},"data":{"id":"a","deadline":1,"payload":{}}}`, true},
		{"labels null", `{"internal":{"labels":null},"data":{"id":"a","deadline":1,"payload":{}}}`, true},
		{"labels in other case", `{"internal":{"LABELS":{"a":"b"}},"data":{"id":"a","deadline":1,"payload":{}}}`, false},
		{"repeated labels", `{"internal":{"labels":{"a":"b"},"labels":{}},"data":{"id":"a","deadline":1,"payload":{}}}`, false},
		{"label nested", `{"internal":{"labels":{"a":{}}},"data":{"id":"a","deadline":1,"payload":{}}}`, false},
		{"retry_count not an integer", `{"internal":{"retry_count":1.5},"data":{"id":"a","deadline":1,"payload":{}}}`, false},
		{"refused by build", `{"id":"a","deadline":0,"payload":{}}`, false},
		{"not JSON", `{"id":"a",`, false},
		{"not an object", `["id"]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, env, ok := scanMessage([]byte(tc.in))
			if ok != tc.take {
				t.Fatalf("scanMessage took it: %v, want %v", ok, tc.take)
			}
			if !ok {
				return
			}
			jreq, jenv, jok := decodeJSON([]byte(tc.in))
			if !jok || !reflect.DeepEqual(req, jreq) || env != jenv {
				t.Fatalf("scanMessage: %+v (envelope %v); encoding/json: %+v (envelope %v, ok %v)", req, env, jreq, jenv, jok)
			}
		})
	}
}
