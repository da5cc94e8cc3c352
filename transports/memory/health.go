package memory

import (
	"context"

	"github.com/sluice-io/sluice/core/transport"
)

var _ transport.HealthChecker = (*Transport)(nil)

// CheckHealth implements transport.HealthChecker: the in-process queues are
// always usable until the transport is closed.
func (t *Transport) CheckHealth(context.Context, []transport.Queue) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	return nil
}
