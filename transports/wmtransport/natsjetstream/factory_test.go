package natsjetstream_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
)

// TestFactoryOptions: broker_options go through the shared Build: decoded
// strictly, defaulted and validated by the broker, with the errors named
// after the broker and the option. No server is needed (it connects lazily).
func TestFactoryOptions(t *testing.T) {
	tests := []struct {
		name, options, wantErr string
	}{
		{"defaults", `{}`, ""},
		{"unknown option", `{"ack_wait":5}`, `broker nats-jetstream: transport options: json: unknown field "ack_wait"`},
		{"wrong type", `{"replicas":"3"}`, "broker nats-jetstream: transport options: json: cannot unmarshal string"},
		{"invalid", `{"replicas":9,"storage":"tape"}`, "broker nats-jetstream: replicas 9: must be 1 to 5\nstorage \"tape\""},
		{"fetch above ack wait", `{"ack_wait_ms":1000,"fetch_wait_ms":1000}`, "fetch_wait_ms 1000: must be at least 10 and below ack_wait_ms"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := json.RawMessage(`{"broker":"` + natsjetstream.Name + `","broker_options":` + tc.options + `}`)
			tp, err := wmtransport.Factory(brokers())(raw, transport.Env{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if tp != nil {
					t.Fatalf("a transport (%T) came with the error", tp)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tp.Close()
			b, ok := tp.(*wmtransport.Transport).Broker().(*natsjetstream.Broker)
			if !ok {
				t.Fatalf("broker %T", tp.(*wmtransport.Transport).Broker())
			}
			if o := b.Options(); o.URL != "nats://127.0.0.1:4222" || o.Consumer != "sluice" || o.AckWaitMS != 30000 || o.DuplicateWindowSeconds != 120 {
				t.Errorf("defaults: %+v", o)
			}
		})
	}
}
