package natsjetstream_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/internal/rigs/brokere2e"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
)

// TestNodeKilledMidRun runs sluice over a 3-node JetStream cluster (request
// and result streams replicated R3), kills the node leading the request
// stream with SIGKILL once a third of the requests are answered, and checks
// that every request is answered; duplicates are logged.
func TestNodeKilledMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server cluster")
	}
	cl := testenv.StartNATSCluster(t, 3)
	js := client(t, cl.URL)
	const queue, results, n = "fo-requests", "fo-results", 400
	tp := newTransport(t, cl.URL, map[string]any{"replicas": 3}).(*wmtransport.Transport)
	// The producer creates the replicated request stream, as an operator would.
	// Generous bounds: on a loaded 2-core machine the cluster's re-election
	// and the consumers' recovery after the kill took over 15 s.
	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Second)
	defer cancel()
	for _, topic := range []string{queue, results} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsjetstream.StreamName(topic), Subjects: []string{topic},
			Retention: jetstream.WorkQueuePolicy, Replicas: 3}); err != nil {
			t.Fatalf("create stream %s: %v", topic, err)
		}
	}
	ids := brokere2e.IDs("fo", n)
	for _, id := range ids {
		if _, err := js.Publish(ctx, queue, brokere2e.Request(id)); err != nil {
			t.Fatalf("publish %s: %v", id, err)
		}
	}
	brokere2e.Run(t, tp, adapters(t), queue, results, brokere2e.Gateway(t, 40*time.Millisecond), 16)

	tally := brokere2e.NewTally()
	reader := resultReader(t, js, results)
	killed := -1
	deadline := time.Now().Add(60 * time.Second)
	for tally.Answered() < n && time.Now().Before(deadline) {
		tally.Add(t, reader(ctx))
		if killed < 0 && tally.Answered() >= n/3 {
			killed = streamLeader(t, js, queue)
			cl.Kill(killed)
			t.Logf("killed node %d (leader of the request stream) after %d results", killed+1, tally.Answered())
		}
	}
	if killed < 0 {
		t.Fatalf("only %d of %d results before the deadline; no node was killed", tally.Answered(), n)
	}
	// Late duplicates (redelivered after ack_wait) would show up now.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		tally.Add(t, reader(ctx))
	}
	dups := tally.Check(t, ids)
	t.Logf("%d requests, %d answered, %d duplicate results, %d unconfirmed acks", n, tally.Answered(), dups,
		tp.Broker().(*natsjetstream.Broker).AckErrors())
}

// streamLeader returns the index of the node leading topic's stream.
func streamLeader(t testing.TB, js jetstream.JetStream, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, natsjetstream.StreamName(topic))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	i, err := strconv.Atoi(strings.TrimPrefix(info.Cluster.Leader, "n"))
	if err != nil {
		t.Fatalf("leader %q: %v", info.Cluster.Leader, err)
	}
	return i - 1
}

// resultReader returns a function that reads the results available on
// topic's stream within about 200 ms (a durable consumer, so it resumes
// across the failover).
func resultReader(t testing.TB, js jetstream.JetStream, topic string) func(ctx context.Context) [][]byte {
	t.Helper()
	var cons jetstream.Consumer
	return func(ctx context.Context) [][]byte {
		if cons == nil {
			c, err := js.CreateOrUpdateConsumer(ctx, natsjetstream.StreamName(topic), jetstream.ConsumerConfig{
				Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				return nil
			}
			cons = c
		}
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			return nil
		}
		var out [][]byte
		for m := range batch.Messages() {
			out = append(out, m.Data())
			ackCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = m.DoubleAck(ackCtx)
			cancel()
		}
		return out
	}
}

var _ transport.Transport = (*wmtransport.Transport)(nil)

// adapters are the gates the deployment needs (the constant gate).
func adapters(t testing.TB) app.Adapters {
	t.Helper()
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	return ad
}
