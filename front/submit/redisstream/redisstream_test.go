package redisstream_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/submit"
	"github.com/sluice-io/sluice/front/submit/redisstream"
	"github.com/sluice-io/sluice/front/submit/submittest"
	"github.com/sluice-io/sluice/internal/testenv"
	rstream "github.com/sluice-io/sluice/transports/redisstream"
)

// The suite against a real redis-server.
func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	submittest.Run(t, submittest.Harness{
		TransportName: rstream.Name,
		New: func(t testing.TB, lease time.Duration) (transport.Transport, submit.Producer) {
			o := rstream.Options{Server: rstream.Server{URL: r.URL}, BlockMS: 50}
			tr, err := rstream.New(o, transport.Env{})
			if err != nil {
				t.Fatal(err)
			}
			p, err := redisstream.Dial(o, transport.Env{}, redisstream.Options{Lease: lease})
			if err != nil {
				t.Fatal(err)
			}
			return tr, p
		},
	})
}

// A producer refuses a transport that writes results to streams.
func TestResultModeStream(t *testing.T) {
	_, err := redisstream.Dial(rstream.Options{Server: rstream.Server{URL: "redis://127.0.0.1:1"}, ResultMode: rstream.ResultStream}, transport.Env{}, redisstream.Options{})
	if err == nil {
		t.Fatal("a producer on result_mode stream, want an error")
	}
}
