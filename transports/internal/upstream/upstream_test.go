package upstream

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
)

// TestCancelReader: the batched reader answers each check as the lone GET
// does, also when many checks are in one read, and reports Redis down to
// every check waiting.
func TestCancelReader(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	r := NewCancelReader(c)
	const n = 600 // more than one batch
	for i := 0; i < n; i += 3 {
		if err := mr.Set(CancelKey(fmt.Sprint("r", i)), fmt.Sprint("tok-", i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := fmt.Sprint("tok-", i)
			if i%6 == 3 {
				tok = "older" // cancelled under another enqueue's token
			}
			got, err := r.Cancelled(ctx, &wire.Request{ID: fmt.Sprint("r", i), Token: tok})
			if want := i%6 == 0; err != nil || got != want {
				errs <- fmt.Errorf("r%d: %v %v, want %v", i, got, err, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, err := r.Cancelled(ctx, &wire.Request{ID: "r0"}); got || err != nil {
		t.Errorf("no token: %v %v", got, err)
	}
	mr.Close()
	if _, err := r.Cancelled(ctx, &wire.Request{ID: "r0", Token: "tok-0"}); err == nil {
		t.Error("no error with Redis down")
	}
}

// TestCancelReaderClaimed: the answer a claim read stands in for the first
// check of that enqueue within one claim round trip of the answer (no round
// trip: Redis is down here), and only for that one; a later check, an
// answer older than its claim's round trip, or another token reads the
// marker.
func TestCancelReaderClaimed(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	r := NewCancelReader(c)
	now := time.Now()
	const rtt = time.Minute // the checks below come well within it
	r.Claimed("a", "tok-a", true, now.Add(-rtt), now)
	r.Claimed("b", "tok-b", false, now.Add(-rtt), now)
	// A claim answered 2 ms ago after a 1-ms round trip: a check now is
	// later than one claim round trip after it.
	r.Claimed("old", "tok-old", false, now.Add(-3*time.Millisecond), now.Add(-2*time.Millisecond))
	mr.Close() // every check below that reads Redis fails
	if got, err := r.Cancelled(ctx, &wire.Request{ID: "a", Token: "tok-a"}); !got || err != nil {
		t.Errorf("a: %v %v, want the claim's answer (cancelled)", got, err)
	}
	if got, err := r.Cancelled(ctx, &wire.Request{ID: "b", Token: "tok-b"}); got || err != nil {
		t.Errorf("b: %v %v, want the claim's answer (not cancelled)", got, err)
	}
	for _, req := range []*wire.Request{
		{ID: "a", Token: "tok-a"},     // its answer was taken
		{ID: "old", Token: "tok-old"}, // answered more than its round trip ago
		{ID: "b", Token: "tok-other"}, // another enqueue of b
	} {
		if _, err := r.Cancelled(ctx, req); err == nil {
			t.Errorf("%s/%s: answered without reading the marker", req.ID, req.Token)
		}
	}
}
