package redispubsub_test

import (
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/internal/rigs/redishealth"
	"github.com/sluice-io/sluice/transports/redispubsub"
)

// CheckHealth PINGs Redis: healthy with the server up, an error naming the
// ping while it is down, healthy again once it is back on the same address.
func TestCheckHealthFollowsRedis(t *testing.T) {
	redishealth.Check(t, func(t *testing.T, url string) transport.Transport {
		tp, err := redispubsub.New(redispubsub.Options{Server: redispubsub.Server{URL: url}}, transport.Env{})
		if err != nil {
			t.Fatal(err)
		}
		return tp
	})
}
