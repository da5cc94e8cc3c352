package credit

import (
	"context"
	"sync"
)

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
func Both(queue *Pool, pool *Shared) Credits { return both{queue, pool} }

type both struct {
	queue *Pool
	pool  *Shared
}

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
func (b both) Max() int { return min(b.queue.Max(), b.pool.p.Max()) }

// Shared is a Pool several claim loops take from in turn: each Acquire
// waits behind the ones before it, so a loop that just got credits cannot
// take the next ones too while another waits (without it, the loop whose
// request just ended, woken last, tends to run first and win every freed
// credit: Go runs the goroutine readied last first). Release goes to the
// Pool directly.
type Shared struct {
	p  *Pool
	mu sync.Mutex
	q  []chan struct{} // waiting acquirers; q[0] may take credits
}

// NewShared returns p shared in turn.
func NewShared(p *Pool) *Shared { return &Shared{p: p} }

// Acquire waits for its turn, then for at least one credit, and takes up
// to want.
func (s *Shared) Acquire(ctx context.Context, want int) (int, error) {
	turn := make(chan struct{})
	s.mu.Lock()
	s.q = append(s.q, turn)
	first := len(s.q) == 1
	s.mu.Unlock()
	defer s.leave(turn)
	if !first {
		select {
		case <-turn:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return s.p.Acquire(ctx, want)
}

// leave removes turn from the line and, when it was first, hands the turn on.
func (s *Shared) leave(turn chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, t := range s.q {
		if t != turn {
			continue
		}
		s.q = append(s.q[:i], s.q[i+1:]...)
		if i == 0 && len(s.q) > 0 {
			close(s.q[0])
		}
		return
	}
}

// Release gives n credits back to the pool.
func (s *Shared) Release(n int) { s.p.Release(n) }
