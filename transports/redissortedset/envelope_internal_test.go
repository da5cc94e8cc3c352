package redissortedset

import "testing"

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
