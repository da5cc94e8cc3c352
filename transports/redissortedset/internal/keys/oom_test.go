package keys

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/testenv"
)

// TestSettleOutOfMemory: a settle on a server at maxmemory (noeviction)
// must never drop a claim without writing its result: either the result is
// in the list and the claim gone, or the call fails and the claim stays.
// (Redis refuses a script's first write that needs memory; once a script
// has written, its later writes go through, so the settle, whose first
// write is the claim's HDEL, completes.)
func TestSettleOutOfMemory(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Args: []string{"--maxmemory", "4mb", "--maxmemory-policy", "noeviction"}})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	q := Names{}.Queue("llm-d-async:requests:oom")
	if err := c.ZAdd(ctx, q.Name, redisZ(1, "m1")).Err(); err != nil {
		t.Fatal(err)
	}
	ks := []string{q.Name, q.Claimed, q.Owners, q.ClaimsIdx, q.Redeliveries, q.Delayed, q.ClaimCalls + "tok:1"}
	raw, err := Claim.Run(ctx, c, ks, 1, 60000, "tok:1:", q.JobPrefix).Slice()
	if err != nil || len(raw) != 3+ClaimReplyFields {
		t.Fatalf("claim: %v %v", raw, err)
	}
	token, claim := raw[3].(string), raw[7].(string)
	// Fill the server up to maxmemory.
	big := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		if err := c.Set(ctx, "fill:"+string(rune('a'+i%26))+strings.Repeat("y", i/26), big, 0).Err(); err != nil {
			if !strings.Contains(err.Error(), "OOM") {
				t.Fatal(err)
			}
			break
		}
		if i > 10000 {
			t.Fatal("never reached maxmemory")
		}
	}
	results := "llm-d-async:results:oom:$batch"
	_, serr := Settle.Run(ctx, c, []string{q.Claimed, q.Owners, q.ClaimsIdx, results, q.Dead, q.Stats, q.Redeliveries},
		"r", token, claim, strings.Repeat("r", 4<<10), "", "", "", "", 0).Int64Slice()
	held := c.HGet(ctx, q.Owners, claim).Val() == token
	written := c.LLen(ctx, results).Val()
	t.Logf("settle at maxmemory: err=%v, lease held=%v, results written=%d", serr, held, written)
	switch {
	case serr == nil && !held && written == 1:
	case serr != nil && held && written == 0:
	default:
		t.Fatalf("settle at maxmemory: err=%v, lease held=%v, results written=%d: a lease was dropped without its result, or both kept", serr, held, written)
	}
}
