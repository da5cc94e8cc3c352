package pipeline

// Cancellation, in one place. A request can be cancelled at three moments,
// and each has its step here: before dispatch (cancelCheck asks the
// transport's CancelChecker once the request is decoded), after waiting in
// admission (cancelRecheck asks again), and during its call (the request is
// registered in the inflightIndex, whose entries the transport's announced
// cancellations (watchCancellations) and the poll of per-request cancel
// markers (pollCancels) abort with cause errCancelled). The dispatch handler
// turns that cause into a CANCELLED result.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/mutant"
)

// errCancelled is the cancellation cause of a request whose job or id was cancelled.
var errCancelled = errors.New("request cancelled")

// cancelCheck answers CANCELLED for a request the transport says was cancelled
// before dispatch, and registers the request in inflight (when not nil) so a
// cancellation during dispatch aborts its HTTP call.
func cancelCheck(checker transport.CancelChecker, inflight *inflightIndex, log *slog.Logger) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			if checker != nil && cancelledNow(checker, d, log) {
				return fail(d, wire.CodeCancelled, "cancelled before dispatch"), nil
			}
			if inflight != nil {
				ctx, cancel := context.WithCancelCause(d.Ctx)
				done := inflight.Register(d.Queue.Queue, d.Req, cancel)
				defer func() {
					done()
					cancel(nil)
				}()
				d.Ctx = ctx
			}
			return next(m)
		}
	}
}

// cancelRecheck checks the cancellation again, right before the dispatch,
// of a request that waited in admission (a gate's Wait, or for a worker of
// the lanes): a cancel that took effect while it waited ends it CANCELLED
// instead of being dispatched. A request admitted at once is not checked
// again (cancelCheck ran one gate answer earlier; a cancel during the
// dispatch aborts the call through the watcher), which spares the round
// trip some transports' checks cost.
func cancelRecheck(checker transport.CancelChecker, log *slog.Logger) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			d := deliveryOf(m)
			if checker == nil || !d.waited || mutant.On(mutant.CancelOnlyAtClaim) {
				return next(m)
			}
			if cancelledNow(checker, d, log) {
				return fail(d, wire.CodeCancelled, "cancelled while waiting for admission"), nil
			}
			return next(m)
		}
	}
}

// cancelledNow asks checker whether d's request was cancelled, bounded by
// the request's deadline. The check is best effort: a failure is logged and
// the request dispatched, as dispatching a request that was cancelled
// wastes capacity, dropping one loses it.
func cancelledNow(checker transport.CancelChecker, d *delivery, log *slog.Logger) bool {
	ctx, cancel := context.WithDeadline(d.Ctx, d.Req.Deadline)
	cancelled, err := checker.Cancelled(ctx, d.Queue.Queue, d.Req)
	cancel()
	if err != nil {
		log.Warn("cancellation check failed; dispatching", "queue", d.Queue.ID, "id", d.Req.ID, "err", err)
	}
	return cancelled
}

// inflightIndex indexes the requests being dispatched by id and by job, so a
// cancellation reported by the transport can abort their HTTP calls. Cost:
// one map insert and delete per request, under one mutex.
type inflightIndex struct {
	mu    sync.Mutex
	byID  map[string]*inflightEntry
	byJob map[string]map[*inflightEntry]struct{}
}

type inflightEntry struct {
	job    string
	cancel context.CancelCauseFunc
	// For the poll of per-request cancel markers (pollCancels): the
	// request's id and token only (the handler owns the request; the poll
	// reads nothing it may change), its queue and when it was registered.
	id, token string
	q         transport.Queue
	since     time.Time
}

// newInflightIndex returns an empty index.
func newInflightIndex() *inflightIndex {
	return &inflightIndex{byID: map[string]*inflightEntry{}, byJob: map[string]map[*inflightEntry]struct{}{}}
}

// Register adds req of queue q; cancel aborts its work. The returned func
// removes it.
func (f *inflightIndex) Register(q transport.Queue, req *wire.Request, cancel context.CancelCauseFunc) (done func()) {
	e := &inflightEntry{job: req.JobID(), cancel: cancel, q: q}
	if req.Token != "" {
		e.id, e.token, e.since = req.ID, req.Token, time.Now()
	}
	f.mu.Lock()
	f.byID[req.ID] = e
	if e.job != "" {
		set := f.byJob[e.job]
		if set == nil {
			set = map[*inflightEntry]struct{}{}
			f.byJob[e.job] = set
		}
		set[e] = struct{}{}
	}
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.byID[req.ID] == e {
			delete(f.byID, req.ID)
		}
		if set := f.byJob[e.job]; set != nil {
			delete(set, e)
			if len(set) == 0 {
				delete(f.byJob, e.job)
			}
		}
		f.mu.Unlock()
	}
}

// Cancel aborts the in-flight requests named by c, with cause errCancelled,
// and returns how many it aborted.
func (f *inflightIndex) Cancel(c transport.Cancellation) int {
	var victims []*inflightEntry
	f.mu.Lock()
	if c.RequestID != "" {
		if e := f.byID[c.RequestID]; e != nil {
			victims = append(victims, e)
		}
	}
	if c.JobID != "" {
		for e := range f.byJob[c.JobID] {
			victims = append(victims, e)
		}
	}
	f.mu.Unlock()
	for _, e := range victims {
		e.cancel(errCancelled)
	}
	return len(victims)
}

// tokened returns the registered requests that carry a request token
// (upstream's per-request cancel marker) and were registered at or before
// upTo, appended to into.
func (f *inflightIndex) tokened(upTo time.Time, into []*inflightEntry) []*inflightEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.byID {
		if !e.since.IsZero() && !e.since.After(upTo) {
			into = append(into, e)
		}
	}
	return into
}

// Len returns how many requests are registered.
func (f *inflightIndex) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byID)
}

// watchCancellations aborts the calls of requests cancelled while in
// flight, when the transport reports cancellations.
func (p *Pipeline) watchCancellations(work context.Context) {
	cw, ok := p.cfg.Transport.(transport.CancelWatcher)
	if !ok {
		return
	}
	go func() {
		err := cw.WatchCancellations(work, func(c transport.Cancellation) {
			if n := p.inflight.Cancel(c); n > 0 {
				p.log.Info("aborted cancelled requests in flight", "job", c.JobID, "id", c.RequestID, "count", n)
			}
		})
		if err != nil && work.Err() == nil {
			p.log.Error("cancellation watch ended", "err", err)
		}
	}()
}

// Polling upstream's per-request cancel markers.
//
// Upstream's producer cancels a request by writing request-cancel:<id>;
// nothing announces it. Upstream's dispatcher (v0.10, U-494) reads the
// marker again every second while a request's call runs and aborts the call
// when it holds the request's token. pollCancels does the same for every
// request with a request token registered at least cancelPollEvery ago
// (waiting in admission or in its call): each tick asks the transport's
// CancelChecker about all of them at once (the checks of one tick share
// round trips: transports/internal/upstream.CancelReader), and a request
// found cancelled is aborted and answered CANCELLED. Requests without a
// token are not polled: their cancellations are announced
// (CancelWatcher).
const (
	cancelPollEvery = time.Second
	// cancelPollParallel bounds the checks of one tick running at once.
	cancelPollParallel = 256
)

// pollCancels runs the poll until work ends.
func (p *Pipeline) pollCancels(work context.Context) {
	checker, ok := p.cfg.Transport.(transport.CancelChecker)
	if !ok || p.inflight == nil {
		return
	}
	go func() {
		t := time.NewTicker(cancelPollEvery)
		defer t.Stop()
		var due []*inflightEntry
		sem := make(chan struct{}, cancelPollParallel)
		var wg sync.WaitGroup
		for {
			select {
			case <-work.Done():
				return
			case now := <-t.C:
				due = p.inflight.tokened(now.Add(-cancelPollEvery), due[:0])
				for _, e := range due {
					sem <- struct{}{}
					wg.Add(1)
					go func() {
						defer func() { <-sem; wg.Done() }()
						ctx, cancel := context.WithTimeout(work, cancelPollEvery)
						defer cancel()
						req := &wire.Request{ID: e.id, Token: e.token}
						if c, err := checker.Cancelled(ctx, e.q, req); err == nil && c {
							e.cancel(errCancelled)
							p.log.Info("aborted a request cancelled in flight", "queue", e.q.Name, "id", e.id)
						}
					}()
				}
				wg.Wait()
				clear(due)
			}
		}
	}()
}
