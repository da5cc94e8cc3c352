package redissortedset_test

import (
	"context"
	"testing"
	"time"

	msg "github.com/sluice-io/sluice/core/message"
	"github.com/sluice-io/sluice/simulator"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

func TestEndToEnd(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	q, res := rss.RequestQueueName("pool-a"), rss.ResultQueueName("pool-a", "")
	var reqs []*msg.Request
	for _, id := range ids("r", 500) {
		reqs = append(reqs, request(id, "job-1", time.Hour, nil))
	}
	if err := f.prod.EnqueueMany(context.Background(), q, reqs); err != nil {
		t.Fatal(err)
	}
	f.runApp(f.transport(rss.Options{}), q, res, 32)
	got := f.collect(res, len(reqs), 20*time.Second)
	for id, r := range got {
		if !r.OK() || r.StatusCode != 200 || r.Metadata["job_id"] != "job-1" {
			t.Fatalf("result %s: %+v", id, r)
		}
	}
	f.expectNoMore(res, 200*time.Millisecond)
	if d := f.depth(q); d != "waiting=0 inflight=0 delayed=0 dead=0" {
		t.Errorf("depth after the run: %s", d)
	}
}
