package redisstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// A cancellation sent again moves no epoch (no replica reloads the set for
// it) and is announced again; a new entry, or one forgotten, moves it.
func TestCancelAgainKeepsEpoch(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	key := redisstream.DefaultCancelKey
	sub := c.Subscribe(ctx, key+":notify")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	announced := sub.Channel()
	step := func(name string, ca transport.Cancellation, entry, epoch string) {
		t.Helper()
		if err := redisstream.Cancel(ctx, c, "", ca, time.Hour); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		select {
		case m := <-announced:
			if m.Payload != entry {
				t.Fatalf("%s: announced %q, want %q", name, m.Payload, entry)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not announced within 5 s", name)
		}
		got, err := c.Get(ctx, key+":epoch").Result()
		if err != nil || got != epoch {
			t.Fatalf("after %s the epoch is %q (%v), want %s", name, got, err, epoch)
		}
	}
	step("request a", transport.Cancellation{RequestID: "a"}, "req:a", "1")
	step("request a again", transport.Cancellation{RequestID: "a"}, "req:a", "1")
	step("job j", transport.Cancellation{JobID: "j"}, "job:j", "2")
	if err := c.ZAdd(ctx, key, redis.Z{Score: 1, Member: "req:old"}).Err(); err != nil {
		t.Fatal(err)
	}
	step("request a once more, forgetting an old entry", transport.Cancellation{RequestID: "a"}, "req:a", "3")
}
