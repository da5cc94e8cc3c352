package keys

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/testenv"
)

// A script whose reply was lost is sent again by the client with the same
// arguments (go-redis retries on network errors). These tests send each
// non-idempotent script twice, as such a retry does, and check that the
// second run neither loses nor duplicates requests.

func TestClaimReplayReturnsTheSameLeases(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	q := Names{}.Queue("llm-d-async:requests:replay")
	for i := range 10 {
		if err := c.ZAdd(ctx, q.Name, redisZ(float64(i), "m"+strconv.Itoa(i))).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ks := []string{q.Name, q.Claimed, q.Owners, q.ClaimsIdx, q.Redeliveries, q.Delayed, q.ClaimCalls + "tok:1", Names{}.CancelEpoch()}
	claim := func() []any {
		t.Helper()
		raw, err := Claim.Run(ctx, c, ks, 4, 60000, "tok:1:", q.JobPrefix).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	first, again := claim(), claim()
	if len(first) != 3+4*ClaimReplyFields {
		t.Fatalf("first claim returned %d elements, want %d", len(first), 3+4*ClaimReplyFields)
	}
	if len(again) != len(first) {
		t.Fatalf("replayed claim returned %d elements, want %d (the same leases)", len(again), len(first))
	}
	for i := 3; i < len(first); i++ {
		if first[i] != again[i] {
			t.Errorf("element %d: first %v, replay %v", i, first[i], again[i])
		}
	}
	if n := c.ZCard(ctx, q.Name).Val(); n != 6 {
		t.Errorf("queue holds %d, want 6 (the replay must claim nothing more)", n)
	}
	if n := c.HLen(ctx, q.Claimed).Val(); n != 4 {
		t.Errorf("%d claim records, want 4", n)
	}
	// A new prefix (and call record) claims the next ones.
	ks[6] = q.ClaimCalls + "tok:2"
	raw, err := Claim.Run(ctx, c, ks, 4, 60000, "tok:2:", q.JobPrefix).Slice()
	if err != nil || len(raw) != 3+4*ClaimReplyFields || raw[6] != "m4" {
		t.Fatalf("next claim: %v, %v", raw, err)
	}
}

func TestEnqueueReplayAddsNothing(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	n := Names{}
	q := n.Queue("llm-d-async:requests:replay")
	score := strconv.FormatFloat(float64(time.Now().Add(time.Hour).Unix()), 'f', 3, 64)
	args := []any{q.JobPrefix, n.JobQueues(""), 60000, time.Now().UnixMilli(),
		score, "job", `"id":"a"}`, score, "job", `"id":"b"}`}
	ks := []string{q.Name, q.Seq, q.CallMarks + "p:1"}
	for range 2 {
		if err := Enqueue.Run(ctx, c, ks, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.ZCard(ctx, q.Name).Val(); got != 2 {
		t.Fatalf("queue holds %d after a call and its replay, want 2", got)
	}
	ks[2] = q.CallMarks + "p:2"
	if err := Enqueue.Run(ctx, c, ks, args...).Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.ZCard(ctx, q.Name).Val(); got != 4 {
		t.Fatalf("queue holds %d after a second call, want 4", got)
	}
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }
