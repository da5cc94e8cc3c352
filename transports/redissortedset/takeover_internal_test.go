package redissortedset

import (
	"testing"

	"github.com/sluice-io/sluice/transports/internal/upstream"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// The settle script builds upstream's key names from keys' prefixes; the
// cancellation check reads them through package upstream. They must agree.
func TestUpstreamKeyNames(t *testing.T) {
	if got, want := keys.ActivePrefix+"r1", upstream.ActiveKey("r1"); got != want {
		t.Errorf("active key %q, upstream %q", got, want)
	}
	if got, want := keys.CancelPrefix+"r1", upstream.CancelKey("r1"); got != want {
		t.Errorf("cancel key %q, upstream %q", got, want)
	}
}

func TestQueueOf(t *testing.T) {
	r := newQueueRoutes()
	r.add("pool-a", "llm-d-async:requests:pool-a")
	r.add("", "plain-queue")
	for _, tc := range []struct {
		msg, want string
	}{
		{`{"internal":{"queue_id":"pool-a","request_queue_name":"llm-d-async:requests:pool-a"},"request_kind":"redis","data":{}}`, "llm-d-async:requests:pool-a"},
		{`{"internal":{"request_queue_name":"plain-queue"},"request_kind":"plain","data":{}}`, "plain-queue"},
		// No request_queue_name: by queue id.
		{`{"internal":{"queue_id":"pool-a"},"request_kind":"redis","data":{}}`, "llm-d-async:requests:pool-a"},
		// A queue named elsewhere wins over a matching id: upstream routes by name.
		{`{"internal":{"queue_id":"pool-a","request_queue_name":"someone-else"},"request_kind":"redis","data":{}}`, ""},
		{`{"internal":{"queue_id":"other"},"request_kind":"redis","data":{}}`, ""},
		{`{"internal":{"queue_id":7,"request_queue_name":null},"request_kind":"redis","data":{}}`, ""},
		{`{"id":"flat","deadline":1,"payload":{}}`, ""},
		{`not json`, ""},
	} {
		got, ok := r.queueOf([]byte(tc.msg))
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("%s: %q %v, want %q", tc.msg, got, ok, tc.want)
		}
	}
}

func TestUpstreamKeysOf(t *testing.T) {
	for _, tc := range []struct {
		msg, id, token string
	}{
		{`{"internal":{"request_token":"abc"},"request_kind":"redis","data":{"id":"r1","deadline":1700000000,"payload":{}}}`, "r1", "abc"},
		{`{"internal":{},"request_kind":"redis","data":{"id":"r1","deadline":1700000000,"payload":{}}}`, "", ""},
		// The member name inside a payload is not a token.
		{`{"id":"r2","deadline":1700000000,"payload":{"prompt":"\"request_token\""}}`, "", ""},
		{`{"id":"r3","deadline":1700000000,"payload":{}}`, "", ""},
	} {
		id, tok := upstreamKeysOf([]byte(tc.msg))
		if id != tc.id || tok != tc.token {
			t.Errorf("%s: %q %q, want %q %q", tc.msg, id, tok, tc.id, tc.token)
		}
	}
}
