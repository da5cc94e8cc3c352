package batch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// crashingState fails the job update that records a chunk's progress, once:
// the front died between queueing the chunk and recording it.
type crashingState struct {
	oneJobState
	failAt, calls int
}

var errCrash = errors.New("the front died here")

func (s *crashingState) UpdateJob(ctx context.Context, id string, fn func(*Job) error) (Job, error) {
	s.calls++
	if s.calls == s.failAt {
		return s.job, errCrash
	}
	return s.oneJobState.UpdateJob(ctx, id, fn)
}

// TestResumeQueuesNothingTwice: on redis-sortedset the front submits each
// line idempotently under its request id, so resuming a job whose chunk
// was queued but not recorded queues every line exactly once.
func TestResumeQueuesNothingTwice(t *testing.T) {
	const n, chunk = 250, 100
	var in bytes.Buffer
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"c-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m1","messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, i)
	}
	ctx := context.Background()
	files, size := inputFile(t, in.Bytes())
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	prod := producer.NewSubmitter(p, submit.ReaderOptions{})
	defer prod.Close()
	if !prod.Capabilities().Idempotent {
		t.Fatal("the redis-sortedset producer on one node takes no idempotent submits")
	}
	// Update 1 is validation's; 2 records chunk 1; 3 would record chunk 2.
	st := &crashingState{oneJobState: oneJobState{job: Job{ID: "batch_r", Endpoint: "/v1/chat/completions", InputFileID: "file-in", Status: StatusValidating, ExpiresAt: 4102444800},
		file: File{ID: "file-in", Bytes: size, Lines: n}}, failAt: 3}
	s, err := New(Config{Queue: "acme/batch-q", ChunkSize: chunk}, st, files, prod, nil)
	if err != nil {
		t.Fatal(err)
	}
	j, kept, err := s.validate(ctx, st.job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.enqueue(ctx, j, kept); !errors.Is(err, errCrash) {
		t.Fatalf("first attempt: %v, want the crash", err)
	}
	if st.job.Enqueued != chunk {
		t.Fatalf("recorded %d lines, want the first chunk's %d", st.job.Enqueued, chunk)
	}
	if got := p.Client().ZCard(ctx, "acme/batch-q").Val(); got != 2*chunk {
		t.Fatalf("queue holds %d after the crash, want two chunks (%d)", got, 2*chunk)
	}
	// The resumed job reads the file again from what was recorded.
	j, err = s.enqueue(ctx, st.job, nil)
	if err != nil || j.Enqueued != n {
		t.Fatalf("resume: %v, enqueued %d", err, j.Enqueued)
	}
	members := p.Client().ZRange(ctx, "acme/batch-q", 0, -1).Val()
	seen := map[string]int{}
	for _, m := range members {
		for i := range n {
			if strings.Contains(m, `"id":"`+requestID("batch_r", i)+`"`) {
				seen[requestID("batch_r", i)]++
			}
		}
	}
	if len(members) != n {
		t.Errorf("queue holds %d requests, want %d", len(members), n)
	}
	for i := range n {
		if id := requestID("batch_r", i); seen[id] != 1 {
			t.Errorf("%s queued %d times", id, seen[id])
		}
	}
}
