package dispatch

import (
	"encoding/json"
	"math"
	"testing"
)

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		in, out int64
		ok      bool
	}{
		{"chat completion", `{"id":"x","choices":[{"message":{"content":"hi \"usage\": {}"}}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`, 12, 34, true},
		{"usage first, spaces", ` { "usage" : { "prompt_tokens" : 3 } , "model":"m"}`, 3, 0, true},
		{"negative clamped", `{"usage":{"prompt_tokens":-5,"completion_tokens":7}}`, 0, 7, true},
		{"nested usage only", `{"data":{"usage":{"prompt_tokens":9}}}`, 0, 0, false},
		{"no usage", `{"choices":[]}`, 0, 0, false},
		{"usage null", `{"usage":null}`, 0, 0, false},
		{"usage without counts", `{"usage":{"total_tokens":3}}`, 0, 0, false},
		{"streamed", "data: {\"usage\":{\"prompt_tokens\":1}}\n\n", 0, 0, false},
		{"array", `[{"usage":{"prompt_tokens":1}}]`, 0, 0, false},
		{"malformed", `{"a":`, 0, 0, false},
		{"empty", ``, 0, 0, false},
		{"escaped backslash ends a string", `{"a":"x\\","usage":{"prompt_tokens":1,"completion_tokens":2}}`, 1, 2, true},
		{"escaped quote does not", `{"a":"x\",\"usage\":{\"prompt_tokens\":1}}"}`, 0, 0, false},
		{"key in a string value", `{"note":"\"usage\":{\"prompt_tokens\":1}","x":1}`, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in, out, ok := ParseUsage([]byte(tt.body))
			if in != tt.in || out != tt.out || ok != tt.ok {
				t.Fatalf("ParseUsage = %d, %d, %v; want %d, %d, %v", in, out, ok, tt.in, tt.out, tt.ok)
			}
		})
	}
}

func BenchmarkParseUsage(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		string(make([]byte, 2000)) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}`)
	for i := range body {
		if body[i] == 0 {
			body[i] = 'a'
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		ParseUsage(body)
	}
}

// usageByJSON is what ParseUsage must agree with: the usage member's counts
// decoded by encoding/json, after the same top-level search.
func usageByJSON(body []byte) (in, out int64, ok bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil || top["usage"] == nil {
		return 0, 0, false
	}
	var u struct {
		Prompt     *float64 `json:"prompt_tokens"`
		Completion *float64 `json:"completion_tokens"`
	}
	if json.Unmarshal(top["usage"], &u) != nil || (u.Prompt == nil && u.Completion == nil) {
		return 0, 0, false
	}
	count := func(f *float64) int64 {
		if f == nil || !(*f > 0) {
			return 0
		}
		return int64(math.Min(*f, math.MaxInt64/2))
	}
	return count(u.Prompt), count(u.Completion), true
}

// FuzzParseUsage holds the byte scan to encoding/json on well-formed
// bodies (on malformed ones the scan may stop earlier: it reads only up to
// the usage member).
func FuzzParseUsage(f *testing.F) {
	for _, s := range []string{
		`{"usage":{"prompt_tokens":12,"completion_tokens":34}}`,
		`{"usage":{"prompt_tokens":1e3,"completion_tokens":null}}`,
		`{"usage":{"prompt_tokens":"1"}}`,
		`{"usage":{"prompt_tokens":true,"completion_tokens":2}}`,
		`{"usage":{"prompt_tokens":1,"prompt_tokens":2}}`,
		`{"usage":{"completion_tokens":-0.5,"x":{"prompt_tokens":3}}}`,
		`{"usage":{"prompt_tokens":01}}`,
		`{"usage":{"prompt_tokens":1.}}`,
		`{"usage":{}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !json.Valid(body) {
			return
		}
		in, out, ok := ParseUsage(body)
		win, wout, wok := usageByJSON(body)
		if in != win || out != wout || ok != wok {
			t.Fatalf("ParseUsage(%s) = %d, %d, %v; encoding/json: %d, %d, %v", body, in, out, ok, win, wout, wok)
		}
	})
}

// BenchmarkParseUsageJSON is encoding/json on the usage member alone,
// what ParseUsage did before its byte scan of the usage object.
func BenchmarkParseUsageJSON(b *testing.B) {
	raw := []byte(`{"prompt_tokens":12,"completion_tokens":16,"total_tokens":28}`)
	b.ReportAllocs()
	for b.Loop() {
		var u struct {
			Prompt     *float64 `json:"prompt_tokens"`
			Completion *float64 `json:"completion_tokens"`
		}
		if json.Unmarshal(raw, &u) != nil {
			b.Fatal("bad")
		}
	}
}
