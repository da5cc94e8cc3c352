package redissortedset_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// A cancellation sent again (the OpenAI front repeats an abandoned call's
// every second) does not move the cancel epoch, so no replica reloads the
// cancel set for it, but it is announced again, so a request that came in
// flight since is still aborted. A new entry moves the epoch, as does one
// forgotten when its ttl ran out.
func TestCancelAgainKeepsEpoch(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	p, err := producer.Dial(r.URL, producer.Config{CancelTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sub := c.Subscribe(ctx, "llm-d-async:cancel")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	announced := sub.Channel()
	epoch := func() string {
		t.Helper()
		e, err := c.Get(ctx, "llm-d-async:cancel-epoch").Result()
		if err != nil {
			t.Fatalf("read the epoch: %v", err)
		}
		return e
	}
	heard := func(want string) {
		t.Helper()
		select {
		case m := <-announced:
			if m.Payload != want {
				t.Fatalf("announced %q, want %q", m.Payload, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not announced within 5 s", want)
		}
	}
	steps := []struct {
		name      string
		cancel    func() error
		announced string
		epoch     string
	}{
		{"request a", func() error { return p.CancelRequest(ctx, "a") }, "req:a", "1"},
		{"request a again", func() error { return p.CancelRequest(ctx, "a") }, "req:a", "1"},
		{"request b", func() error { return p.CancelRequest(ctx, "b") }, "req:b", "2"},
		{"job j", func() error { _, err := p.CancelJob(ctx, "j"); return err }, "job:j", "3"},
		{"job j again", func() error { _, err := p.CancelJob(ctx, "j"); return err }, "job:j", "3"},
	}
	for _, s := range steps {
		if err := s.cancel(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		heard(s.announced)
		if got := epoch(); got != s.epoch {
			t.Fatalf("after %s the epoch is %s, want %s", s.name, got, s.epoch)
		}
	}
	// An entry whose ttl ran out is forgotten by the next cancellation,
	// which moves the epoch even when it is itself sent again.
	if err := c.ZAdd(ctx, "llm-d-async:cancelled", redis.Z{Score: 1, Member: "req:old"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.CancelRequest(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	heard("req:a")
	if got := epoch(); got != "4" {
		t.Fatalf("after forgetting an entry the epoch is %s, want 4", got)
	}
}
