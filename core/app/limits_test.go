package app

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/wire"
)

// Each limit a request exceeds is answered INVALID_REQUEST naming the limit,
// without a gateway call; a response over dispatch.max_response_bytes is an
// INFERENCE_ERROR naming that limit (the body is never read past it).
func TestLimitsAnswer(t *testing.T) {
	gw, url := newGateway(t)
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"text":"` + strings.Repeat("x", 4096) + `"}`))
	}))
	t.Cleanup(big.Close)
	h := startApp(t, url, time.Second, func(c *config.Config) {
		c.Limits = wire.Limits{MaxPayloadBytes: 200, MaxHeaders: 2, MaxHeaderBytes: 64, MaxMetadataKeys: 4, MaxMetadataBytes: 100}
	})
	far := time.Now().Add(time.Minute)
	msg := func(id string, payload any, headers, metadata map[string]string) []byte {
		pb, _ := json.Marshal(payload)
		b, _ := json.Marshal(map[string]any{"id": id, "deadline": far.Unix(), "payload": json.RawMessage(pb), "headers": headers, "metadata": metadata})
		return b
	}
	cases := []struct {
		id   string
		msg  []byte
		want string // in the error message; "" for a success
	}{
		{"ok", msg("ok", map[string]any{"id": "ok"}, map[string]string{"X-A": "1"}, map[string]string{"job_id": "j"}), ""},
		{"payload", msg("payload", map[string]any{"id": "payload", "p": strings.Repeat("x", 300)}, nil, nil), "limits.max_payload_bytes (200)"},
		{"headers", msg("headers", map[string]any{"id": "headers"}, map[string]string{"X-A": "1", "X-B": "2", "X-C": "3"}, nil), "limits.max_headers (2)"},
		{"header-bytes", msg("header-bytes", map[string]any{"id": "header-bytes"}, map[string]string{"X-A": strings.Repeat("v", 80)}, nil), "limits.max_header_bytes (64)"},
		{"metadata-keys", msg("metadata-keys", map[string]any{"id": "metadata-keys"}, nil, map[string]string{"a": "", "b": "", "c": "", "d": "", "e": ""}), "limits.max_metadata_keys (4)"},
		{"metadata-bytes", msg("metadata-bytes", map[string]any{"id": "metadata-bytes"}, nil, map[string]string{"blob": strings.Repeat("v", 120)}), "limits.max_metadata_bytes (100)"},
	}
	for _, c := range cases {
		if err := h.mem.Enqueue(e2eQueue, c.msg); err != nil {
			t.Fatal(err)
		}
	}
	got := h.waitResults(len(cases), 10*time.Second)
	for _, c := range cases {
		r := got[c.id]
		switch {
		case r == nil:
			t.Errorf("%s: no result", c.id)
		case c.want == "" && !r.OK():
			t.Errorf("%s: %+v, want success", c.id, r)
		case c.want != "" && (r.ErrorCode != wire.CodeInvalidRequest || !strings.Contains(r.ErrorMessage, c.want)):
			t.Errorf("%s: %s %q, want INVALID_REQUEST naming %q", c.id, r.ErrorCode, r.ErrorMessage, c.want)
		}
		if c.want != "" && len(gw.attempts(c.id)) != 0 {
			t.Errorf("%s: over a limit yet sent to the gateway", c.id)
		}
	}

	h2 := startApp(t, big.URL, time.Second, func(c *config.Config) { c.Dispatch.MaxResponseBytes = 1024 })
	if err := h2.mem.Enqueue(e2eQueue, msg("big", map[string]any{"id": "big"}, nil, nil)); err != nil {
		t.Fatal(err)
	}
	r := h2.waitResults(1, 10*time.Second)["big"]
	if r == nil || r.ErrorCode != wire.CodeInferenceError || !strings.Contains(r.ErrorMessage, "dispatch.max_response_bytes") || len(r.Payload) > 1024 {
		t.Errorf("response over the limit: %+v, want an INFERENCE_ERROR naming dispatch.max_response_bytes", r)
	}
}
