package pipeline

import (
	"context"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

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
