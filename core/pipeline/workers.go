package pipeline

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// workers run a queue's handler chain on long-lived goroutines instead of
// the one Watermill's router starts for every message. A fresh goroutine
// starts with a small stack, and the chain's depth grew (copied) it on
// every message: about 3 µs per request, a fifth of the envelope decode,
// in the redis-sortedset-envelope profile. A worker's stack grows once.
//
// The router's goroutine waits for the worker, so what is in flight is
// unchanged. A message takes the worker that became idle last, or starts
// one when none is idle, so no message ever waits for another's handler:
// there are as many workers as messages were ever handled at once (bounded
// by the queue's credits). A worker puts itself back among the idle ones
// before it answers, so messages one after another share one. They stop
// when the queue is released (close) or work ends.
type workers struct {
	h       func(*message.Message) error
	mu      sync.Mutex
	idle    []*worker // a stack: the last idle first (its stack is warm)
	closed  bool
	started atomic.Int64 // workers started so far (tests)
}

// worker is one goroutine of a workers, fed through its own channel.
type worker struct{ jobs chan job }

// job is one message handed to a worker, and where its answer goes.
type job struct {
	m    *message.Message
	done chan error
}

// dones recycles the answer channels (one per message otherwise).
var dones = sync.Pool{New: func() any { return make(chan error, 1) }}

func newWorkers(work context.Context, h func(*message.Message) error) *workers {
	w := &workers{h: h}
	context.AfterFunc(work, w.close)
	return w
}

// run handles m on a worker and returns its error; once closed, on the
// caller's goroutine.
func (w *workers) run(m *message.Message) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return w.h(m)
	}
	var wk *worker
	if n := len(w.idle); n > 0 {
		wk = w.idle[n-1]
		w.idle[n-1] = nil
		w.idle = w.idle[:n-1]
	}
	w.mu.Unlock()
	if wk == nil {
		wk = &worker{jobs: make(chan job, 1)}
		w.started.Add(1)
		go w.loop(wk)
	}
	done := dones.Get().(chan error)
	wk.jobs <- job{m, done} // buffered: a worker taken from idle, or new, holds no job
	err := <-done
	dones.Put(done)
	return err
}

// loop handles wk's jobs until close closes its channel. Only an idle
// worker's channel is closed, so no job is left unanswered.
func (w *workers) loop(wk *worker) {
	for j := range wk.jobs {
		err := w.h(j.m)
		w.mu.Lock()
		closed := w.closed
		if !closed {
			w.idle = append(w.idle, wk)
		}
		w.mu.Unlock()
		j.done <- err
		if closed {
			return
		}
	}
}

// close stops the workers: the idle ones now, a busy one after its message.
// Later messages run on their callers' goroutines.
func (w *workers) close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	for _, wk := range w.idle {
		close(wk.jobs)
	}
	w.idle = nil
}
