package redisstream_test

import (
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/internal/rigs/redishealth"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// CheckHealth PINGs Redis: healthy with the server up, an error naming the
// ping while it is down, healthy again once it is back on the same address.
func TestCheckHealthFollowsRedis(t *testing.T) {
	redishealth.Check(t, func(t *testing.T, url string) transport.Transport {
		tp, err := redisstream.New(redisstream.Options{Server: redisstream.Server{URL: url}}, transport.Env{})
		if err != nil {
			t.Fatal(err)
		}
		return tp
	})
}
