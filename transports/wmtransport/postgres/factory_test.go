package postgres_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/postgres"
)

// TestFactoryOptions: broker_options go through the shared Build: decoded
// strictly, defaulted and validated by the broker, with the errors named
// after the broker and the option. No server is needed (the pools connect
// on first use).
func TestFactoryOptions(t *testing.T) {
	const url = `"url":"postgres://sluice@127.0.0.1:1/sluice?sslmode=disable"`
	tests := []struct {
		name, options, wantErr string
	}{
		{"defaults", `{` + url + `}`, ""},
		{"no url", `{}`, "broker postgres: url: required"},
		{"unknown option", `{` + url + `,"poll_ms":5}`, `broker postgres: transport options: json: unknown field "poll_ms"`},
		{"wrong type", `{` + url + `,"max_conns":"8"}`, "broker postgres: transport options: json: cannot unmarshal string"},
		{"invalid", `{` + url + `,"payload_type":"text","max_conns":-1}`, "broker postgres: payload_type \"text\": want \"bytea\" or \"json\"\nmax_conns -1: must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := json.RawMessage(`{"broker":"` + postgres.Name + `","broker_options":` + tc.options + `}`)
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
			b, ok := tp.(*wmtransport.Transport).Broker().(*postgres.Broker)
			if !ok {
				t.Fatalf("broker %T", tp.(*wmtransport.Transport).Broker())
			}
			if o := b.Options(); o.PayloadType != "bytea" || o.PollIntervalMS != 200 || o.RetryIntervalMS != 500 || o.ResendIntervalMS != 100 || o.MaxConns != 16 {
				t.Errorf("defaults: %+v", o)
			}
		})
	}
}
