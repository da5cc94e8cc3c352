package redispubsub_test

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
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	conformance(t, redispubsub.Options{Server: redispubsub.Server{URL: r.URL}}, testenv.RedisClient(t, r.URL))
}

// TestSentinelOptions: upstream's mode, addrs and master_name are read and
// checked (the sentinel client itself is tested with real sentinels in
// internal/testenv and transports/redissortedset).
func TestSentinelOptions(t *testing.T) {
	if _, err := redispubsub.New(redispubsub.Options{Server: redispubsub.Server{URL: "redis://127.0.0.1:1/0"}, TopologyOptions: redispubsub.TopologyOptions{Mode: "sentinel"}}, transport.Env{}); err == nil || !strings.Contains(err.Error(), "master_name") {
		t.Errorf("sentinel without master_name: %v, want an error naming master_name", err)
	}
	if _, err := redispubsub.New(redispubsub.Options{Server: redispubsub.Server{URL: "redis://127.0.0.1:1/0"}, TopologyOptions: redispubsub.TopologyOptions{Mode: "cluster"}}, transport.Env{}); err == nil || !strings.Contains(err.Error(), "Redis Cluster") {
		t.Errorf("mode cluster: %v, want the Redis Cluster refusal", err)
	}
	tp, err := redispubsub.New(redispubsub.Options{Server: redispubsub.Server{URL: "redis://127.0.0.1:1/0"}},
		transport.Env{RedisMode: "sentinel", RedisAddrs: []string{"127.0.0.1:2"}, RedisMasterName: "m"})
	if err != nil {
		t.Fatalf("the deployment's sentinel topology: %v", err)
	}
	_ = tp.Close()
}

// conformance runs the shared suite on transports built from base.
func conformance(t *testing.T, base redispubsub.Options, rc *redis.Client) {
	var seq atomic.Int64
	transporttest.Run(t, transporttest.Harness{
		Features: transporttest.Features{
			Ordering:       transporttest.FIFO,
			AtLeastOnce:    true,
			DelayedRequeue: true,
			Results:        true,
			Reopen:         true,
			FanOut:         true,
			SubscribeFirst: true,
		},
		New: func(t testing.TB) transport.Transport {
			o := base
			o.ResultMode, o.RetryPollIntervalMS = redispubsub.ResultList, 20
			tp, err := redispubsub.New(o, transport.Env{})
			if err != nil {
				t.Fatal(err)
			}
			return tp
		},
		Queue: func(testing.TB) transport.Queue {
			n := seq.Add(1)
			return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("request-queue-", n), ResultName: fmt.Sprint("result-list-", n)}
		},
		Publish: func(t testing.TB, q transport.Queue, payload []byte) {
			n, err := rc.Publish(context.Background(), q.Name, payload).Result()
			if err != nil || n == 0 {
				t.Fatalf("PUBLISH %s: heard by %d, err %v", q.Name, n, err)
			}
		},
		Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			return brpop(t, rc, q.ResultName, n, timeout)
		},
	})
}

func brpop(t testing.TB, rc *redis.Client, key string, n int, timeout time.Duration) [][]byte {
	t.Helper()
	var out [][]byte
	deadline := time.Now().Add(timeout)
	for len(out) < n && time.Now().Before(deadline) {
		v, err := rc.BRPop(context.Background(), time.Second, key).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatalf("BRPOP %s: %v", key, err)
		}
		out = append(out, []byte(v[1]))
	}
	return out
}

func TestOptions(t *testing.T) {
	tests := []struct {
		name, options, wantErr string
	}{
		{"empty", ``, ""},
		{"legacy retry queue", `{"retry_queue_name":"retries"}`, ""},
		{"list results", `{"result_mode":"list"}`, ""},
		{"unknown option", `{"retry_queue":"x"}`, "unknown field"},
		{"bad mode", `{"result_mode":"stream"}`, "result_mode"},
		{"bad buffer", `{"buffer_size":-1}`, "buffer_size"},
		{"bad url", `{"url":"http://x"}`, "url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := redispubsub.Factory(json.RawMessage(tc.options), transport.Env{RedisURL: "redis://127.0.0.1:1/0"})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				_ = tp.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				_ = tp.Close()
				t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

// TestObservableLosses: what Redis pub/sub loses is counted.
func TestObservableLosses(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	tp, err := redispubsub.New(redispubsub.Options{Server: redispubsub.Server{URL: r.URL}}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	q := transport.Queue{ID: "q", Name: "request-queue", ResultName: "result-queue"}
	if err := tp.PublishRequest(context.Background(), q, transporttest.Request("lost", time.Hour)); err == nil {
		t.Fatal("PublishRequest with no subscriber: want ErrNoSubscriber")
	}
	pub, _ := tp.Publisher(q)
	if err := pub.Publish(q.ResultName, message.NewMessage("1", []byte(`{"id":"x","payload":""}`))); err != nil {
		t.Fatal(err)
	}
	st := tp.Stats()
	if st.RequestsUnheard != 1 || st.ResultsUnheard != 1 {
		t.Fatalf("stats %+v: want 1 unheard request and 1 unheard result", st)
	}
}

// TestRetryWaitsForASubscriber: a due retry nobody would hear stays in the
// retry set until a subscriber comes.
func TestRetryWaitsForASubscriber(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	rc := testenv.RedisClient(t, r.URL)
	opts := redispubsub.Options{Server: redispubsub.Server{URL: r.URL}, RetryQueueName: "retries", RetryPollIntervalMS: 10}
	tp, err := redispubsub.New(opts, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	q := transport.Queue{ID: "q", Name: "requests", ResultName: "results"}
	other := transport.Queue{ID: "o", Name: "other", ResultName: "results"}
	credits := credit.NewPool(4, credit.Ramp{})
	credits.SetBudget(1)
	sub, _ := transport.NewSubscriber(tp, other, credits, nil) // starts the mover; listens elsewhere
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := sub.Subscribe(ctx, other.Name); err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if err := tp.Requeue(ctx, q, nil, transporttest.Request("r1", time.Hour), time.Now()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := rc.ZCard(ctx, "retries").Val(); n != 1 {
		t.Fatalf("retry set holds %d, want the unheard retry kept", n)
	}
	if tp.Stats().RetriesHeld == 0 {
		t.Fatal("RetriesHeld not counted")
	}
	sub2, _ := transport.NewSubscriber(tp, q, credits, nil)
	ch, err := sub2.Subscribe(ctx, q.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer sub2.Close()
	select {
	case m := <-ch:
		transport.Ack(m)
	case <-time.After(5 * time.Second):
		t.Fatal("the kept retry was not published once a subscriber came")
	}
}
