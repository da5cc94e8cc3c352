package redisstream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redisstream"
	"github.com/sluice-io/sluice/transports/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newTransport(t testing.TB, o redisstream.Options) *redisstream.Transport {
	t.Helper()
	tp, err := redisstream.New(o, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func xadd(t testing.TB, rc *redis.Client, stream string, payload []byte) {
	t.Helper()
	if err := rc.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"payload", payload}}).Err(); err != nil {
		t.Fatalf("XADD %s: %v", stream, err)
	}
}

func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	var seq atomic.Int64
	transporttest.Run(t, transporttest.Harness{
		Features: transporttest.Features{
			Ordering:            transporttest.FIFO,
			AtLeastOnce:         true,
			DelayedRequeue:      true,
			Results:             true,
			Reopen:              true,
			ConcurrentConsumers: true,
		},
		New: func(t testing.TB) transport.Transport {
			return newTransport(t, redisstream.Options{Server: redisstream.Server{URL: r.URL}, BlockMS: 50, RetryPollIntervalMS: 20})
		},
		Queue: func(testing.TB) transport.Queue {
			n := seq.Add(1)
			return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("requests-", n), ResultName: fmt.Sprint("results-", n)}
		},
		Publish: func(t testing.TB, q transport.Queue, payload []byte) { xadd(t, rc, q.Name, payload) },
		Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			var out [][]byte
			deadline := time.Now().Add(timeout)
			for len(out) < n && time.Now().Before(deadline) {
				v, err := rc.BRPop(context.Background(), time.Second, q.ResultName).Result()
				if err == redis.Nil {
					continue
				}
				if err != nil {
					t.Fatalf("BRPOP: %v", err)
				}
				out = append(out, []byte(v[1]))
			}
			return out
		},
	})
}

func TestOptions(t *testing.T) {
	tests := []struct{ name, options, wantErr string }{
		{"empty", ``, ""},
		{"stream results", `{"result_mode":"stream","consumer_group":"g"}`, ""},
		{"unknown", `{"group":"g"}`, "unknown field"},
		{"heartbeat not below claim idle", `{"claim_idle_ms":1000,"heartbeat_ms":1000}`, "heartbeat_ms"},
		{"bad mode", `{"result_mode":"channel"}`, "result_mode"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := redisstream.Factory(json.RawMessage(tc.options), transport.Env{RedisURL: "redis://127.0.0.1:1/0"})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				_ = tp.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

type consumer struct {
	ch     <-chan *message.Message
	sub    message.Subscriber
	cancel context.CancelFunc
}

func subscribe(t testing.TB, tp transport.Transport, q transport.Queue) *consumer {
	t.Helper()
	credits := credit.NewPool(8, credit.Ramp{})
	credits.SetBudget(1)
	sub, err := transport.NewSubscriber(tp, q, credits, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, q.Name)
	if err != nil {
		t.Fatal(err)
	}
	return &consumer{ch: ch, sub: sub, cancel: cancel}
}

func (c *consumer) close() { c.cancel(); _ = c.sub.Close() }

func next(ch <-chan *message.Message, d time.Duration) *message.Message {
	select {
	case m := <-ch:
		return m
	case <-time.After(d):
		return nil
	}
}

// TestLongRequestNotClaimedTwice: a request running far longer than the
// claim idle time stays with its consumer; another consumer never gets it.
func TestLongRequestNotClaimedTwice(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	o := redisstream.Options{Server: redisstream.Server{URL: r.URL}, ClaimIdleMS: 300, HeartbeatMS: 50, BlockMS: 50}
	q := transport.Queue{ID: "q", Name: "requests", ResultName: "results"}
	a := newTransport(t, o)
	defer a.Close()
	b := newTransport(t, o)
	defer b.Close()
	ca := subscribe(t, a, q)
	defer ca.close()
	xadd(t, rc, q.Name, transporttest.Request("long", time.Hour))
	m := next(ca.ch, 5*time.Second)
	if m == nil {
		t.Fatal("no delivery")
	}
	cb := subscribe(t, b, q)
	defer cb.close()
	if stolen := next(cb.ch, 1500*time.Millisecond); stolen != nil {
		t.Fatalf("the running request was claimed by a second consumer: %s", stolen.Payload)
	}
	pub, _ := a.Publisher(q)
	res := wire.ErrorResult(&wire.Request{ID: "long"}, wire.CodeNone, "")
	out := message.NewMessage(m.UUID, res.Marshal())
	out.Metadata = m.Metadata
	if err := pub.Publish(q.ResultName, out); err != nil {
		t.Fatal(err)
	}
	transport.Ack(m)
	if n := rc.LLen(context.Background(), q.ResultName).Val(); n != 1 {
		t.Fatalf("%d results, want 1", n)
	}
	if st := a.Stats(); st.Stale != 0 {
		t.Fatalf("stats %+v: no write should have been refused", st)
	}
	time.Sleep(100 * time.Millisecond)
	if p := rc.XPending(context.Background(), q.Name, "sluice").Val(); p.Count != 0 {
		t.Fatalf("%d entries still pending after the fenced result", p.Count)
	}
}

// TestTakeOverAndFence: the entry of a dead consumer is taken over after the
// claim idle time, and the dead consumer's late result is refused.
func TestTakeOverAndFence(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	q := transport.Queue{ID: "q", Name: "requests", ResultName: "results"}
	// "Dead" consumer: heartbeat far slower than the claim idle time of the others.
	dead := newTransport(t, redisstream.Options{Server: redisstream.Server{URL: r.URL}, Consumer: "dead", ClaimIdleMS: 600000, HeartbeatMS: 300000, BlockMS: 50})
	defer dead.Close()
	cd := subscribe(t, dead, q)
	xadd(t, rc, q.Name, transporttest.Request("t1", time.Hour))
	m := next(cd.ch, 5*time.Second)
	if m == nil {
		t.Fatal("no delivery")
	}
	alive := newTransport(t, redisstream.Options{Server: redisstream.Server{URL: r.URL}, Consumer: "alive", ClaimIdleMS: 200, HeartbeatMS: 50, BlockMS: 50})
	defer alive.Close()
	ca := subscribe(t, alive, q)
	defer ca.close()
	m2 := next(ca.ch, 5*time.Second)
	if m2 == nil {
		t.Fatal("the dead consumer's entry was not taken over")
	}
	// The dead consumer wakes up and writes its result: refused.
	pub, _ := dead.Publisher(q)
	out := message.NewMessage(m.UUID, []byte(`{"id":"t1","payload":"late"}`))
	out.Metadata = m.Metadata
	if err := pub.Publish(q.ResultName, out); err != nil {
		t.Fatal(err)
	}
	if st := dead.Stats(); st.Stale != 1 {
		t.Fatalf("dead consumer stats %+v: want its late write refused", st)
	}
	transport.Ack(m)
	if st := dead.Stats(); st.Stale != 2 {
		t.Fatalf("dead consumer stats %+v: want its late ack refused too", st)
	}
	if n := rc.LLen(context.Background(), q.ResultName).Val(); n != 0 {
		t.Fatalf("%d results written by a consumer that lost the entry", n)
	}
	if st := alive.Stats(); st.Reclaimed != 1 {
		t.Fatalf("alive stats %+v: want 1 reclaimed", st)
	}
	transport.Ack(m2)
	cd.close()
}

// TestWindowedReads: with a slow handler, throughput is not one per latency.
func TestWindowedReads(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	tp := newTransport(t, redisstream.Options{Server: redisstream.Server{URL: r.URL}, BlockMS: 50})
	defer tp.Close()
	q := transport.Queue{ID: "q", Name: "requests", ResultName: "results"}
	for i := range 8 {
		xadd(t, rc, q.Name, transporttest.Request(fmt.Sprint("w", i), time.Hour))
	}
	c := subscribe(t, tp, q) // 8 credits
	defer c.close()
	var held []*message.Message
	for range 8 {
		m := next(c.ch, 5*time.Second)
		if m == nil {
			t.Fatalf("only %d deliveries outstanding at once, want 8 (one window)", len(held))
		}
		held = append(held, m)
	}
	for _, m := range held {
		transport.Ack(m)
	}
}

// TestDeadLetter moves an entry to <stream>:dead with its reason.
func TestDeadLetter(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	tp := newTransport(t, redisstream.Options{Server: redisstream.Server{URL: r.URL}, BlockMS: 50})
	defer tp.Close()
	q := transport.Queue{ID: "q", Name: "requests", ResultName: "results"}
	xadd(t, rc, q.Name, []byte("not json"))
	c := subscribe(t, tp, q)
	defer c.close()
	m := next(c.ch, 5*time.Second)
	if m == nil {
		t.Fatal("no delivery")
	}
	if err := tp.DeadLetter(context.Background(), q, m, "no id"); err != nil {
		t.Fatal(err)
	}
	transport.Ack(m)
	d, err := tp.Depth(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if d.DeadLettered != 1 {
		t.Fatalf("depth %+v: want 1 dead letter", d)
	}
}
