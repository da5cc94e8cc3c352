package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestFakeClockStepsRedisTime: a rewrite of the offset moves redis-server's
// TIME (and the TIME its scripts read) at once, forward and back, without a
// restart.
func TestFakeClockStepsRedisTime(t *testing.T) {
	clk := NewFakeClock(t)
	r := StartRedis(t, RedisOptions{Env: clk.Env()})
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	ctx := context.Background()
	skew := func() time.Duration {
		t.Helper()
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return time.Until(now)
	}
	near := func(d, want time.Duration) bool { return d > want-2*time.Second && d < want+2*time.Second }
	if d := skew(); !near(d, 0) {
		t.Fatalf("offset 0: Redis' clock %v off", d)
	}
	for _, off := range []time.Duration{15 * time.Minute, -10 * time.Minute, 0} {
		if err := clk.Set(off); err != nil {
			t.Fatal(err)
		}
		if d := skew(); !near(d, off) {
			t.Fatalf("offset %v: Redis' clock %v off", off, d)
		}
		v, err := c.Eval(ctx, "return redis.call('TIME')[1]", nil).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(time.Unix(v, 0)); !near(d, off) {
			t.Fatalf("offset %v: a script's TIME %v off", off, d)
		}
	}
}
