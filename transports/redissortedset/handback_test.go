package redissortedset_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// refuseScripts makes Redis refuse every script call (EVAL, EVALSHA) of
// the default user, as a failing server would, or allows them again.
func refuseScripts(t *testing.T, c *redis.Client, refuse bool) {
	t.Helper()
	rule := "+@all"
	if refuse {
		rule = "-@scripting"
	}
	if err := c.Do(context.Background(), "ACL", "SETUSER", "default", rule).Err(); err != nil {
		t.Fatalf("ACL SETUSER default %s: %v", rule, err)
	}
}

const handBackGaveUp = "hand-back failed; the lease will expire"

// TestHandBackRetried: a nacked request whose hand-back Redis refuses is
// handed back again with backoff (50, 100, 200, 400 ms after the first
// try). A refusal that clears meanwhile returns the request to its queue
// long before its lease would; one that lasts ends the retries after the
// fifth try, with a warning, leaving the request to its lease's expiry.
func TestHandBackRetried(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx := context.Background()

	// run delivers a request of queue name and nacks it while Redis
	// refuses scripts, for refuseFor (0: until the test allows them).
	run := func(t *testing.T, name string, leaseMS int, refuseFor time.Duration) (*sub, *testenv.Buffer, transport.Queue) {
		q := queueOf(name)
		if err := p.Enqueue(ctx, q.Name, request(name+"-1", "", time.Hour, nil)); err != nil {
			t.Fatal(err)
		}
		logs := &testenv.Buffer{}
		tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}, LeaseMS: leaseMS, ReclaimIntervalMS: 100},
			slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tp.Close() })
		s := subscribe(t, tp, q, 1)
		t.Cleanup(s.close)
		m := s.next(5 * time.Second)
		refuseScripts(t, admin, true)
		t.Cleanup(func() { refuseScripts(t, admin, false) })
		if refuseFor > 0 {
			allow := time.AfterFunc(refuseFor, func() { _ = admin.Do(ctx, "ACL", "SETUSER", "default", "+@all").Err() })
			t.Cleanup(func() { allow.Stop() })
		}
		transport.Nack(m)
		return s, logs, q
	}

	t.Run("refusal clears", func(t *testing.T) {
		s, logs, q := run(t, "handback-clears", 60000, 120*time.Millisecond)
		if n := admin.ZCard(ctx, q.Name).Val(); n != 0 {
			t.Fatalf("%d requests in the queue while Redis refused the hand-back", n)
		}
		m := s.next(5 * time.Second) // handed back and claimed again: the lease has a minute left
		if id := idOf(t, m); id != "handback-clears-1" {
			t.Fatalf("delivered %s", id)
		}
		if strings.Contains(logs.String(), handBackGaveUp) {
			t.Fatal("the hand-back was given up although Redis took it within its retries")
		}
		s.answer(m)
	})

	t.Run("refusal lasts", func(t *testing.T) {
		start := time.Now()
		s, logs, q := run(t, "handback-lasts", 3000, 0)
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(logs.String(), handBackGaveUp) {
			if time.Now().After(deadline) {
				t.Fatal("the hand-back was not given up 10 s after the nack")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if took := time.Since(start); took < 750*time.Millisecond {
			t.Fatalf("gave up after %s, before its four waits (750 ms) ran", took)
		}
		if n := admin.ZCard(ctx, q.Name).Val(); n != 0 {
			t.Fatalf("%d requests in the queue after the hand-back was given up", n)
		}
		refuseScripts(t, admin, false)
		m := s.next(10 * time.Second) // the lease expired: reclaimed
		if id := idOf(t, m); id != "handback-lasts-1" {
			t.Fatalf("delivered %s", id)
		}
		s.answer(m)
	})
}
