package redissortedset_test

import (
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/internal/rigs/redishealth"
	"github.com/sluice-io/sluice/transports/redissortedset"
)

// CheckHealth PINGs Redis: healthy with the server up, an error naming the
// ping while it is down, healthy again once it is back on the same address.
func TestCheckHealthFollowsRedis(t *testing.T) {
	redishealth.Check(t, func(t *testing.T, url string) transport.Transport {
		tp, err := redissortedset.New(redissortedset.Options{Server: redissortedset.Server{URL: url}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tp
	})
}
