package upstream

import (
	"context"
	"fmt"
	"sync"
	"testing"

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
