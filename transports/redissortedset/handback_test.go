package redissortedset_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
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

// refusals counts the commands Redis refused since the last ACL LOG RESET.
func refusals(t *testing.T, c *redis.Client) int {
	t.Helper()
	entries, err := c.Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestHandBackRetried: a nacked request whose hand-back Redis refuses is
// handed back again with backoff (50, 100, 200, 400 ms after the first
// try; the nack returns once it is done). A refusal that clears meanwhile
// returns the request to its queue long before its lease would; one that
// lasts ends the retries after the fifth try, with a warning, leaving the
// request to its lease's expiry.
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

	// deliver delivers a request of queue name, and then has Redis refuse
	// every script until the test allows them again.
	deliver := func(t *testing.T, name string, o rss.Options) (*sub, *message.Message, *testenv.Buffer) {
		q := queueOf(name)
		if err := p.Enqueue(ctx, q.Name, request(name+"-1", "", time.Hour, nil)); err != nil {
			t.Fatal(err)
		}
		logs := &testenv.Buffer{}
		o.URL = r.URL
		tp, err := rss.New(o, slog.New(slog.NewTextHandler(logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tp.Close() })
		s := subscribe(t, tp, q, 1)
		t.Cleanup(s.close)
		m := s.next(5 * time.Second)
		if err := admin.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		refuseScripts(t, admin, true)
		t.Cleanup(func() { refuseScripts(t, admin, false) })
		return s, m, logs
	}

	t.Run("refusal clears", func(t *testing.T) {
		// No reclaimer nor heartbeat runs a script meanwhile: every refusal
		// is a hand-back's.
		s, m, logs := deliver(t, "handback-clears", rss.Options{LeaseMS: 60000, ReclaimIntervalMS: 30000})
		done := make(chan struct{})
		go func() {
			defer close(done)
			transport.Nack(m)
		}()
		for deadline := time.Now().Add(5 * time.Second); refusals(t, admin) == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("Redis refused no hand-back within 5 s of the nack")
			}
		}
		if n := admin.ZCard(ctx, s.q.Name).Val(); n != 0 {
			t.Fatalf("%d requests in the queue while Redis refused the hand-back", n)
		}
		refuseScripts(t, admin, false)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the nack did not return after Redis took scripts again")
		}
		if strings.Contains(logs.String(), handBackGaveUp) {
			t.Fatalf("the hand-back was given up although Redis took it within its retries:\n%s", logs)
		}
		d := s.next(5 * time.Second) // handed back and claimed again: the lease has a minute left
		if id := idOf(t, d); id != "handback-clears-1" {
			t.Fatalf("delivered %s", id)
		}
		s.answer(d)
	})

	t.Run("refusal lasts", func(t *testing.T) {
		s, m, logs := deliver(t, "handback-lasts", rss.Options{LeaseMS: 3000, ReclaimIntervalMS: 100})
		start := time.Now()
		transport.Nack(m)
		if took := time.Since(start); took < 750*time.Millisecond {
			t.Fatalf("gave up after %s, before its four waits (750 ms) ran", took)
		}
		if !strings.Contains(logs.String(), handBackGaveUp) {
			t.Fatalf("no warning for the hand-back given up:\n%s", logs)
		}
		if n := admin.ZCard(ctx, s.q.Name).Val(); n != 0 {
			t.Fatalf("%d requests in the queue after the hand-back was given up", n)
		}
		refuseScripts(t, admin, false)
		d := s.next(10 * time.Second) // the lease expired: reclaimed
		if id := idOf(t, d); id != "handback-lasts-1" {
			t.Fatalf("delivered %s", id)
		}
		s.answer(d)
	})
}
