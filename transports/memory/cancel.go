package memory

import (
	"container/heap"
	"context"
	"sync/atomic"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// cancels are the cancellations recorded by Cancel, checked before
// dispatch and reported to the watchers (the pipeline aborts the calls in
// flight). Guarded by Transport.mu, but for any, which lets Cancelled
// answer without the lock while nothing was ever cancelled.
type cancels struct {
	any      atomic.Bool
	jobs     map[string]struct{}
	requests map[string]struct{}
	watchers map[int]func(transport.Cancellation)
	next     int
}

// Cancel cancels what c names on request queue name: waiting and delayed
// requests of job c.JobID (metadata.job_id), or the one request
// c.RequestID, are removed from the queue (never dispatched, never
// answered); requests in flight are aborted by the pipeline's cancel watch
// and answered CANCELLED, and so is any such request handed back later. It
// returns how many requests it removed.
func (t *Transport) Cancel(name string, c transport.Cancellation) int {
	if c.JobID == "" && c.RequestID == "" {
		return 0
	}
	t.mu.Lock()
	cs := &t.cancels
	if c.JobID != "" {
		if cs.jobs == nil {
			cs.jobs = map[string]struct{}{}
		}
		cs.jobs[c.JobID] = struct{}{}
	}
	if c.RequestID != "" {
		if cs.requests == nil {
			cs.requests = map[string]struct{}{}
		}
		cs.requests[c.RequestID] = struct{}{}
	}
	cs.any.Store(true)
	match := func(it *item) bool {
		return (c.JobID != "" && it.job == c.JobID) || (c.RequestID != "" && it.id == c.RequestID)
	}
	n := 0
	if qu, ok := t.queues[name]; ok {
		n = removeMatching((*[]*item)(&qu.ready), &qu.ready, match) + removeMatching((*[]*item)(&qu.delayed), &qu.delayed, match)
	}
	fns := make([]func(transport.Cancellation), 0, len(cs.watchers))
	for _, fn := range cs.watchers {
		fns = append(fns, fn)
	}
	t.mu.Unlock()
	for _, fn := range fns {
		fn(c)
	}
	return n
}

// removeMatching drops the items of heap h (whose slice is s) that match,
// and restores the heap.
func removeMatching(s *[]*item, h heap.Interface, match func(*item) bool) int {
	kept := (*s)[:0]
	for _, it := range *s {
		if !match(it) {
			kept = append(kept, it)
		}
	}
	n := len(*s) - len(kept)
	clear((*s)[len(kept):])
	*s = kept
	if n > 0 {
		heap.Init(h)
	}
	return n
}

// Cancelled implements transport.CancelChecker: the request's job or id
// was cancelled through Cancel.
func (t *Transport) Cancelled(_ context.Context, _ transport.Queue, req *wire.Request) (bool, error) {
	if !t.cancels.any.Load() {
		return false, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if job := req.JobID(); job != "" {
		if _, ok := t.cancels.jobs[job]; ok {
			return true, nil
		}
	}
	_, ok := t.cancels.requests[req.ID]
	return ok, nil
}

// WatchCancellations implements transport.CancelWatcher: fn is called for
// every Cancel until ctx ends.
func (t *Transport) WatchCancellations(ctx context.Context, fn func(transport.Cancellation)) error {
	t.mu.Lock()
	if t.cancels.watchers == nil {
		t.cancels.watchers = map[int]func(transport.Cancellation){}
	}
	id := t.cancels.next
	t.cancels.next++
	t.cancels.watchers[id] = fn
	t.mu.Unlock()
	<-ctx.Done()
	t.mu.Lock()
	delete(t.cancels.watchers, id)
	t.mu.Unlock()
	return nil
}
