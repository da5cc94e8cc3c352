package keys

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/testenv"
)

// TestLeaseScores checks the expiries the claim and the renewal write into
// Q:claims-idx: a lease of WholeSecondLeaseMS or more (the default 15 s
// among them) in whole seconds, rounded up, never past the deadline bound;
// a shorter one in milliseconds.
func TestLeaseScores(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	now := func() float64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return float64(tm.UnixMicro()) / 1e6
	}
	// An envelope with a request token and a deadline dl (Unix s).
	envelope := func(id string, dl float64) string {
		return fmt.Sprintf(`{"data":{"id":%q,"deadline":%s},"internal":{"request_token":"t-%s"}}`, id, strconv.FormatFloat(dl, 'f', 3, 64), id)
	}
	for _, tc := range []struct {
		name    string
		leaseMS int
		// deadline after now, s: the lease is capped at deadline + 5 min
		deadline float64
		whole    bool // written in whole seconds (sluice's default lease_ms, 15 s, is)
	}{
		{"default lease", 15000, 3600, true},
		{"short lease", 2000, 3600, false},
		{"bound by the deadline", 15000, -300 + 10.5, true}, // cap = now + 10.5 s, under now + 15 s
		{"rounding may pass the bound", 15000, -300 + 15.2, true},
		{"rounding may pass the bound, short lease", 2000, -300 + 2.1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.FlushDB(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			q := Names{}.Queue("llm-d-async:requests:lease")
			t0 := now()
			dl := t0 + tc.deadline
			if err := c.ZAdd(ctx, q.Name, redisZ(1, envelope("a", dl))).Err(); err != nil {
				t.Fatal(err)
			}
			ks := []string{q.Name, q.Claimed, q.Owners, q.ClaimsIdx, q.Redeliveries, q.Delayed, q.ClaimCalls + "x:1", Names{}.CancelEpoch()}
			raw, err := Claim.Run(ctx, c, ks, 1, tc.leaseMS, "x:1:", q.JobPrefix).Slice()
			if err != nil || len(raw) != 3+ClaimReplyFields {
				t.Fatalf("claim: %v, %v", raw, err)
			}
			tok, ck, capMS := raw[3].(string), raw[7].(string), raw[8].(int64)
			check := func(what string, from float64) {
				t.Helper()
				sc, err := c.ZScore(ctx, q.ClaimsIdx, ck).Result()
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				want := math.Min(from+float64(tc.leaseMS)/1000, float64(capMS)/1000)
				bound := float64(capMS) / 1000
				if sc > bound+1e-6 {
					t.Errorf("%s: expiry %.3f past the deadline bound %.3f", what, sc, bound)
				}
				if !tc.whole {
					if math.Abs(sc-want) > 0.2 {
						t.Errorf("%s: expiry %.3f, want %.3f (milliseconds kept)", what, sc, want)
					}
					return
				}
				if sc < want-0.01 || sc > want+1.2 {
					t.Errorf("%s: expiry %.3f, want %.3f rounded up", what, sc, want)
				}
				if sc != math.Trunc(sc) && math.Abs(sc-bound) > 1e-6 {
					t.Errorf("%s: expiry %.3f is neither a whole second nor the deadline bound %.3f", what, sc, bound)
				}
			}
			check("claim", t0)
			time.Sleep(20 * time.Millisecond)
			t1 := now()
			lost, err := Extend.Run(ctx, c, []string{q.Owners, q.ClaimsIdx}, tc.leaseMS, tok, ck, capMS, "nobody", "gone", 0).StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			if len(lost) != 1 || lost[0] != "nobody" {
				t.Errorf("extend reported lost %v, want [nobody]", lost)
			}
			check("renewal", t1)
		})
	}
}

// TestSettleBatched checks the settle's batched writes: a claim given twice
// in one call is settled once (the repeat counted late), a stale owner
// writes nothing, and upstream's markers are deleted only while they hold
// the request's token.
func TestSettleBatched(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	q := Names{}.Queue("llm-d-async:requests:settle")
	res, dead := "llm-d-async:results:settle", q.Dead
	for _, ck := range []string{"a", "b", "c"} {
		c.HSet(ctx, q.Claimed, ck, "m-"+ck)
		c.HSet(ctx, q.Owners, ck, "o-"+ck)
		c.ZAdd(ctx, q.ClaimsIdx, redisZ(1e10, ck))
	}
	c.Set(ctx, ActivePrefix+"a", "ta", 0)
	c.Set(ctx, CancelPrefix+"a", "other", 0) // a newer enqueue's: kept
	c.Set(ctx, ActivePrefix+"b", "tb", 0)
	c.HSet(ctx, CancelPrefix+"b", "f", "v") // another type: read as no marker
	c.Set(ctx, PayloadPrefix+"a:ta", "p", 0)
	item := func(mode, tok, ck, result, id, rt, payload string) []any {
		return []any{mode, tok, ck, result, "dead-" + ck, id, rt, payload, 0}
	}
	var args []any
	args = append(args, item("r", "o-a", "a", "res-a", "a", "ta", PayloadPrefix+"a:ta")...)
	args = append(args, item("r", "o-a", "a", "res-a-again", "a", "ta", "")...) // repeated: late
	args = append(args, item("r", "o-b", "b", "res-b", "b", "tb", "")...)
	args = append(args, item("d", "o-x", "c", "", "c", "", "")...) // stale owner: late
	out, err := Settle.Run(ctx, c, []string{q.Claimed, q.Owners, q.ClaimsIdx, res, dead, q.Stats, q.Redeliveries}, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(out) != "[1 0 1 0]" {
		t.Errorf("statuses %v, want [1 0 1 0]", out)
	}
	if got := c.LRange(ctx, res, 0, -1).Val(); fmt.Sprint(got) != "[res-b res-a]" {
		t.Errorf("results %v, want [res-b res-a]", got)
	}
	if n := c.LLen(ctx, dead).Val(); n != 0 {
		t.Errorf("%d dead letters, want 0 (c's owner is stale)", n)
	}
	for _, k := range []string{ActivePrefix + "a", ActivePrefix + "b", PayloadPrefix + "a:ta"} {
		if c.Exists(ctx, k).Val() != 0 {
			t.Errorf("%s kept, want deleted", k)
		}
	}
	for _, k := range []string{CancelPrefix + "a", CancelPrefix + "b"} {
		if c.Exists(ctx, k).Val() != 1 {
			t.Errorf("%s deleted, want kept (another token, another type)", k)
		}
	}
	if c.HExists(ctx, q.Owners, "c").Val() != true || c.HLen(ctx, q.Claimed).Val() != 1 || c.ZCard(ctx, q.ClaimsIdx).Val() != 1 {
		t.Errorf("claims left: owners %v, claimed %d, idx %d; want c's alone", c.HKeys(ctx, q.Owners).Val(), c.HLen(ctx, q.Claimed).Val(), c.ZCard(ctx, q.ClaimsIdx).Val())
	}
	if n, _ := c.HGet(ctx, q.Stats, "late_results").Int(); n != 2 {
		t.Errorf("late_results %d, want 2", n)
	}
}
