package redisstream_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/submit/submittest"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/internal/rigs/dispatcher"
	rstream "github.com/sluice-io/sluice/transports/redisstream"
)

// The suite against a real redis-server.
func TestProducerConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	submittest.Run(t, submittest.Harness{
		Dispatch:      dispatcher.Runner(ad),
		TransportName: rstream.Name,
		New: func(t testing.TB, lease time.Duration) (transport.Transport, submit.Producer) {
			o := rstream.Options{Server: rstream.Server{URL: r.URL}, BlockMS: 50}
			tr, err := rstream.New(o, transport.Env{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := rstream.DialProducer(o, transport.Env{}, submit.ReaderOptions{Lease: lease})
			if err != nil {
				t.Fatal(err)
			}
			return tr, p
		},
	})
}

// A producer refuses a transport that writes results to streams, and so
// does the producer's check, without I/O.
func TestProducerResultModeStream(t *testing.T) {
	_, err := rstream.DialProducer(rstream.Options{Server: rstream.Server{URL: "redis://127.0.0.1:1"}, ResultMode: rstream.ResultStream}, transport.Env{}, submit.ReaderOptions{})
	if err == nil {
		t.Fatal("a producer on result_mode stream, want an error")
	}
	for options, ok := range map[string]bool{`{"result_mode": "stream"}`: false, `{"result_mode": "list"}`: true, ``: true} {
		if err := rstream.CheckProducerOptions(json.RawMessage(options)); (err == nil) != ok {
			t.Errorf("CheckProducerOptions(%s): %v", options, err)
		}
	}
	if _, _, err := rstream.OpenProducer(json.RawMessage(`{"result_mode": "stream"}`), transport.Env{}); err == nil || !strings.Contains(err.Error(), `result_mode "stream"`) {
		t.Errorf("OpenProducer on result_mode stream: %v", err)
	}
}
