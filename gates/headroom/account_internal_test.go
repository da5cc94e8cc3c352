package headroom

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The replicas' parts of a limit add up to it exactly, whatever each
// holds, when they see one another as they are: an excess is taken back
// once between them (each part within what that replica holds), a room
// is handed out once (each part at least what that replica holds).
func TestShareAddsUp(t *testing.T) {
	for _, holds := range [][]int{{0}, {5}, {12, 4}, {0, 0}, {3, 0, 2}, {1, 1, 1}, {7, 2, 9, 0}} {
		total := 0
		for _, h := range holds {
			total += h
		}
		for allowed := 0; allowed <= total+7; allowed++ {
			sum := 0
			for k, own := range holds {
				p := Peers{Replicas: len(holds) - 1, Rank: k, InFlight: []int{total - own}, Below: []int{0}}
				for _, h := range holds[:k] {
					p.Below[0] += h
				}
				limit := share(allowed, own, p, 0)
				switch {
				case allowed < total && (limit < 0 || limit > own):
					t.Errorf("holds %v allowed %d: replica %d's limit %d outside [0, %d]", holds, allowed, k, limit, own)
				case allowed >= total && limit < own:
					t.Errorf("holds %v allowed %d: replica %d's limit %d below what it holds (%d)", holds, allowed, k, limit, own)
				}
				sum += limit
			}
			if sum != allowed {
				t.Errorf("holds %v allowed %d: the replicas' limits add up to %d", holds, allowed, sum)
			}
		}
	}
	// alone (no account): the limit is the rule's
	if got := share(3, 8, Peers{}, 0); got != 3 {
		t.Errorf("share alone = %d, want 3", got)
	}
}

// The replicas' order rotates: each replica is in turn first and last,
// and what it is told the replicas before it hold follows its place.
func TestAccountOrderRotates(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	acct := func(id string) *redisAccount {
		a, err := newRedisAccount(AccountConfig{Redis: redisconn.Config{Address: r.Addr}, Key: "k", Replica: id, TTL: time.Second}, 20*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	a, b := acct("a"), acct("b")
	ctx := context.Background()
	seen := map[int]bool{}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(seen) < 2; time.Sleep(7 * time.Millisecond) {
		if _, err := b.Exchange(ctx, []int{5}, nil); err != nil {
			t.Fatal(err)
		}
		p, err := a.Exchange(ctx, []int{3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.Replicas != 1 || p.InFlight[0] != 5 || p.Below[0] != 5*p.Rank {
			t.Fatalf("a was told %+v, want 1 other replica holding 5, all of it before a when a is second", p)
		}
		seen[p.Rank] = true
	}
	if !seen[0] || !seen[1] {
		t.Errorf("a's places %v, want both 0 and 1 within 2s at a turn of 20ms", seen)
	}
}

// A rise of others that the other replicas' fresh calls could explain
// counts from the next reading on, a larger one less that much at once,
// a fall at once; alone (or without an account) every rise counts at
// once.
func TestConfirmedOthers(t *testing.T) {
	s := &sharing{fresh: 1}
	two := Peers{Replicas: 2}
	for k, c := range []struct {
		raw  int
		p    Peers
		want int
	}{
		{5, two, 5}, // the first reading counts as read
		{7, two, 5}, // two peers: a rise of 2 waits
		{7, two, 7}, // and counts once it stays
		{10, two, 8},
		{3, two, 3}, // a fall counts at once
		{4, Peers{}, 4},
		{6, Peers{Replicas: 1}, 5},
		{5, Peers{Replicas: 1}, 5},
	} {
		if got := s.confirmed(0, c.raw, c.p); got != c.want {
			t.Errorf("reading %d: others %d with %d other replicas counted as %d, want %d", k, c.raw, c.p.Replicas, got, c.want)
		}
	}
	var none *sharing
	if got := none.confirmed(0, 9, two); got != 9 {
		t.Errorf("without an account: %d, want 9", got)
	}
}
