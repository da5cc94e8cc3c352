package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
	"github.com/sluice-io/sluice/transports/redispubsub"
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
	p, _, err := newProducer(cfg, registered(t), slog.New(slog.DiscardHandler))
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
		p, _, err := newProducer(cfg, registered(t), slog.New(slog.DiscardHandler))
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

// registered returns the adapters the binary registers.
func registered(t testing.TB) app.Adapters {
	t.Helper()
	ad, err := adapters()
	if err != nil {
		t.Fatal(err)
	}
	return ad
}

// The fronts' producer is the one the registry holds for the transport;
// a transport without one is refused, naming those that have one.
func TestFrontsProducerFromRegistry(t *testing.T) {
	ad := registered(t)
	if got, want := strings.Join(ad.Producers.Names(), ", "), "memory, redis-sortedset, redis-stream"; got != want {
		t.Errorf("transports with a producer: %s, want %s", got, want)
	}
	p, tr, err := newProducer(&config.Config{Transport: memory.Name}, ad, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, ok := tr.(*memory.Transport); !ok {
		t.Errorf("the memory producer hands the dispatcher transport %T, want its memory transport", tr)
	}
	_, _, err = newProducer(&config.Config{Transport: redispubsub.Name}, ad, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "redis-pubsub") || !strings.Contains(err.Error(), "memory, redis-sortedset, redis-stream") {
		t.Errorf("a producer on redis-pubsub: %v, want it refused", err)
	}
}
