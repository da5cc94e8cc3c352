// Package dispatcher runs a sluice dispatcher for a transport's tests: the
// real pipeline (core/app) of a config, on a transport the test built. A
// test rig: only tests import it.
package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
)

// Run runs sluice of cfg with o (o.Transport the test's transport, the
// gates of o.Adapters registered by the test: an adapter package imports no
// other) until the returned stop is called, and at the latest when the
// test ends. It fails t when the dispatcher cannot start, ends with an
// error or takes over 30s to stop.
func Run(t testing.TB, cfg *config.Config, o app.Options) (a *app.App, stop func()) {
	t.Helper()
	a, err := app.New(cfg, o)
	if err != nil {
		t.Fatalf("app: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("app: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("app did not stop")
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// Runner is Run with ad, in the shape of submittest.Harness.Dispatch.
func Runner(ad app.Adapters) func(testing.TB, *config.Config, transport.Transport) {
	return func(t testing.TB, cfg *config.Config, tr transport.Transport) {
		t.Helper()
		Run(t, cfg, app.Options{Adapters: ad, Transport: tr})
	}
}
