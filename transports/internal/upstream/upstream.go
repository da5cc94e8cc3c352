// Package upstream holds what the Redis transports share with upstream
// llm-d-async: its producer's per-request cancellation keys, and the PING
// its /readyz sends.
package upstream

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
)

// CancelKey is upstream's cancellation key of a request id; a producer
// cancels a request by setting it to the request's token.
func CancelKey(id string) string { return "request-cancel:" + id }

// ActiveKey is upstream's key holding the token of a request id's latest
// enqueue (its producer sets it, with the deadline as expiry, when it
// enqueues; a cancellation copies it to CancelKey).
func ActiveKey(id string) string { return "request-active:" + id }

// Cancelled reports whether upstream's producer cancelled req: its cancel
// key holds req's token. Requests without a token (the flat form) cost no
// round trip.
func Cancelled(ctx context.Context, c redis.Cmdable, req *wire.Request) (bool, error) {
	if req.Token == "" {
		return false, nil
	}
	v, err := c.Get(ctx, CancelKey(req.ID)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check %s: %w", CancelKey(req.ID), err)
	}
	return v == req.Token, nil
}

// Ping is the health check of a Redis transport, as upstream's /readyz does
// it: one PING on the transport's client.
func Ping(ctx context.Context, c redis.Cmdable) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}
