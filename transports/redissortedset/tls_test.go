package redissortedset_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The deployment's redis_tls (transport.Env.RedisTLS) reaches the
// transport's rediss:// connection when the transport sets no tls_* option
// of its own: a server that requires a client certificate is reached with
// it and refuses the transport without it.
func TestDeploymentRedisTLS(t *testing.T) {
	rs := testenv.StartRedisTLS(t)
	q := transport.Queue{Name: rss.RequestQueueName("tls")}
	for _, tc := range []struct {
		name string
		env  transport.Env
		ok   bool
	}{
		{"with redis_tls", transport.Env{RedisURL: rs.URL, RedisTLS: rs.ClientTLS(t)}, true},
		{"without", transport.Env{RedisURL: rs.URL}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := rss.Factory(nil, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			defer tp.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = tp.(transport.DepthReporter).Depth(ctx, q)
			if tc.ok && err != nil {
				t.Fatalf("depth over TLS with the deployment's client certificate: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("the server accepted a connection without a client certificate (and an unknown CA)")
			}
		})
	}
}
