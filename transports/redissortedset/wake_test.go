package redissortedset_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// TestIdleWaitWakeUps checks how an idle claim loop learns of new work: a
// request written by the producer library, or by a plain ZADD on a server
// publishing keyspace events, ends an idle wait of 10 s at once (well within
// 2 s); a plain ZADD without keyspace events does not, and is found by the
// idle poll instead.
func TestIdleWaitWakeUps(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx := context.Background()
	enqueue := func(q string, req *wire.Request) error { return p.Enqueue(ctx, q, req) }
	zadd := func(q string, req *wire.Request) error {
		b, err := wire.EncodeRequest(req)
		if err != nil {
			return err
		}
		return c.Do(ctx, "ZADD", q, rss.Score(req.Deadline), b).Err()
	}
	for i, tc := range []struct {
		name    string
		events  string // notify-keyspace-events
		idle    time.Duration
		write   func(q string, req *wire.Request) error
		woken   bool // the wait ends well before idle
		claimed bool // the request is claimed after the wait
	}{
		{"producer library", "", 10 * time.Second, enqueue, true, true},
		{"plain ZADD, keyspace events", "Kz", 10 * time.Second, zadd, true, true},
		{"plain ZADD, all keyspace events", "KA", 10 * time.Second, zadd, true, true},
		{"plain ZADD, no keyspace events", "", 10 * time.Second, zadd, false, false},
		{"plain ZADD, no keyspace events, short poll", "", 300 * time.Millisecond, zadd, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.ConfigSet(ctx, "notify-keyspace-events", tc.events).Err(); err != nil {
				t.Fatal(err)
			}
			q := rss.RequestQueueName("wake-" + strconv.Itoa(i))
			poll := int(tc.idle / time.Millisecond)
			tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}, PollIntervalMS: poll}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tp.Close() })
			src, err := tp.Source(transport.Queue{Name: q, ResultName: q + ":results"})
			if err != nil {
				t.Fatal(err)
			}
			sctx, cancel := context.WithCancel(ctx)
			defer func() {
				cancel()
				_ = src.Close()
			}()
			if err := src.Open(sctx); err != nil {
				t.Fatal(err)
			}
			waitSubscribed(t, c, q+":notify", "__keyspace@0__:"+q)
			if ms, err := src.Claim(sctx, 8); err != nil || len(ms) != 0 {
				t.Fatalf("claim on an empty queue: %d, %v", len(ms), err)
			}
			rss.SetIdleWait(src, tc.idle)
			woke := make(chan time.Duration, 1)
			go func() {
				start := time.Now()
				src.Wait(sctx)
				woke <- time.Since(start)
			}()
			time.Sleep(50 * time.Millisecond) // let Wait start waiting
			req := &wire.Request{ID: "w-" + strconv.Itoa(i), Deadline: time.Now().Add(time.Hour), Payload: json.RawMessage(`{}`)}
			if err := tc.write(q, req); err != nil {
				t.Fatal(err)
			}
			bound := 2 * time.Second
			if !tc.woken {
				bound = 500 * time.Millisecond
			}
			select {
			case d := <-woke:
				if !tc.woken {
					t.Fatalf("the wait ended after %s: nothing should wake it", d)
				}
			case <-time.After(bound):
				if tc.woken {
					t.Fatalf("the wait did not end within %s of the write (idle wait %s): no wake-up", bound, tc.idle)
				}
				return
			}
			ms, err := src.Claim(sctx, 8)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(ms); got != 1 || ms[0].Payload == nil {
				t.Fatalf("claimed %d requests after the wait, want 1", got)
			}
			src.HandBack(ms)
		})
	}
}

// waitSubscribed waits until each channel has a subscriber, so that a write
// made afterwards is heard.
func waitSubscribed(t *testing.T, c redis.UniversalClient, channels ...string) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for {
		n, err := c.PubSubNumSub(context.Background(), channels...).Result()
		if err != nil {
			t.Fatal(err)
		}
		all := true
		for _, ch := range channels {
			all = all && n[ch] > 0
		}
		if all {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("no subscriber on %v after 5s: %v", channels, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWakeHeardBeforeClaimDropped checks that a wake-up heard before a
// claim, announcing the work that claim takes, does not also end the wait
// after it: the loop would otherwise make an empty claim (a wasted round
// trip, which requests written meanwhile wait behind) after every claim a
// producer's notify overtook.
func TestWakeHeardBeforeClaimDropped(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q := rss.RequestQueueName("stale-wake")
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	src, err := tp.Source(transport.Queue{Name: q, ResultName: q + ":results"})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = src.Close()
	}()
	waitSubscribed(t, c, q+":notify")
	req := &wire.Request{ID: "s-1", Deadline: time.Now().Add(time.Hour), Payload: json.RawMessage(`{}`)}
	if err := p.Enqueue(ctx, q, req); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); !rss.WakePending(src); {
		if time.Now().After(end) {
			t.Fatal("the producer's notify was not heard within 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	ms, err := src.Claim(ctx, 8)
	if err != nil || len(ms) != 1 {
		t.Fatalf("claimed %d, %v; want the request", len(ms), err)
	}
	if rss.WakePending(src) {
		t.Error("the notify of the request just claimed is still pending: the next Wait would end at once for an empty claim")
	}
	src.HandBack(ms)
}
