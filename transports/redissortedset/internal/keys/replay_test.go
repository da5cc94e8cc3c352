package keys

import (
	"context"
	"math"
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

// The claim writes whole numbers (lease expiries in whole seconds, lease
// caps, delivery counts) through '%d' and formats repeated ones once: a
// replayed claim must still read back from its record exactly what the
// first run returned, and Q:claims-idx must hold the same expiries, for
// caps far beyond 2^53 and fractional deadlines as well.
func TestClaimNumbersSurviveTheRecord(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	q := Names{}.Queue("llm-d-async:requests:numbers")
	now := float64(time.Now().Unix())
	deadlines := []string{
		strconv.FormatFloat(now+3600, 'f', -1, 64),   // capped by the lease: a whole-second expiry
		strconv.FormatFloat(now+3600, 'f', -1, 64),   // the same expiry again (formatted once)
		strconv.FormatFloat(now-250.25, 'f', -1, 64), // past: the cap (fractional seconds) bounds the lease
		"123456789012345.678",                        // a cap beyond 2^53 ms, exact only through %d
		strconv.FormatFloat(now+7200, 'f', -1, 64),
	}
	members := make([]string, len(deadlines))
	for i, dl := range deadlines {
		members[i] = `{"internal":{"request_token":"t` + strconv.Itoa(i) + `"},"request_kind":"plain","data":{"id":"r` +
			strconv.Itoa(i) + `","deadline":` + dl + `,"payload":{}}}`
		if err := c.ZAdd(ctx, q.Name, redisZ(float64(i)+0.5, members[i])).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.HSet(ctx, q.Redeliveries, members[4], 2).Err(); err != nil {
		t.Fatal(err)
	}
	ks := []string{q.Name, q.Claimed, q.Owners, q.ClaimsIdx, q.Redeliveries, q.Delayed, q.ClaimCalls + "n:1", Names{}.CancelEpoch()}
	claim := func() []any {
		t.Helper()
		raw, err := Claim.Run(ctx, c, ks, len(members), 60000, "n:1:", q.JobPrefix).Slice()
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) != 3+len(members)*ClaimReplyFields {
			t.Fatalf("claim returned %d elements, want %d", len(raw), 3+len(members)*ClaimReplyFields)
		}
		return raw
	}
	first := claim()
	nowMS := float64(first[2].(int64))
	again := claim()
	for i := range members {
		f, a := first[3+i*ClaimReplyFields:3+(i+1)*ClaimReplyFields], again[3+i*ClaimReplyFields:3+(i+1)*ClaimReplyFields]
		for j := 0; j < 6; j++ { // the cancel answer is not read again by a replay
			if f[j] != a[j] {
				t.Errorf("request %d, field %d: first %v, replay %v", i, j, f[j], a[j])
			}
		}
		if want := "n:1:" + strconv.Itoa(i+1); f[0] != want {
			t.Errorf("request %d: owner token %v, want %s", i, f[0], want)
		}
		dl, _ := strconv.ParseFloat(deadlines[i], 64)
		capMS := math.Floor((dl + 300) * 1000)
		if got := float64(f[5].(int64)); got != capMS {
			t.Errorf("request %d: cap %v ms, want %v", i, got, capMS)
		}
		wantD := int64(1)
		if i == 4 {
			wantD = 3
		}
		if f[2] != wantD {
			t.Errorf("request %d: deliveries %v, want %d", i, f[2], wantD)
		}
		exp := math.Ceil((nowMS + 60000) / 1000)
		if exp*1000 > capMS {
			exp = capMS / 1000
		}
		if got := c.ZScore(ctx, q.ClaimsIdx, f[4].(string)).Val(); got != exp {
			t.Errorf("request %d: lease expiry %v, want %v", i, got, exp)
		}
	}
}
