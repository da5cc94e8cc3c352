package natsjetstream_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
)

// TestPublishRetriedUntilTimeout: a publish whose stream is missing (with
// no_create_streams) is tried again with backoff until publish_timeout_ms:
// it lands once the stream appears within that time, and otherwise fails
// with what the last try failed with, not with the timeout.
func TestPublishRetriedUntilTimeout(t *testing.T) {
	srv := testenv.StartNATSCluster(t, 1)
	js := client(t, srv.URL)
	// publisher publishes with publish_timeout_ms timeoutMS.
	publisher := func(t *testing.T, timeoutMS int) message.Publisher {
		b, err := natsjetstream.New(natsjetstream.Options{URL: srv.URL, NoCreateStreams: true, PublishTimeoutMS: timeoutMS}, transport.Env{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b.Publisher()
	}

	t.Run("stream appears", func(t *testing.T) {
		const topic = "late-stream"
		pub := publisher(t, 20000)
		done := make(chan error, 1)
		go func() { done <- pub.Publish(topic, message.NewMessage("r1", []byte("one"))) }()
		time.Sleep(300 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("publish ended (%v) before its stream existed", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsjetstream.StreamName(topic), Subjects: []string{topic}}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("publish: %v", err)
		}
		if got := readResults(t, js, topic, 1, 5*time.Second); len(got) != 1 || string(got[0]) != "one" {
			t.Fatalf("stream holds %q", got)
		}
	})

	t.Run("stream never appears", func(t *testing.T) {
		pub := publisher(t, 1500)
		start := time.Now()
		err := pub.Publish("no-stream", message.NewMessage("r2", []byte("two")))
		if err == nil || !strings.Contains(err.Error(), "stream not found") {
			t.Fatalf("publish: %v; want the missing stream's error", err)
		}
		if took := time.Since(start); took < 1500*time.Millisecond {
			t.Fatalf("gave up after %s, before publish_timeout_ms", took)
		}
	})
}

// TestFetchRecoversFromLostConsumer: while the shared consumer is gone
// (deleted by an operator) the fetch loop's fetches fail; it logs that,
// backs off, and fetches again once the consumer is back.
func TestFetchRecoversFromLostConsumer(t *testing.T) {
	srv := testenv.StartNATSCluster(t, 1)
	js := client(t, srv.URL)
	logs := &testenv.Buffer{}
	b, err := natsjetstream.New(natsjetstream.Options{URL: srv.URL, AckWaitMS: 5000, FetchWaitMS: 200},
		transport.Env{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const topic = "lost-consumer"
	sub, err := b.Subscriber(topic, 4)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	pub := b.Publisher()
	receive := func(uuid string) {
		t.Helper()
		if err := pub.Publish(topic, message.NewMessage(uuid, []byte(uuid))); err != nil {
			t.Fatalf("publish %s: %v", uuid, err)
		}
		select {
		case m := <-ch:
			if m.UUID != uuid {
				t.Fatalf("received %s, want %s", m.UUID, uuid)
			}
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not received; logs:\n%s", uuid, logs)
		}
	}
	receive("before")
	stream := natsjetstream.StreamName(topic)
	// The ack is confirmed (the work queue dropped the message) before the
	// consumer goes: a new consumer would deliver it again otherwise.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if st.CachedInfo().State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ack of the first message was not confirmed")
		}
	}
	if err := js.DeleteConsumer(ctx, stream, "sluice"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "fetch failed; retrying") {
		if time.Now().After(deadline) {
			t.Fatalf("no failed fetch logged while the consumer was gone; logs:\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "sluice", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 5 * time.Second, MaxDeliver: -1}); err != nil {
		t.Fatal(err)
	}
	receive("after")
}
