package redissortedset_test

import (
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/submit"
	"github.com/sluice-io/sluice/front/submit/redissortedset"
	"github.com/sluice-io/sluice/front/submit/submittest"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The suite against a real redis-server.
func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	submittest.Run(t, submittest.Harness{
		Features:      submittest.Features{CountsCancelled: true},
		TransportName: rss.Name,
		New: func(t testing.TB, lease time.Duration) (transport.Transport, submit.Producer) {
			tr, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}, PollIntervalMS: 20}, nil)
			if err != nil {
				t.Fatal(err)
			}
			p, err := producer.Dial(r.URL, producer.Config{})
			if err != nil {
				t.Fatal(err)
			}
			return tr, redissortedset.New(p, redissortedset.Options{Lease: lease})
		},
	})
}
