package gcppubsub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/gcppubsub"
	"github.com/sluice-io/sluice/transports/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The gRPC and OpenCensus machinery of the Pub/Sub client keeps process-wide workers.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		// pubsub/v2 leaves one keep-alive goroutine per finished stream until its ticker fires.
		goleak.IgnoreTopFunction("cloud.google.com/go/pubsub/v2.(*messageIterator).streamKeepAliveHandler"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Client).keepalive"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*controlBuffer).get"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Server).keepalive"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/transport.(*http2Client).reader"),
	)
}

const project = "sluice-test"

// fixture is a Pub/Sub server with an admin client.
type fixture struct {
	addr   string
	client *pubsub.Client
	seq    atomic.Int64
}

func newFixture(t testing.TB, addr string) *fixture {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project, option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &fixture{addr: addr, client: c}
}

func (f *fixture) topic(t testing.TB, id string) string {
	t.Helper()
	name := "projects/" + project + "/topics/" + id
	if _, err := f.client.TopicAdminClient.CreateTopic(context.Background(), &pubsubpb.Topic{Name: name}); err != nil {
		t.Fatalf("create topic %s: %v", id, err)
	}
	return name
}

func (f *fixture) subscription(t testing.TB, id, topic string) {
	t.Helper()
	if _, err := f.client.SubscriptionAdminClient.CreateSubscription(context.Background(), &pubsubpb.Subscription{
		Name: "projects/" + project + "/subscriptions/" + id, Topic: topic, AckDeadlineSeconds: 10,
	}); err != nil {
		t.Fatalf("create subscription %s: %v", id, err)
	}
}

// queue creates a request topic and subscription, a result topic and a
// subscription to read the results.
func (f *fixture) queue(t testing.TB) transport.Queue {
	n := f.seq.Add(1)
	req := f.topic(t, fmt.Sprint("requests-", n))
	f.subscription(t, fmt.Sprint("requests-sub-", n), req)
	res := f.topic(t, fmt.Sprint("results-", n))
	f.subscription(t, fmt.Sprint("results-sub-", n), res)
	return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("requests-sub-", n), ResultName: fmt.Sprint("results-", n)}
}

func (f *fixture) publish(t testing.TB, topic string, data []byte, attrs map[string]string) {
	t.Helper()
	p := f.client.Publisher(topic)
	defer p.Stop()
	if _, err := p.Publish(context.Background(), &pubsub.Message{Data: data, Attributes: attrs}).Get(context.Background()); err != nil {
		t.Fatalf("publish to %s: %v", topic, err)
	}
}

func (f *fixture) results(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var mu sync.Mutex
	var out [][]byte
	sub := f.client.Subscriber("results-sub-" + strings.TrimPrefix(q.ResultName, "results-"))
	err := sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		defer mu.Unlock()
		out = append(out, m.Data)
		if len(out) >= n {
			cancel()
		}
	})
	if err != nil {
		t.Fatalf("receive results: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return out
}

func harness(f *fixture) transporttest.Harness {
	return transporttest.Harness{
		Features: transporttest.Features{
			AtLeastOnce:         true,
			DelayedRequeue:      true,
			Results:             true,
			Reopen:              true,
			ConcurrentConsumers: true,
		},
		New: func(t testing.TB) transport.Transport {
			tp, err := gcppubsub.New(gcppubsub.Options{ProjectID: project, EmulatorHost: f.addr}, transport.Env{})
			if err != nil {
				t.Fatal(err)
			}
			return tp
		},
		Queue: func(t testing.TB) transport.Queue { return f.queue(t) },
		Publish: func(t testing.TB, q transport.Queue, payload []byte) {
			f.publish(t, "projects/"+project+"/topics/requests-"+strings.TrimPrefix(q.Name, "requests-sub-"), payload, nil)
		},
		Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			return f.results(t, q, n, timeout)
		},
	}
}

// TestConformanceEmulator runs the suite against the Pub/Sub emulator of google-cloud-cli.
func TestConformanceEmulator(t *testing.T) {
	f := newFixture(t, testenv.StartPubSubEmulator(t))
	transporttest.Run(t, harness(f))
}

// TestConformancePstest runs the suite against the in-process fake.
func TestConformancePstest(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	f := newFixture(t, srv.Addr)
	h := harness(f)
	// pstest redelivers a message nacked while its stream shuts down only
	// after the ack deadline (10 s here); the emulator run checks Reopen.
	h.Features.Reopen = false
	transporttest.Run(t, h)
}

func TestOptions(t *testing.T) {
	tests := []struct{ name, options, wantErr string }{
		{"legacy project", `{"project_id":"p"}`, ""},
		{"all", `{"project_id":"p","dead_letter_topic":"dl","request_topics":{"s":"t"},"max_outstanding_messages":10}`, ""},
		{"no project", `{}`, "project_id"},
		{"unknown", `{"project_id":"p","project":"x"}`, "unknown field"},
		{"short extension", `{"project_id":"p","max_extension_seconds":1}`, "max_extension_seconds"},
		{"upstream batch_size", `{"project_id":"p","batch_size":10}`, ""},
		{"negative batch_size", `{"project_id":"p","batch_size":-1}`, "batch_size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := gcppubsub.Factory(json.RawMessage(tc.options), transport.Env{})
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

// TestBatchSize: upstream's batch_size is accepted and leaves the lease
// settings alone (the queues' max_concurrency carries its meaning).
func TestBatchSize(t *testing.T) {
	tp, err := gcppubsub.Factory(json.RawMessage(`{"project_id":"p","batch_size":25}`), transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tp.Close() }()
	if o := tp.(*gcppubsub.Transport).Options(); o.BatchSize != 25 || o.MaxOutstandingMessages != 0 {
		t.Errorf("options %+v", o)
	}
}

func TestMergeAttributes(t *testing.T) {
	tests := []struct {
		name  string
		data  string
		attrs map[string]string
		want  map[string]string
	}{
		{"flat", `{"id":"a","deadline":9999999999,"payload":{},"metadata":{"job_id":"j"}}`, map[string]string{"tenant": "t", "job_id": "other"}, map[string]string{"job_id": "j", "tenant": "t"}},
		{"flat without metadata", `{"id":"a","deadline":9999999999,"payload":{}}`, map[string]string{"tenant": "t"}, map[string]string{"tenant": "t"}},
		{"envelope", `{"request_kind":"pubsub","internal":{"retry_count":2},"data":{"id":"a","deadline":9999999999,"payload":{}}}`, map[string]string{"tenant": "t"}, map[string]string{"tenant": "t"}},
		{"internal attributes skipped", `{"id":"a","deadline":9999999999,"payload":{}}`, map[string]string{"sluice_not_before": "1", "_watermill_message_uuid": "u"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := gcppubsub.MergeAttributes([]byte(tc.data), tc.attrs)
			r, err := wire.Decode(got)
			if err != nil {
				t.Fatalf("merged request does not decode: %v: %s", err, got)
			}
			if len(r.Metadata) != len(tc.want) {
				t.Fatalf("metadata %v, want %v", r.Metadata, tc.want)
			}
			for k, v := range tc.want {
				if r.Metadata[k] != v {
					t.Fatalf("metadata %v, want %v", r.Metadata, tc.want)
				}
			}
			if tc.name == "envelope" && r.RetryCount != 2 {
				t.Fatalf("envelope retry count lost: %d", r.RetryCount)
			}
		})
	}
	if got := gcppubsub.MergeAttributes([]byte("not json"), map[string]string{"a": "b"}); string(got) != "not json" {
		t.Fatalf("invalid data changed: %s", got)
	}
}

// TestAckOnlyAfterResult: the request stays un-acked (and so redelivered
// after a crash) until its result was published; the ack deadline is
// extended meanwhile. Checked on pstest, whose clock the test can read.
func TestAckOnlyAfterResult(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	f := newFixture(t, srv.Addr)
	q := f.queue(t)
	tp, ch := subscribe(t, srv.Addr, q)
	f.publish(t, "projects/"+project+"/topics/requests-"+strings.TrimPrefix(q.Name, "requests-sub-"), transporttest.Request("a1", time.Hour), map[string]string{"tenant": "t7"})
	var m *message.Message
	select {
	case m = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	r, err := wire.Decode(m.Payload)
	if err != nil || r.Metadata["tenant"] != "t7" {
		t.Fatalf("attributes not merged into metadata: %v %v", r, err)
	}
	acked := func() bool {
		for _, sm := range srv.Messages() {
			if sm.Acks > 0 {
				return true
			}
		}
		return false
	}
	time.Sleep(300 * time.Millisecond)
	if acked() {
		t.Fatal("acked before the result was published")
	}
	pub, _ := tp.Publisher(q)
	res := &wire.Result{ID: "a1", StatusCode: 200, Payload: "{}"}
	if err := pub.Publish(q.ResultName, message.NewMessage(m.UUID, res.Marshal())); err != nil {
		t.Fatal(err)
	}
	transport.Ack(m) // the core settles through the hook, as for every transport
	deadline := time.Now().Add(5 * time.Second)
	for !acked() {
		if time.Now().After(deadline) {
			t.Fatal("not acked after the result was published and the core acked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := f.results(t, q, 1, 5*time.Second); len(got) != 1 {
		t.Fatalf("%d results, want 1", len(got))
	}
}

// A subscription that does not exist yet is retried, loudly (counted), and
// requests flow once it is created.
func TestMissingSubscriptionIsRetried(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	f := newFixture(t, srv.Addr)
	topic := f.topic(t, "late-requests")
	q := transport.Queue{ID: "late", Name: "late-sub", ResultName: "late-results"}
	tp, ch := subscribe(t, srv.Addr, q)
	deadline := time.Now().Add(10 * time.Second)
	for tp.Events()["receive_errors"] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("receiving from a missing subscription was not reported")
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.subscription(t, q.Name, topic)
	f.publish(t, topic, transporttest.Request("late1", time.Hour), nil)
	select {
	case m := <-ch:
		transport.Ack(m)
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery after the subscription was created")
	}
}

// subscribe starts a transport on the emulator at addr and subscribes to q
// with 4 credits; everything is closed when the test ends.
func subscribe(t *testing.T, addr string, q transport.Queue) (*gcppubsub.Transport, <-chan *message.Message) {
	t.Helper()
	tp, err := gcppubsub.New(gcppubsub.Options{ProjectID: project, EmulatorHost: addr}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	credits := credit.NewPool(4, credit.Ramp{})
	credits.SetBudget(1)
	sub, err := transport.NewSubscriber(tp, q, credits, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := sub.Subscribe(ctx, q.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return tp, ch
}
