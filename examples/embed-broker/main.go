// Command embed-broker adds a Watermill broker of its own to sluice's
// generic Watermill transport ("watermill") and runs sluice on it: the
// broker is Watermill's in-process Go channel pub/sub (gochannel), which the
// sluice binary does not link. Any Watermill Publisher/Subscriber pair is
// added the same way: a BrokerFactory, registered under a name in a
// wmtransport.Brokers, and the config naming it ({"broker": "gochannel"}).
//
//	go run ./examples/embed-broker
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

// --- the broker: everything an embedder writes to add one ---

// goChannelOptions are the broker's options (the config's broker_options).
type goChannelOptions struct {
	// Buffer is the output buffer of each subscription.
	Buffer int64 `json:"buffer"`
}

// goChannelBroker is Watermill's gochannel as a sluice broker. It is not
// durable, and gochannel hands a subscription one message at a time (the
// next after the ack), whatever the window.
type goChannelBroker struct{ ps *gochannel.GoChannel }

// newGoChannelBroker is the wmtransport.BrokerFactory: BuildBroker decodes
// the options strictly (an unknown one is an error) and hands them to the
// constructor.
func newGoChannelBroker(options json.RawMessage, env transport.Env) (wmtransport.Broker, error) {
	return wmtransport.BuildBroker(options, env, func(o goChannelOptions, env transport.Env) (goChannelBroker, error) {
		ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: o.Buffer, Persistent: true}, watermill.NewSlogLogger(env.Logger))
		return goChannelBroker{ps}, nil
	})
}

func (b goChannelBroker) Publisher() message.Publisher { return b.ps }

// Subscriber shares the pub/sub; the transport closes what it gets, so its Close does nothing.
func (b goChannelBroker) Subscriber(string, int) (message.Subscriber, error) {
	return nopClose{b.ps}, nil
}

func (b goChannelBroker) Close() error { return b.ps.Close() }

type nopClose struct{ message.Subscriber }

func (nopClose) Close() error { return nil }

// --- a program running sluice on it ---

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "embed-broker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"echo":%s}`, body)
	}))
	defer gw.Close()

	brokers := wmtransport.NewBrokers()
	ad := app.NewAdapters()
	if err := errors.Join(
		brokers.Register("gochannel", newGoChannelBroker),
		ad.Transports.Register(wmtransport.Name, wmtransport.Factory(brokers)),
		ad.Gates.Register(constant.Type, constant.Factory),
	); err != nil {
		return err
	}
	cfg := &config.Config{
		Transport: wmtransport.Name, Concurrency: 4, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: "results",
			Queues:  []config.Queue{{Queue: transport.Queue{Name: "requests"}, IGWBaseURL: gw.URL, GateType: constant.Type}},
			Options: json.RawMessage(`{"broker": "gochannel", "broker_options": {"buffer": 16}}`)},
	}
	// The transport is built here (rather than by app.New from the
	// registry) only so that this program can publish to and read from it.
	tp, err := ad.Transports.New(cfg.Transport, cfg.TransportConfig.Options, transport.Env{})
	if err != nil {
		return err
	}
	broker := tp.(*wmtransport.Transport).Broker().(goChannelBroker)
	results, err := broker.ps.Subscribe(ctx, "results")
	if err != nil {
		return err
	}
	a, err := app.New(cfg, app.Options{Adapters: ad, Transport: tp})
	if err != nil {
		return err
	}
	for i := range 3 {
		req := fmt.Appendf(nil, `{"id":"req-%d","deadline":%d,"payload":{"prompt":"hello %d"}}`, i, time.Now().Add(time.Minute).Unix(), i)
		if err := broker.ps.Publish("requests", message.NewMessage(watermill.NewUUID(), req)); err != nil {
			return err
		}
	}
	runCtx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	var lines []string
	for len(lines) < 3 && runCtx.Err() == nil {
		select {
		case m := <-results:
			r, err := wire.DecodeResult(m.Payload)
			m.Ack()
			if err != nil {
				return err
			}
			lines = append(lines, fmt.Sprintf("%s %d %s", r.ID, r.StatusCode, r.Payload))
		case <-runCtx.Done():
		}
	}
	stop() // stop claiming, drain, close
	if err := <-done; err != nil {
		return err
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	return nil
}
