package redissortedset

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
)

var _ transport.DeadlineProximityReporter = (*Transport)(nil)

// DeadlineProximity implements transport.DeadlineProximityReporter as
// upstream reads it: one MULTI/EXEC of ZCARD and, per bound b, ZCOUNT
// <queue> -inf (<now + b + 1 s> (exclusive), now in whole Unix seconds, on
// the score (the deadline, in seconds).
func (t *Transport) DeadlineProximity(ctx context.Context, q transport.Queue, bounds []time.Duration) ([]uint64, uint64, error) {
	key := t.names.Queue(q.Name).Name
	now := time.Now().Unix()
	counts := make([]*redis.IntCmd, len(bounds))
	var card *redis.IntCmd
	_, err := t.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		card = p.ZCard(ctx, key)
		for i, b := range bounds {
			counts[i] = p.ZCount(ctx, key, "-inf", "("+strconv.FormatInt(now+int64(b/time.Second)+1, 10))
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("deadline proximity of %s: %w", q.Name, err)
	}
	out := make([]uint64, len(bounds))
	for i, c := range counts {
		out[i] = uint64(max(0, c.Val()))
	}
	return out, uint64(max(0, card.Val())), nil
}
