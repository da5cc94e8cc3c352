package batch

import (
	"testing"

	"github.com/sluice-io/sluice/core/wire"
)

func TestUsageAdd(t *testing.T) {
	var u Usage
	for _, l := range []string{
		// chat completions and completions
		`{"custom_id":"a","response":{"status_code":200,"body":{"usage":{"prompt_tokens":10,"completion_tokens":4,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":1}}}}}`,
		// the Responses API
		`{"custom_id":"b","response":{"status_code":200,"body":{"usage":{"input_tokens":7,"output_tokens":2,"total_tokens":9,"input_tokens_details":{"cached_tokens":2},"output_tokens_details":{"reasoning_tokens":1}}}}}`,
		// embeddings: no completion tokens
		`{"custom_id":"c","response":{"status_code":200,"body":{"usage":{"prompt_tokens":5,"total_tokens":5}}}}`,
		// no total given: input + output
		`{"custom_id":"d","response":{"status_code":200,"body":{"usage":{"prompt_tokens":1,"completion_tokens":1}}}}`,
		// nothing to add
		`{"custom_id":"e","response":null,"error":{"code":"batch_expired","message":"x"}}`,
		`{"custom_id":"f","response":{"status_code":400,"body":"not json"}}`,
		`not a line`,
	} {
		u.add([]byte(l))
	}
	want := Usage{InputTokens: 23, OutputTokens: 7, TotalTokens: 30,
		InputTokensDetails: InputTokensDetails{CachedTokens: 5}, OutputTokensDetails: OutputTokensDetails{ReasoningTokens: 2}}
	if u != want {
		t.Errorf("usage = %+v, want %+v", u, want)
	}
}

// The tally is the job's usage only while every Record step added all the
// lines it carried; once one did not (a line answered twice, another
// replica's records), finalizing sums the records instead.
func TestUsageTally(t *testing.T) {
	one := &lineUsage{PromptTokens: 2, CompletionTokens: 1}
	tl := usageTally{exact: true}
	tl.recorded([]*lineUsage{one, nil, one}, 3)
	if !tl.exact || tl.sum.TotalTokens != 6 || tl.sum.InputTokens != 4 {
		t.Fatalf("after a full step: %+v", tl)
	}
	tl.recorded([]*lineUsage{one, one}, 1)
	if tl.exact {
		t.Fatalf("a step that added 1 of 2 lines left the tally exact: %+v", tl)
	}
	tl.recorded([]*lineUsage{one}, 1)
	if tl.exact {
		t.Fatal("the tally became exact again")
	}
	resumed := usageTally{exact: false}
	resumed.recorded([]*lineUsage{one}, 1)
	if resumed.exact || resumed.sum.TotalTokens != 0 {
		t.Fatalf("a resumed job's tally: %+v", resumed)
	}
}

// BenchmarkRecordOf is the front's work per result: the output line built
// around a chat completion's body (as the simulator answers) and its
// usage read.
func BenchmarkRecordOf(b *testing.B) {
	r := &wire.Result{ID: "batch_18b0c0ffee0000001a2b3c4d-12345", StatusCode: 200,
		Payload: `{"id":"chatcmpl-12345","object":"chat.completion","created":1764700000,"model":"m1",` +
			`"choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help you today?"},"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":25,"completion_tokens":9,"total_tokens":34}}` + "\n"}
	b.ReportAllocs()
	for b.Loop() {
		if _, u := recordOf(12345, "req-12345", r); u == nil || u.TotalTokens != 34 {
			b.Fatalf("usage %+v", u)
		}
	}
}
