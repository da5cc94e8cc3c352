package redissortedset_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// TestZZProbeFlow (scratch) drains n envelopes with at most 128 claims
// standing, results published and settled from their own goroutines.
func TestZZProbeFlow(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PROBE_N"))
	if n == 0 {
		t.Skip()
	}
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	cfg := producer.Config{Envelope: true, ResultQueueName: rss.ResultQueueName("bench", "")}
	p, err := producer.Dial(r.URL, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	q := rss.RequestQueueName("bench")
	results := rss.ResultQueueName("bench", "")
	reqs := make([]*wire.Request, n)
	for i := range reqs {
		reqs[i] = &wire.Request{ID: "e-" + strconv.Itoa(i), Deadline: time.Now().Add(time.Hour), Created: time.Now(),
			Payload:  json.RawMessage(`{"model":"m","prompt":"What is 2+2?","max_tokens":16}`),
			Metadata: map[string]string{"job_id": "bench", "request_index": strconv.Itoa(i)}}
	}
	if err := p.EnqueueMany(ctx, q, reqs); err != nil {
		t.Fatal(err)
	}
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	src, err := tp.Source(transport.Queue{Name: q, ResultName: results})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); _ = src.Close() }()
	if err := src.Open(sctx); err != nil {
		t.Fatal(err)
	}
	pub, err := tp.Publisher(transport.Queue{Name: q, ResultName: results})
	if err != nil {
		t.Fatal(err)
	}
	result := `{"id":"x","payload":"{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"4\",\"index\":0,\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,\"total_tokens\":6}}","status_code":200}`
	sem := make(chan struct{}, 192)
	var wg sync.WaitGroup
	start := time.Now()
	for done := 0; done < n; {
		sem <- struct{}{}
		free := 1
		for free < 64 && len(sem) < cap(sem) {
			sem <- struct{}{}
			free++
		}
		ms, err := src.Claim(sctx, min(free, n-done))
		if err != nil {
			t.Fatal(err)
		}
		for range free - len(ms) {
			<-sem
		}
		done += len(ms)
		for _, m := range ms {
			wg.Add(1)
			go func(m *message.Message) {
				defer wg.Done()
				defer func() { <-sem }()
				out := message.NewMessage(m.UUID, []byte(result))
				out.Metadata = m.Metadata
				if err := pub.Publish(results, out); err != nil {
					t.Error(err)
				}
				src.Settle(m, true)
			}(m)
		}
	}
	wg.Wait()
	c := testenv.RedisClient(t, r.URL)
	for i := 0; ; i++ {
		l, _ := c.LLen(ctx, results).Result()
		if l == int64(n) {
			break
		}
		if i > 6000 {
			t.Fatalf("results %d of %d", l, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("PROBEFLOW n=%d in %v\n", n, time.Since(start))
	cancel()
	_ = src.Close()
	_ = tp.Close()
	c.ShutdownNoSave(ctx)
	time.Sleep(3 * time.Second)
}
