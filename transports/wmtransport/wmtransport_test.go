package wmtransport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSub emits per subscription the messages topic-0..topic-(n-1), each
// after the previous one was acked, and closes the channel when ctx ends.
type fakeSub struct{ n int }

func (f fakeSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for i := range f.n {
			m := message.NewMessage(fmt.Sprintf("%s-%d", topic, i), nil)
			select {
			case out <- m:
			case <-ctx.Done():
				return
			}
			select {
			case <-m.Acked():
			case <-m.Nacked():
			case <-ctx.Done():
				return
			}
		}
		<-ctx.Done()
	}()
	return out, nil
}

func (fakeSub) Close() error { return nil }

type nopPub struct{}

func (nopPub) Publish(string, ...*message.Message) error { return nil }
func (nopPub) Close() error                              { return nil }

func TestOptionsValidate(t *testing.T) {
	reg := wmtransport.NewBrokers()
	if err := reg.Register("fake", func(json.RawMessage, transport.Env) (wmtransport.Broker, error) {
		return wmtransport.Static(nopPub{}, fakeSub{}), nil
	}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, options, wantErr string
	}{
		{"ok", `{"broker":"fake"}`, ""},
		{"no broker", `{}`, "broker: required"},
		{"unknown broker", `{"broker":"kafka"}`, `unknown watermill broker "kafka" (known: fake)`},
		{"negative window", `{"broker":"fake","window":-1}`, "window -1"},
		{"negative close timeout", `{"broker":"fake","close_timeout_ms":-5}`, "close_timeout_ms -5"},
		{"unknown option", `{"broker":"fake","brokr":"x"}`, `unknown field "brokr"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := wmtransport.Factory(reg)(json.RawMessage(tc.options), transport.Env{})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if o := tp.(*wmtransport.Transport).Options(); o.DeadLetterSuffix != "_dead" || o.CloseTimeoutMS != 5000 {
					t.Errorf("defaults: %+v", o)
				}
				_ = tp.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestStaticServesOneQueue(t *testing.T) {
	b := wmtransport.Static(nopPub{}, fakeSub{})
	if _, err := b.Subscriber("a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Subscriber("b", 1); err == nil {
		t.Fatal("a second queue on a static broker: no error")
	}
}

// Parallel runs n subscriptions at once: with each holding one message
// until acked, n messages are out together, and all arrive.
func TestParallelMerges(t *testing.T) {
	const subs, each = 4, 3
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := wmtransport.Parallel(fakeSub{n: each}, subs).Subscribe(ctx, "t")
	if err != nil {
		t.Fatal(err)
	}
	var held []*message.Message
	for range subs {
		select {
		case m := <-ch:
			held = append(held, m)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d messages out at once, want %d", len(held), subs)
		}
	}
	got := len(held)
	for _, m := range held {
		m.Ack()
	}
	for got < subs*each {
		select {
		case m := <-ch:
			got++
			m.Ack()
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d messages", got, subs*each)
		}
	}
	cancel()
	for range ch { // closes once every subscription ended
	}
}
