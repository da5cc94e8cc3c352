package wire

import (
	"strings"
	"testing"
)

func TestRequestToken(t *testing.T) {
	env := func(internal, data string) string {
		return `{"request_kind":"redis","internal":` + internal + `,"data":` + data + `}`
	}
	data := `{"id":"r1","deadline":1700000000,"payload":{}}`
	for _, tc := range []struct {
		name, msg, id, token string
	}{
		{"envelope", env(`{"request_token":"abc","retry_count":2}`, data), "r1", "abc"},
		{"spaces", " \n" + env(`{ "request_token" : "abc" }`, data) + "\t", "r1", "abc"},
		{"no token", env(`{}`, data), "", ""},
		{"empty token", env(`{"request_token":""}`, data), "", ""},
		{"null token", env(`{"request_token":null}`, data), "", ""},
		{"no kind still an envelope", `{"internal":{"request_token":"abc"},"data":` + data + `}`, "r1", "abc"},
		{"flat with internal is not an envelope", `{"id":"r2","deadline":1,"payload":{},"internal":{"request_token":"abc"}}`, "", ""},
		{"name in a payload", `{"id":"r2","deadline":1700000000,"payload":{"prompt":"\"request_token\""}}`, "", ""},
		{"escaped token", env(`{"request_token":"a\u0062c"}`, data), "r1", "abc"},
		// Unusual shapes go through Decode and agree with it.
		// Only the exact member name is looked for (as before: a byte search).
		{"case-folded name", env(`{"Request_Token":"abc"}`, data), "", ""},
		{"case-folded beside exact", env(`{"request_token":"x","REQUEST_TOKEN":"abc"}`, data), "r1", "abc"},
		{"repeated member", env(`{"request_token":"x","request_token":"abc"}`, data), "r1", "abc"},
		{"token of another type", env(`{"request_token":7}`, data), "", ""},
		{"missing id", env(`{"request_token":"abc"}`, `{"deadline":1,"payload":{}}`), "", ""},
		{"trailing bytes", env(`{"request_token":"abc"}`, data) + "x", "", ""},
		{"not json", `"request_token"`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, tok := RequestToken([]byte(tc.msg))
			if id != tc.id || tok != tc.token {
				t.Errorf("RequestToken(%s) = %q %q, want %q %q", tc.msg, id, tok, tc.id, tc.token)
			}
		})
	}
}

// FuzzRequestToken checks that RequestToken answers as Decode does for
// every message Decode accepts.
func FuzzRequestToken(f *testing.F) {
	for _, s := range []string{
		`{"request_kind":"redis","internal":{"retry_count":3,"queue_id":"q","request_token":"00112233aabbccdd","request_queue_name":"rq"},"data":` + seedFlat + `}`,
		`{"internal":{"request_token":"t","Request_Token":"u"},"data":{"id":"a","deadline":1,"payload":{}}}`,
		`{"internal":{"request_token":"t"},"request_kind":null,"data":{"ID":"a","id":"b","deadline":1,"payload":{}}}`,
		`{"internal":{"request_token":"t"},"Data":{"id":"a","deadline":1,"payload":{}},"data":null}`,
		`{"id":"a","deadline":1,"payload":{"request_token":"x"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, tok := RequestToken(b)
		r, err := Decode(b)
		if err != nil {
			return
		}
		wantID, wantTok := r.ID, r.Token
		if wantTok == "" || !strings.Contains(string(b), `"request_token"`) {
			wantID, wantTok = "", ""
		}
		if id != wantID || tok != wantTok {
			t.Fatalf("RequestToken(%q) = %q %q; Decode gives %q %q", b, id, tok, r.ID, r.Token)
		}
	})
}

func BenchmarkRequestToken(b *testing.B) {
	msg := []byte(`{"request_kind":"redis","internal":{"retry_count":0,"queue_id":"pool-a","request_token":"00112233aabbccdd00112233aabbccdd","request_queue_name":"llm-d-async:requests:pool-a","result_queue_name":"llm-d-async:results:pool-a:$batch"},"data":` + seedFlat + `}`)
	b.Run("RequestToken", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			RequestToken(msg)
		}
	})
	b.Run("Decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = Decode(msg)
		}
	})
}
