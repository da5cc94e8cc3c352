package wire

import "testing"

// benchFlat is a typical batch request in the flat form.
const benchFlat = `{"id":"batch_req_0123456789abcdef","created":1700000000,"deadline":1700086400,` +
	`"payload":{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"system","content":"You are a helpful assistant."},` +
	`{"role":"user","content":"What is 2+2? Answer with a single number and nothing else, please."}],"max_tokens":128,"temperature":0.2},` +
	`"metadata":{"job_id":"batch_abc123","request_index":"42"},` +
	`"headers":{"x-llm-d-inference-fairness-id":"tenant-7"},"endpoint":"/v1/chat/completions"}`

// benchEnvelope is the same request in upstream's envelope.
const benchEnvelope = `{"request_kind":"redis","internal":{"retry_count":2,"queue_id":"pool-a","request_token":"0123456789abcdef",` +
	`"request_queue_name":"llm-d-async:requests:pool-a","result_queue_name":"llm-d-async:results:pool-a:$batch","labels":{"tier":"gold"}},` +
	`"data":` + benchFlat + `}`

// benchEnvelopeNoLabels is benchEnvelope without internal.labels.
const benchEnvelopeNoLabels = `{"request_kind":"redis","internal":{"retry_count":2,"queue_id":"pool-a","request_token":"0123456789abcdef",` +
	`"request_queue_name":"llm-d-async:requests:pool-a","result_queue_name":"llm-d-async:results:pool-a:$batch"},` +
	`"data":` + benchFlat + `}`

// BenchmarkDecode measures Decode on the happy path of both forms.
func BenchmarkDecode(b *testing.B) {
	for _, bc := range []struct {
		name string
		msg  string
	}{
		{"flat", benchFlat},
		{"envelope", benchEnvelope},
		{"envelope-nolabels", benchEnvelopeNoLabels},
	} {
		b.Run(bc.name, func(b *testing.B) {
			msg := []byte(bc.msg)
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Decode(msg); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkResultMarshal measures Result.Marshal for a typical success.
func BenchmarkResultMarshal(b *testing.B) {
	r := &Result{
		ID:         "batch_req_0123456789abcdef",
		StatusCode: 200,
		Payload:    `{"id":"chatcmpl-123","object":"chat.completion","created":1700000001,"model":"Qwen/Qwen3-0.6B","choices":[{"index":0,"message":{"role":"assistant","content":"4"},"finish_reason":"stop"}],"usage":{"prompt_tokens":31,"completion_tokens":1,"total_tokens":32}}`,
		Metadata:   map[string]string{"job_id": "batch_abc123", "request_index": "42"},
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = r.Marshal()
	}
}
