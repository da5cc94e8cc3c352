package gcppubsub

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"

	"github.com/sluice-io/sluice/core/transport"
)

// Upstream's readiness rule: the receive loop's last outcome decides for
// 30 s (an error newer than the last message is unhealthy, a recent
// message healthy); past that the subscription is probed. The probe here
// always fails, so a verdict reached without it shows the history decided.
func TestCheckHealthReadsReceiveHistory(t *testing.T) {
	srv := pstest.NewServer(pstest.WithErrorInjection("GetSubscription", codes.NotFound, "probe refused"))
	t.Cleanup(func() { _ = srv.Close() })
	tp, err := New(Options{ProjectID: "p", EmulatorHost: srv.Addr}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	now := time.Unix(1_800_000_000, 0)
	tp.now = func() time.Time { return now }
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return tp.CheckHealth(ctx, []transport.Queue{{Name: "sub"}})
	}
	h := tp.history("sub")

	h.received(now.Add(-10 * time.Second))
	if err := check(); err != nil {
		t.Errorf("message 10 s ago: %v", err)
	}
	h.failed(now.Add(-5*time.Second), errors.New("stream broke"))
	if err := check(); err == nil || !strings.Contains(err.Error(), "stream broke") || strings.Contains(err.Error(), "probe refused") {
		t.Errorf("error 5 s ago, after the last message: %v", err)
	}
	h.received(now.Add(-time.Second))
	if err := check(); err != nil {
		t.Errorf("message after the error: %v", err)
	}
	now = now.Add(time.Minute) // the history is stale: the probe decides
	if err := check(); err == nil || !strings.Contains(err.Error(), "probe refused") {
		t.Errorf("stale history: %v", err)
	}
}
