// Package upstream holds what the Redis transports share with upstream
// llm-d-async: its producer's per-request cancellation keys, and the PING
// its /readyz sends.
package upstream

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// CancelKey is upstream's cancellation key of a request id; a producer
// cancels a request by setting it to the request's token.
func CancelKey(id string) string { return "request-cancel:" + id }

// ActiveKey is upstream's key holding the token of a request id's latest
// enqueue (its producer sets it, with the deadline as expiry, when it
// enqueues; a cancellation copies it to CancelKey).
func ActiveKey(id string) string { return "request-active:" + id }

// Ping is the health check of a Redis transport, as upstream's /readyz does
// it: one PING on the transport's client.
func Ping(ctx context.Context, c redis.Cmdable) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}
