package redissortedset_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The async-broker's passthrough mode counts a tenant's live calls on the
// counter the dispatcher's redis-quota gate uses (CLIENTS.md §1): key
// quota:userid:<tenant>, acquire = GET, then INCR and EXPIRE 300 when under
// the limit; release = DECR, refreshing the TTL while above 0. Queued and
// live traffic share one account only if sluice's gate keeps that key and
// those semantics beside the broker's bare commands.

// brokerQuota is the broker's passthrough quota on one tenant key.
type brokerQuota struct {
	c     redis.UniversalClient
	key   string
	limit int64
}

func (b brokerQuota) acquire(ctx context.Context) (bool, error) {
	v, err := b.c.Get(ctx, b.key).Int64()
	if err != nil && err != redis.Nil {
		return false, err
	}
	if v >= b.limit {
		return false, nil
	}
	if err := b.c.Incr(ctx, b.key).Err(); err != nil {
		return false, err
	}
	return true, b.c.Expire(ctx, b.key, 300*time.Second).Err()
}

func (b brokerQuota) release(ctx context.Context) error {
	n, err := b.c.Decr(ctx, b.key).Result()
	if err != nil {
		return err
	}
	if n > 0 {
		return b.c.Expire(ctx, b.key, 300*time.Second).Err()
	}
	return nil
}

func TestClientAsyncBrokerQuota(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	const limit = 4
	g, err := redisquota.NewFactory()(gate.NewParams(map[string]string{"address": r.URL, "mode": "concurrency",
		"limit": fmt.Sprint(limit), "window": "300s"}), gate.Env{})
	if err != nil {
		t.Fatal(err)
	}
	q := g.(*redisquota.Gate)
	t.Cleanup(func() { _ = q.Close() })
	b := brokerQuota{c: c, key: "quota:userid:acme", limit: limit}
	if k := q.Key("acme"); k != b.key {
		t.Fatalf("sluice's tenant key %q, the broker's %q", k, b.key)
	}
	admit := func() (gate.Decision, bool) {
		t.Helper()
		req := &wire.Request{ID: "x", Deadline: time.Now().Add(time.Minute), Metadata: map[string]string{"userid": "acme"}}
		d, err := q.Admit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return d, d.Verdict == gate.Admit
	}
	count := func() int64 {
		t.Helper()
		v, err := c.Get(ctx, b.key).Int64()
		if err == redis.Nil {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// settled waits for the releases sent (they go out in the gate's
	// pipeline, after Release returns) and returns the counter.
	settled := func(want int64) int64 {
		t.Helper()
		end := time.Now().Add(2 * time.Second)
		for count() != want && time.Now().Before(end) {
			time.Sleep(5 * time.Millisecond)
		}
		return count()
	}
	brokerAcquire := func(want bool) {
		t.Helper()
		ok, err := b.acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok != want {
			t.Fatalf("broker acquire at %d: %v, want %v", count(), ok, want)
		}
	}
	// The broker's live calls count against sluice's admissions...
	for range 3 {
		brokerAcquire(true)
	}
	var held []gate.Decision
	if d, ok := admit(); !ok {
		t.Fatalf("sluice refused at 3 of %d", limit)
	} else {
		held = append(held, d)
	}
	if _, ok := admit(); ok {
		t.Fatalf("sluice admitted with the counter at %d of %d", count()-1, limit)
	}
	// ...and sluice's admissions against the broker's.
	brokerAcquire(false)
	for range 3 {
		if err := b.release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		d, ok := admit()
		if !ok {
			t.Fatalf("sluice refused at %d of %d", count(), limit)
		}
		held = append(held, d)
	}
	if _, ok := admit(); ok {
		t.Fatal("sluice admitted a fifth")
	}
	brokerAcquire(false)
	// sluice's requests end: its slots come back, no more, no fewer.
	for _, d := range held {
		d.Release()
	}
	if n := settled(0); n != 0 {
		t.Fatalf("counter %d after sluice released its %d", n, len(held))
	}
	for range limit {
		brokerAcquire(true)
	}
	brokerAcquire(false)
	for range limit {
		if err := b.release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Both writers at once: the counter never goes below 0, sluice never
	// holds more than the limit, and when everybody is done it is 0.
	var sluiceHeld, brokerHeld, maxTotal atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				req := &wire.Request{ID: "y", Deadline: time.Now().Add(time.Minute), Metadata: map[string]string{"userid": "acme"}}
				d, err := q.Admit(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Verdict != gate.Admit {
					time.Sleep(time.Millisecond)
					continue
				}
				n := sluiceHeld.Add(1)
				if n > limit {
					t.Errorf("sluice holds %d of %d", n, limit)
				}
				time.Sleep(time.Millisecond)
				sluiceHeld.Add(-1)
				d.Release()
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 150; i++ {
				ok, err := b.acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if !ok {
					time.Sleep(time.Millisecond)
					continue
				}
				brokerHeld.Add(1)
				time.Sleep(time.Millisecond)
				brokerHeld.Add(-1)
				if err := b.release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(500 * time.Microsecond):
			}
			v, err := c.Get(ctx, b.key).Int64()
			if err == nil && v < 0 {
				t.Errorf("counter %d", v)
			}
			if s := sluiceHeld.Load() + brokerHeld.Load(); s > maxTotal.Load() {
				maxTotal.Store(s)
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-sampled
	if n := settled(0); n != 0 {
		t.Errorf("counter %d after both writers finished: leaked or stolen", n)
	}
	if n := c.ZCard(ctx, q.LeaseSetKey("acme")).Val(); n != 0 {
		t.Errorf("%d leases left", n)
	}
	t.Logf("both writers: at most %d slots held at once (limit %d; the broker's GET-then-INCR may overshoot by its own race)", maxTotal.Load(), limit)
}
