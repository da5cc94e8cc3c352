package producer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// ExampleProducer enqueues requests for pool-a, cancels a job and reads the
// results sluice writes (here, one written by hand in sluice's place).
func ExampleProducer() {
	r, err := testenv.StartRedisProcess(testenv.RedisOptions{}) // in production: os.Getenv("REDIS_URL")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Stop()
	ctx := context.Background()

	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()

	queue := p.Names().RequestQueue("pool-a")
	var reqs []*wire.Request
	for i, job := range []string{"job-1", "job-1", "job-2"} {
		reqs = append(reqs, &wire.Request{
			ID:       fmt.Sprintf("req-%d", i),
			Deadline: time.Now().Add(24 * time.Hour),
			Payload:  json.RawMessage(`{"model":"Qwen/Qwen3-0.6B","prompt":"What is 2+2?"}`),
			Metadata: map[string]string{"job_id": job},
		})
	}
	if err := p.EnqueueMany(ctx, queue, reqs); err != nil {
		fmt.Println(err)
		return
	}
	moved, err := p.CancelJob(ctx, "job-2")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("queue:", queue, "waiting:", p.Client().ZCard(ctx, queue).Val(), "cancelled and moved to the front:", moved)

	results := p.Names().ResultQueue("pool-a", "") // llm-d-async:results:pool-a:$batch
	res := wire.Result{ID: "req-0", StatusCode: 200, Payload: `{"choices":[]}`}
	p.Client().LPush(ctx, results, res.Marshal()) // sluice does this

	reader := p.Results(results, producer.ReaderOptions{})
	leases, err := reader.Next(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range leases {
		fmt.Println("result:", l.Result.ID, l.Result.StatusCode)
	}
	if err := reader.Ack(ctx, leases...); err != nil {
		fmt.Println(err)
	}
	// Output:
	// queue: llm-d-async:requests:pool-a waiting: 3 cancelled and moved to the front: 1
	// result: req-0 200
}
