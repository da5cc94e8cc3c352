package wmtransport_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
	"github.com/sluice-io/sluice/transports/wmtransport/postgres"
)

type sizedOptions struct {
	Window int `json:"window"`
}

// sizedBroker is a broker whose build fails on a window below 1.
type sizedBroker struct{ window int }

func newSizedBroker(o sizedOptions, _ transport.Env) (*sizedBroker, error) {
	if o.Window < 1 {
		return nil, errors.New("window: must be positive")
	}
	return &sizedBroker{o.Window}, nil
}

func (*sizedBroker) Publisher() message.Publisher                       { return nopPub{} }
func (*sizedBroker) Subscriber(string, int) (message.Subscriber, error) { return fakeSub{}, nil }
func (*sizedBroker) Close() error                                       { return nil }

// TestBuildBroker: a broker factory built on BuildBroker decodes strictly,
// hands the options to the broker's constructor and, when that fails,
// returns a nil Broker rather than a typed nil.
func TestBuildBroker(t *testing.T) {
	b, err := wmtransport.BuildBroker(json.RawMessage(`{"window":4}`), transport.Env{}, newSizedBroker)
	if err != nil {
		t.Fatal(err)
	}
	if sb, ok := b.(*sizedBroker); !ok || sb.window != 4 {
		t.Fatalf("broker %#v", b)
	}
	b, err = wmtransport.BuildBroker(json.RawMessage(`{"window":0}`), transport.Env{}, newSizedBroker)
	if err == nil || err.Error() != "window: must be positive" || b != nil {
		t.Fatalf("failed build: %#v, %v; want nil and the constructor's error", b, err)
	}
	b, err = wmtransport.BuildBroker(json.RawMessage(`{"windw":4}`), transport.Env{}, newSizedBroker)
	if err == nil || !strings.Contains(err.Error(), `unknown field "windw"`) || b != nil {
		t.Fatalf("unknown option: %#v, %v", b, err)
	}
}

// TestBrokerFactories: the brokers' broker_options go through BuildBroker:
// decoded strictly, defaulted and validated by the broker, with errors
// naming the broker and the option. No server is needed (both connect on
// first use).
func TestBrokerFactories(t *testing.T) {
	reg := wmtransport.NewBrokers()
	for name, f := range map[string]wmtransport.BrokerFactory{natsjetstream.Name: natsjetstream.Factory, postgres.Name: postgres.Factory} {
		if err := reg.Register(name, f); err != nil {
			t.Fatal(err)
		}
	}
	const pgURL = `"url":"postgres://sluice@127.0.0.1:1/sluice?sslmode=disable"`
	tests := []struct {
		name, broker, options, wantErr string
		defaults                       func(wmtransport.Broker) bool
	}{
		{name: "nats defaults", broker: natsjetstream.Name, options: `{}`, defaults: func(b wmtransport.Broker) bool {
			o := b.(*natsjetstream.Broker).Options()
			return o.URL == "nats://127.0.0.1:4222" && o.Consumer == "sluice" && o.AckWaitMS == 30000 && o.DuplicateWindowSeconds == 120
		}},
		{name: "nats unknown option", broker: natsjetstream.Name, options: `{"ack_wait":5}`, wantErr: `broker nats-jetstream: transport options: json: unknown field "ack_wait"`},
		{name: "nats wrong type", broker: natsjetstream.Name, options: `{"replicas":"3"}`, wantErr: "broker nats-jetstream: transport options: json: cannot unmarshal string"},
		{name: "nats invalid", broker: natsjetstream.Name, options: `{"replicas":9,"storage":"tape"}`, wantErr: "broker nats-jetstream: replicas 9: must be 1 to 5\nstorage \"tape\""},
		{name: "postgres defaults", broker: postgres.Name, options: `{` + pgURL + `}`, defaults: func(b wmtransport.Broker) bool {
			o := b.(*postgres.Broker).Options()
			return o.PayloadType == "bytea" && o.PollIntervalMS == 200 && o.RetryIntervalMS == 500 && o.ResendIntervalMS == 100 && o.MaxConns == 16
		}},
		{name: "postgres no url", broker: postgres.Name, options: `{}`, wantErr: "broker postgres: url: required"},
		{name: "postgres unknown option", broker: postgres.Name, options: `{` + pgURL + `,"poll_ms":5}`, wantErr: `broker postgres: transport options: json: unknown field "poll_ms"`},
		{name: "postgres invalid", broker: postgres.Name, options: `{` + pgURL + `,"payload_type":"text","max_conns":-1}`, wantErr: "broker postgres: payload_type \"text\": want \"bytea\" or \"json\"\nmax_conns -1: must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := json.RawMessage(`{"broker":"` + tc.broker + `","broker_options":` + tc.options + `}`)
			tp, err := wmtransport.Factory(reg)(raw, transport.Env{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || tp != nil {
					t.Fatalf("%v (%T); want no transport and an error containing %q", err, tp, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tp.Close()
			if b := tp.(*wmtransport.Transport).Broker(); !tc.defaults(b) {
				t.Errorf("defaults of %T: %+v", b, b)
			}
		})
	}
}
