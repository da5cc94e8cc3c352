package credit

import "context"

// Credits is what the claim loop takes before it claims and gives back as
// requests settle: one Pool, or a queue's Pool together with its worker
// pool's (Both).
type Credits interface {
	// Acquire waits until at least one credit is free and takes up to want.
	Acquire(ctx context.Context, want int) (int, error)
	// Release gives back n credits.
	Release(n int)
	// Max is the most credits ever granted at once.
	Max() int
}

var _ Credits = (*Pool)(nil)

// Both returns credits taken from queue and then from pool, so a queue's
// requests in flight stay within its own limit and, with the other queues
// of its worker pool, within the pool's. Waiting for the pool while holding
// queue credits is safe: a queue's credits serve only that queue.
func Both(queue, pool *Pool) Credits { return both{queue, pool} }

type both struct{ queue, pool *Pool }

// Acquire takes up to want queue credits, then as many pool credits as it
// can (at least one), and gives back the queue credits it could not pair.
func (b both) Acquire(ctx context.Context, want int) (int, error) {
	q, err := b.queue.Acquire(ctx, want)
	if err != nil {
		return 0, err
	}
	p, err := b.pool.Acquire(ctx, q)
	if err != nil {
		b.queue.Release(q)
		return 0, err
	}
	b.queue.Release(q - p)
	return p, nil
}

// Release gives n credits back to both.
func (b both) Release(n int) {
	b.pool.Release(n)
	b.queue.Release(n)
}

// Max is the smaller of the two maxima.
func (b both) Max() int { return min(b.queue.Max(), b.pool.Max()) }
