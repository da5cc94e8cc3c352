package dispatch

import "testing"

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
