package wmtransport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/registry"
	"github.com/sluice-io/sluice/core/transport"
)

// Broker is one configured Watermill broker: a publisher and, per request
// queue, a subscriber. The transport owns it and closes it last.
type Broker interface {
	// Publisher returns the broker's publisher, shared by every queue: it
	// writes results, re-queued retries, dead letters and new requests. It
	// returns only once the broker has the message durably (as far as the
	// broker promises durability). A message that ends a delivery (its
	// result, its re-queued retry, its dead letter) has a context whose
	// values fall back to those of the broker message delivered, so a
	// broker may write it in the delivery's own transaction (postgres does).
	// The transport never closes it; Close does.
	Publisher() message.Publisher
	// Subscriber returns a subscriber for request topic. The transport
	// calls Subscribe on it once, with topic, and closes it when the queue's
	// source ends. window is how many messages the subscription may hold
	// un-acked at once (delivered and not yet settled, or fetched ahead and
	// waiting): the broker sets its own prefetch, ack window or number of
	// parallel reads from it, so that the broker does not lease more than
	// the queue can run. Its messages must be independent (each acked or
	// nacked on its own; a nack hands the message back to the broker).
	Subscriber(topic string, window int) (message.Subscriber, error)
	// Close releases the broker's connections after every subscriber was
	// closed.
	Close() error
}

// HealthChecker is implemented by brokers that can tell whether they are
// reachable; the transport's CheckHealth (behind /readyz) asks it.
type HealthChecker interface {
	CheckHealth(ctx context.Context) error
}

// BrokerFactory builds a broker from its options (the transport config's
// broker_options object). It must reject unknown options and should do no
// I/O that can wait for long.
type BrokerFactory func(options json.RawMessage, env transport.Env) (Broker, error)

// BuildBroker is the body of a BrokerFactory, as transport.Build is a
// transport factory's: it decodes options strictly into a fresh O (unknown
// fields are errors) and returns the broker build makes of them (build
// sets O's defaults and validates it).
func BuildBroker[O any, B Broker](options json.RawMessage, env transport.Env, build func(O, transport.Env) (B, error)) (Broker, error) {
	b, err := transport.Construct(options, env, build)
	if err != nil {
		return nil, err // not b: a typed nil would not compare equal to nil
	}
	return b, nil
}

// Brokers maps broker names to factories: the "watermill broker" namespace
// of the generic registry (a duplicate name is an error; an unknown one is
// an error naming the known ones).
type Brokers struct {
	*registry.Registry[BrokerFactory]
}

// NewBrokers returns an empty broker registry.
func NewBrokers() *Brokers {
	return &Brokers{registry.New[BrokerFactory]("watermill broker")}
}

// Static is a Broker over one fixed publisher and subscriber, for brokers
// whose subscriber cannot be sized per queue (window is ignored: the
// subscriber's own settings bound what it leases). Subscriber returns sub
// itself for the first queue and an error for a second one, since closing it
// would end every queue's subscription. Close closes both.
func Static(pub message.Publisher, sub message.Subscriber) Broker {
	return &static{pub: pub, sub: sub}
}

type static struct {
	pub  message.Publisher
	sub  message.Subscriber
	mu   sync.Mutex
	used bool
}

func (s *static) Publisher() message.Publisher { return s.pub }

func (s *static) Subscriber(topic string, _ int) (message.Subscriber, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used {
		return nil, fmt.Errorf("subscribe %s: a static broker serves one queue", topic)
	}
	s.used = true
	return nopCloseSubscriber{s.sub}, nil
}

func (s *static) Close() error {
	return errors.Join(s.sub.Close(), s.pub.Close())
}

// nopCloseSubscriber leaves the shared subscriber open (Broker.Close closes it).
type nopCloseSubscriber struct{ message.Subscriber }

func (nopCloseSubscriber) Close() error { return nil }

// Parallel returns a subscriber whose Subscribe subscribes to the topic n
// times on sub and merges the deliveries into one channel. Use it for a
// Watermill subscriber that holds one message at a time per subscription
// (it waits for the ack before reading the next, as watermill-sql's does)
// and whose subscriptions to one topic share its messages rather than each
// getting every message: n subscriptions then run up to n messages at once.
// Close closes sub.
func Parallel(sub message.Subscriber, n int) message.Subscriber {
	return &parallel{sub: sub, n: max(n, 1)}
}

type parallel struct {
	sub message.Subscriber
	n   int
}

func (p *parallel) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	ins := make([]<-chan *message.Message, 0, p.n)
	for range p.n {
		in, err := p.sub.Subscribe(ctx, topic)
		if err != nil {
			cancel()
			return nil, err
		}
		ins = append(ins, in)
	}
	out := make(chan *message.Message)
	var wg sync.WaitGroup
	for _, in := range ins {
		wg.Go(func() {
			for m := range in {
				select {
				case out <- m:
				case <-ctx.Done():
					// The merged subscription ended: hand the message back
					// and drain until the inner subscription closes.
					m.Nack()
				}
			}
		})
	}
	go func() {
		wg.Wait()
		cancel()
		close(out)
	}()
	return out, nil
}

func (p *parallel) Close() error { return p.sub.Close() }
