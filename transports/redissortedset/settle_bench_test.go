package redissortedset

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/internal/upstream"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// BenchmarkSettle measures one settle script call of maxSettleBatch results
// against a real redis-server: without upstream request tokens (flat
// requests: the cancellation-key cleanup costs one comparison per item),
// with tokens whose keys are gone, and with tokens whose two keys exist and
// are deleted. It reports Redis' own time per call (INFO commandstats,
// evalsha) beside the wall time, which includes the round trip.
func BenchmarkSettle(b *testing.B) {
	r := testenv.StartRedis(b, testenv.RedisOptions{})
	c := testenv.RedisClient(b, r.URL)
	ctx := context.Background()
	k := keys.Names{}.Queue("bench")
	sk := []string{k.Claimed, k.Owners, k.ClaimsIdx, "bench:results", k.Dead, k.Stats, k.Redeliveries}
	result := strings.Repeat("r", 300)
	for _, bc := range []struct {
		name        string
		token, keys bool
	}{{"no-token", false, false}, {"token-keys-absent", true, false}, {"token-keys-present", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			if err := keys.Settle.Load(ctx, c).Err(); err != nil {
				b.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			calls := 0
			for b.Loop() {
				b.StopTimer()
				args := make([]any, 0, keys.SettleArgs*maxSettleBatch)
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					p.Del(ctx, "bench:results")
					for i := range maxSettleBatch {
						tok, id, rt := fmt.Sprintf("t%d", i), fmt.Sprintf("req-%d", i), ""
						ck := id + "\x00" + tok
						p.HSet(ctx, k.Claimed, ck, "msg")
						p.HSet(ctx, k.Owners, ck, tok)
						p.ZAdd(ctx, k.ClaimsIdx, redis.Z{Score: 1e12, Member: ck})
						if bc.token {
							rt = "0123456789abcdef0123456789abcdef"
						}
						if bc.keys {
							p.Set(ctx, upstream.ActiveKey(id), rt, 0)
							p.Set(ctx, upstream.CancelKey(id), rt, 0)
						}
						args = append(args, "r", tok, ck, result, "", id, rt, "", 0)
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := keys.Settle.Run(ctx, c, sk, args...).Err(); err != nil {
					b.Fatal(err)
				}
				calls++
			}
			b.StopTimer()
			if us, ok := evalshaUsecPerCall(b, c); ok && calls > 0 {
				b.ReportMetric(us, "redis-µs/call")
			}
		})
	}
}

// evalshaUsecPerCall reads usec_per_call of evalsha from INFO commandstats.
func evalshaUsecPerCall(b *testing.B, c redis.UniversalClient) (float64, bool) {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[len("cmdstat_evalsha:"):]), ",") {
			var v float64
			if _, err := fmt.Sscanf(f, "usec_per_call=%g", &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}
