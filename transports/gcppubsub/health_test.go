package gcppubsub_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/gcppubsub"
)

// checkHealth runs the transport's health check on queues, bounded by within.
func checkHealth(t *testing.T, tp *gcppubsub.Transport, within time.Duration, queues ...transport.Queue) error {
	t.Helper()
	var hc transport.HealthChecker = tp
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return hc.CheckHealth(ctx, queues)
}

func newHealthTransport(t *testing.T, addr string) *gcppubsub.Transport {
	t.Helper()
	tp, err := gcppubsub.New(gcppubsub.Options{ProjectID: project, EmulatorHost: addr}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	return tp
}

// Healthy while every queue's subscription can be looked up; a missing one,
// or a server gone, is an error naming the subscription.
func TestCheckHealthProbesSubscriptions(t *testing.T) {
	srv := pstest.NewServer()
	stop := sync.OnceFunc(func() { _ = srv.Close() }) // pstest's Close panics when called twice
	t.Cleanup(stop)
	f := newFixture(t, srv.Addr)
	topic := f.topic(t, "health-requests")
	f.subscription(t, "health-a", topic)
	f.subscription(t, "health-b", topic)
	tp := newHealthTransport(t, srv.Addr)

	if err := checkHealth(t, tp, 3*time.Second, transport.Queue{Name: "health-a"}, transport.Queue{Name: "health-b"}); err != nil {
		t.Fatalf("subscriptions exist: %v", err)
	}
	err := checkHealth(t, tp, 3*time.Second, transport.Queue{Name: "health-a"}, transport.Queue{Name: "health-missing"})
	if err == nil || !strings.Contains(err.Error(), "subscription health-missing") || strings.Contains(err.Error(), "health-a") {
		t.Fatalf("missing subscription: %v", err)
	}

	stop()
	start := time.Now()
	if err := checkHealth(t, tp, 500*time.Millisecond, transport.Queue{Name: "health-a"}); err == nil {
		t.Fatal("server gone: healthy")
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("check took %s with a 500ms bound", el)
	}
}

// PermissionDenied on the lookup counts as healthy, as upstream has it.
func TestCheckHealthPermissionDeniedIsHealthy(t *testing.T) {
	srv := pstest.NewServer(pstest.WithErrorInjection("GetSubscription", codes.PermissionDenied, "no subscriptions.get"))
	t.Cleanup(func() { _ = srv.Close() })
	tp := newHealthTransport(t, srv.Addr)
	if err := checkHealth(t, tp, 3*time.Second, transport.Queue{Name: "any"}); err != nil {
		t.Fatalf("PermissionDenied: %v", err)
	}
}

// A closed transport is not healthy.
func TestCheckHealthAfterClose(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	tp := newHealthTransport(t, srv.Addr)
	_ = tp.Close()
	if err := checkHealth(t, tp, time.Second, transport.Queue{Name: "any"}); err == nil {
		t.Fatal("closed transport: healthy")
	}
}
