package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The fronts' producer writes where the transport reads: the transport
// config's url (and topology) before the deployment's, as the transport
// takes them.
func TestFrontsProducerUsesTransportURL(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	cfg := &config.Config{
		Transport:       rss.Name,
		TransportConfig: config.TransportConfig{Options: json.RawMessage(fmt.Sprintf(`{"url": %q, "prefix": "fronts"}`, r.URL))},
		RedisURL:        "redis://127.0.0.1:1/0", // nothing listens there
	}
	p, _, err := newProducer(cfg, app.Adapters{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if closer, ok := p.(interface{ Close() error }); ok {
		t.Cleanup(func() { _ = closer.Close() })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &wire.Request{ID: "r1", Deadline: time.Now().Add(time.Hour), Payload: json.RawMessage(`{}`)}
	if err := p.Enqueue(ctx, "q", []*wire.Request{req}); err != nil {
		t.Fatalf("Enqueue: %v", err)
	}
	keys, err := c.Keys(ctx, "fronts*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) == 0 {
		t.Error("the transport config's Redis holds no key of prefix fronts after an enqueue")
	}
}

// Without the private CA the fronts' producer cannot reach a TLS-only
// redis-server (the system CAs do not trust it); with the deployment's
// redis_tls it enqueues where the transport reads.
func TestFrontsProducerUsesRedisTLS(t *testing.T) {
	srv := testenv.StartRedisTLS(t)
	for _, withTLS := range []bool{false, true} {
		cfg := &config.Config{Transport: rss.Name, RedisURL: srv.URL,
			TransportConfig: config.TransportConfig{Options: json.RawMessage(`{"prefix": "fronts-tls"}`)}}
		if withTLS {
			cfg.RedisTLS = config.TLS{CACert: srv.CAFile, Cert: srv.CertFile, Key: srv.KeyFile}
		}
		p, _, err := newProducer(cfg, app.Adapters{}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req := &wire.Request{ID: "r1", Deadline: time.Now().Add(time.Hour), Payload: json.RawMessage(`{}`)}
		err = p.Enqueue(ctx, "q", []*wire.Request{req})
		cancel()
		_ = p.Close()
		if withTLS != (err == nil) {
			t.Errorf("redis_tls set %v: Enqueue: %v", withTLS, err)
		}
	}
}
