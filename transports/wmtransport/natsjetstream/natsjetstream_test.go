package natsjetstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/transporttest"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}

func brokers() *wmtransport.Brokers {
	reg := wmtransport.NewBrokers()
	if err := reg.Register(natsjetstream.Name, natsjetstream.Factory); err != nil {
		panic(err)
	}
	return reg
}

// newTransport builds the watermill transport over the nats-jetstream broker at url.
func newTransport(t testing.TB, url string, extra map[string]any) transport.Transport {
	t.Helper()
	bo := map[string]any{"url": url, "ack_wait_ms": 5000, "fetch_wait_ms": 200}
	for k, v := range extra {
		bo[k] = v
	}
	raw, err := json.Marshal(map[string]any{"broker": natsjetstream.Name, "broker_options": bo})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := wmtransport.Factory(brokers())(raw, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

// client connects a producer / result reader.
func client(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// readResults reads up to n messages of topic's stream (from the start,
// through an ephemeral consumer) within timeout.
func readResults(t testing.TB, js jetstream.JetStream, topic string, n int, timeout time.Duration) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out [][]byte
	var cons jetstream.Consumer
	for cons == nil {
		c, err := js.CreateOrUpdateConsumer(ctx, natsjetstream.StreamName(topic), jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
		if err == nil {
			cons = c
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	for len(out) < n && ctx.Err() == nil {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			continue
		}
		for m := range batch.Messages() {
			out = append(out, m.Data())
			_ = m.Ack()
		}
	}
	return out
}

func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server")
	}
	srv := testenv.StartNATSCluster(t, 1)
	js := client(t, srv.URL)
	var seq atomic.Int64
	transporttest.Run(t, transporttest.Harness{
		Features: transporttest.Features{
			Ordering:            transporttest.Unordered,
			AtLeastOnce:         true,
			DelayedRequeue:      true,
			Results:             true,
			Reopen:              true,
			ConcurrentConsumers: true,
		},
		New: func(t testing.TB) transport.Transport { return newTransport(t, srv.URL, nil) },
		Queue: func(testing.TB) transport.Queue {
			n := seq.Add(1)
			return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("requests-", n), ResultName: fmt.Sprint("results-", n)}
		},
		Publish: func(t testing.TB, q transport.Queue, payload []byte) {
			publish(t, js, q.Name, payload)
		},
		Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			return readResults(t, js, q.ResultName, n, timeout)
		},
	})
}

// publish writes a request as a plain JetStream producer would (creating
// the stream as the broker does when it is missing).
func publish(t testing.TB, js jetstream.JetStream, topic string, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := natsjetstream.StreamName(topic)
	if _, err := js.Stream(ctx, name); err != nil {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{topic}, Retention: jetstream.WorkQueuePolicy}); err != nil && !errorsIsInUse(err) {
			t.Fatalf("create stream: %v", err)
		}
	}
	if _, err := js.Publish(ctx, topic, payload); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

func errorsIsInUse(err error) bool {
	return err != nil && errors.Is(err, jetstream.ErrStreamNameAlreadyInUse)
}
