package redissortedset

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
)

// benchEnvelope is a member as the producer's Envelope mode writes it (and
// upstream's producer after v0.10).
const benchEnvelope = `{"internal":{"request_token":"5f2b8c9e0a1d4e3f8a7b6c5d4e3f2a1b","request_queue_name":"llm-d-async:requests:bench","result_queue_name":"llm-d-async:results:bench:$batch","enqueue_seq":17},"request_kind":"plain","data":{"id":"e-17","created":1764680000,"deadline":1764683600,"payload":{"model":"m","prompt":"What is 2+2?","max_tokens":16},"metadata":{"job_id":"bench","request_index":"17"}}}`

// BenchmarkStampEnvelope measures the claim's per-message work on an
// envelope beside the script call: the message, its metadata and the
// routing stamps (stampEnvelope).
func BenchmarkStampEnvelope(b *testing.B) {
	s := &source{q: transport.Queue{Name: "llm-d-async:requests:bench", ResultName: "llm-d-async:results:bench:$batch", ResultFromMessage: true}}
	b.ReportAllocs()
	for b.Loop() {
		m := message.NewMessage("tok", []byte(benchEnvelope))
		m.Metadata = message.Metadata{MetaLease: "tok", MetaClaim: "e-17\x005f2b8c9e0a1d4e3f8a7b6c5d4e3f2a1b", MetaScore: "1764683600.000008",
			MetaDeliveries: "1", MetaQueue: s.q.Name}
		s.stampEnvelope(m)
	}
}
