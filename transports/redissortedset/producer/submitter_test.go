package producer_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/submit/submittest"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/internal/rigs/dispatcher"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The suite against a real redis-server.
func TestSubmitterConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	submittest.Run(t, submittest.Harness{
		Dispatch:      dispatcher.Runner(ad),
		Features:      submittest.Features{CountsCancelled: true},
		TransportName: rss.Name,
		New: func(t testing.TB, lease time.Duration) (transport.Transport, submit.Producer) {
			tr, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}, PollIntervalMS: 20}, nil)
			if err != nil {
				t.Fatal(err)
			}
			p, err := producer.Dial(r.URL, producer.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return tr, producer.NewSubmitter(p, submit.ReaderOptions{Lease: lease})
		},
	})
}

// TestIdempotent: the seam's idempotent submit replays the first
// submission, matches submit's sentinel errors, and looks keys up.
func TestSubmitterIdempotent(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var sp submit.Producer = producer.NewSubmitter(p, submit.ReaderOptions{})
	defer sp.Close()
	ip, ok := sp.(submit.IdempotentProducer)
	if !ok {
		t.Fatal("the redis-sortedset producer takes no idempotent submits")
	}
	ctx := context.Background()
	req := func(prompt string) *wire.Request {
		return &wire.Request{ID: "r1", Deadline: time.Unix(4_000_000_000, 0), Payload: json.RawMessage(`{"prompt":"` + prompt + `"}`), ResultQueueName: "route-a"}
	}
	first, err := ip.SubmitIdempotent(ctx, "q", []*wire.Request{req("a")}, []string{"k1"})
	if err != nil || len(first) != 1 || first[0].Replayed {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := ip.SubmitIdempotent(ctx, "q", []*wire.Request{req("a")}, []string{"k1"})
	if err != nil || !again[0].Replayed || again[0].RequestToken != first[0].RequestToken || again[0].ResultRoute != "route-a" {
		t.Errorf("again: %+v %v", again, err)
	}
	if _, err := ip.SubmitIdempotent(ctx, "q", []*wire.Request{req("b")}, []string{"k1"}); !errors.Is(err, submit.ErrIdempotencyConflict) || !strings.Contains(err.Error(), "k1") {
		t.Errorf("conflict: %v", err)
	}
	if s, err := ip.LookupSubmission(ctx, "k1"); err != nil || s.RequestToken != first[0].RequestToken {
		t.Errorf("lookup: %+v %v", s, err)
	}
	if _, err := ip.LookupSubmission(ctx, "k2"); !errors.Is(err, submit.ErrSubmissionNotFound) {
		t.Errorf("lookup of an unknown key: %v", err)
	}
	if n := p.Client().ZCard(ctx, "q").Val(); n != 1 {
		t.Errorf("queue holds %d, want 1", n)
	}
}

// TestReopenResults: a consumer restarted on its route receives at once
// the results its earlier incarnation leased and did not ack (their
// leases have a minute to run), acks each once, and reads on; what the
// earlier incarnation acked does not come back.
func TestSubmitterReopenResults(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sp := producer.NewSubmitter(p, submit.ReaderOptions{Lease: time.Minute})
	defer sp.Close()
	ctx := context.Background()
	const route = "acme/results:replica-1"
	push := func(ids ...string) {
		for _, id := range ids {
			if err := p.Client().LPush(ctx, route, `{"id":"`+id+`","status_code":200,"payload":"{}"}`).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	push("r0", "r1", "r2", "r3", "r4", "r5")
	first, err := sp.Results(ctx, route)
	if err != nil {
		t.Fatal(err)
	}
	got, err := first.Next(ctx)
	if err != nil || len(got) != 6 {
		t.Fatalf("first incarnation: %d results, %v", len(got), err)
	}
	if err := first.Ack(ctx, got[0], got[1]); err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{got[0].ID: true, got[1].ID: true}
	// The first incarnation dies here holding four leases.
	push("r6", "r7")
	second, err := sp.ReopenResults(ctx, route)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second) // far below the lease
	defer cancel()
	for len(seen) < 6 {
		rs, err := second.Next(tctx)
		if err != nil {
			t.Fatalf("after reopening: %d results (%v): %v", len(seen), seen, err)
		}
		for _, res := range rs {
			seen[res.ID]++
		}
		if err := second.Ack(ctx, rs...); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"} {
		want := 1
		if acked[id] {
			want = 0
		}
		if seen[id] != want {
			t.Errorf("%s received %d times after the reopen, want %d", id, seen[id], want)
		}
	}
	if n := p.Client().ZCard(ctx, p.Names().Pending(route)).Val(); n != 0 {
		t.Errorf("%d results still leased after every ack", n)
	}
	if n := p.Client().LLen(ctx, route).Val(); n != 0 {
		t.Errorf("%d results left in the route", n)
	}
}
