package redissortedset_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// DeadlineProximity counts, on a real redis-server, the waiting members by
// score (the deadline in seconds) against upstream's bounds: below now+b+1
// (exclusive), whole seconds.
func TestDeadlineProximity(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	ctx := context.Background()
	now := time.Now().Unix()
	// Time left: expired (-10 s), none (0 s), 3 s, 40 s, 2 days.
	lefts := []int64{-10, 0, 3, 40, 2 * 86400}
	for i, l := range lefts {
		if err := c.ZAdd(ctx, "q", redis.Z{Score: float64(now + l), Member: "m" + strconv.Itoa(i)}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cum, total, err := tp.DeadlineProximity(ctx, transport.Queue{Name: "q"}, metrics.ProximityBounds)
	if err != nil {
		t.Fatal(err)
	}
	// Bound b counts scores < now+b+1: le=0 → -10 and 0; 1 s → the same;
	// 5 s → +3; 15 s, 30 s → the same; 60 s … 1 day → +40; the 2-day one only in +Inf.
	want := []uint64{2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4}
	if !slices.Equal(cum, want) || total != 5 {
		t.Fatalf("cumulative %v total %d, want %v and 5", cum, total, want)
	}
}
