package redisstream

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice/core/transport"
)

var _ transport.HealthChecker = (*Transport)(nil)

// CheckHealth implements transport.HealthChecker as upstream does: one Redis
// PING on the transport's client, whatever the queues.
func (t *Transport) CheckHealth(ctx context.Context, _ []transport.Queue) error {
	if err := t.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}
