package redissortedset_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/submit"
	"github.com/sluice-io/sluice/front/submit/redissortedset"
	"github.com/sluice-io/sluice/front/submit/submittest"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The suite against a real redis-server.
func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	submittest.Run(t, submittest.Harness{
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
			return tr, redissortedset.New(p, redissortedset.Options{Lease: lease})
		},
	})
}

// TestIdempotent: the seam's idempotent submit replays the first
// submission, matches submit's sentinel errors, and looks keys up.
func TestIdempotent(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var sp submit.Producer = redissortedset.New(p, redissortedset.Options{})
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
