package memory_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/memory"
)

// The memory transport is healthy until it is closed.
func TestCheckHealth(t *testing.T) {
	tp := memory.New(memory.Options{})
	var hc transport.HealthChecker = tp
	if err := hc.CheckHealth(context.Background(), []transport.Queue{{Name: "q"}}); err != nil {
		t.Fatalf("open: %v", err)
	}
	_ = tp.Close()
	if err := hc.CheckHealth(context.Background(), nil); !errors.Is(err, memory.ErrClosed) {
		t.Fatalf("closed: %v, want ErrClosed", err)
	}
}
