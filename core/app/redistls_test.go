package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// Requests and results travel over rediss:// to a redis-server that listens
// only on a TLS port and requires a client certificate (redis_tls: ca_cert,
// cert, key); without the client certificate the deployment cannot start.
func TestRedisTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	srv := testenv.StartRedisTLS(t)
	ro, err := redis.ParseURL(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ro.TLSConfig = srv.ClientTLS(t)
	rc := redis.NewClient(ro)
	t.Cleanup(func() { _ = rc.Close() })
	ad := NewAdapters()
	if err := errors.Join(ad.Transports.Register(redisstream.Name, redisstream.Factory),
		ad.Transports.Register(redispubsub.Name, redispubsub.Factory),
		ad.Gates.Register(constant.Type, constant.Factory)); err != nil {
		t.Fatal(err)
	}
	_, gwURL := newGateway(t)
	for _, tc := range []struct{ name, options string }{
		{redisstream.Name, `{"block_ms":50}`},
		{redispubsub.Name, `{"result_mode":"list","retry_queue_name":"tls-retries"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue, results := "tls-requests-"+tc.name, "tls-results-"+tc.name
			cfg := func(tlsc config.TLS) *config.Config {
				return &config.Config{Transport: tc.name, RedisURL: srv.URL, RedisTLS: tlsc, Concurrency: 4,
					MetricsPort: -1, HealthPort: -1, DrainTimeout: config.Duration(time.Second),
					TransportConfig: config.TransportConfig{ResultQueueName: results, Options: json.RawMessage(tc.options),
						Queues: []config.Queue{{Queue: transport.Queue{Name: queue}, IGWBaseURL: gwURL}}}}
			}
			// No client certificate: the server refuses the handshake.
			if a, err := New(cfg(config.TLS{CACert: srv.CAFile}), Options{Adapters: ad, Registry: prometheus.NewRegistry()}); err == nil {
				ctx, stop := context.WithTimeout(context.Background(), 2*time.Second)
				err := a.Run(ctx)
				stop()
				if err == nil {
					t.Error("ran without a client certificate")
				}
			}

			a, err := New(cfg(config.TLS{CACert: srv.CAFile, Cert: srv.CertFile, Key: srv.KeyFile}),
				Options{Adapters: ad, Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- a.Run(ctx) }()
			defer func() {
				stop()
				if err := <-errc; err != nil {
					t.Errorf("run: %v", err)
				}
			}()
			far := time.Now().Add(time.Minute)
			for i := range 3 {
				msg := request(fmt.Sprintf("tls-%d", i), far, nil)
				if tc.name == redisstream.Name {
					err = rc.XAdd(ctx, &redis.XAddArgs{Stream: queue, Values: []any{"_watermill_message_uuid", fmt.Sprint(i), "payload", msg}}).Err()
				} else {
					err = publishHeard(ctx, rc, queue, msg)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			waitUntil(t, 20*time.Second, "three results over TLS", func() bool { return rc.LLen(ctx, results).Val() >= 3 })
			raw, _ := rc.LRange(ctx, results, 0, -1).Result()
			for _, b := range raw {
				if r, err := wire.DecodeResult([]byte(b)); err != nil || !r.OK() {
					t.Errorf("result %s: %v", b, err)
				}
			}
		})
	}
}

// publishHeard PUBLISHes until a subscriber hears it (the deployment subscribes asynchronously).
func publishHeard(ctx context.Context, rc *redis.Client, channel string, msg []byte) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := rc.Publish(ctx, channel, msg).Result()
		if err != nil || n > 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nobody subscribed to %s", channel)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
