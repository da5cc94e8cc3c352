package producer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// defaultBatch is the most results one Next of a Submitter's readers
// returns when its options say none.
const defaultBatch = 256

// Submitter is the submit.Producer of the Redis sorted-set transport, on a
// Producer: requests are enqueued pipelined in chunks, a job is cancelled
// through the producer's job index (waiting requests answered CANCELLED at
// once, those in flight aborted), and a route is a Redis result list read
// durably (a result is leased into the list's pending set and comes back to
// another reader when the one holding it dies before its Ack).
type Submitter struct {
	p *Producer
	o submit.ReaderOptions
}

var (
	_ submit.Producer           = (*Submitter)(nil)
	_ submit.IdempotentProducer = (*Submitter)(nil)
	_ submit.RouteReopener      = (*Submitter)(nil)
)

// NewSubmitter returns the submit.Producer on p, whose readers take o
// (Batch default 256: one Next per that many results); Close closes p.
func NewSubmitter(p *Producer, o submit.ReaderOptions) *Submitter {
	return &Submitter{p: p, o: o.WithDefaults(defaultBatch)}
}

// OpenSubmitter is the transport's submit.Factory.New: a Submitter on a
// connection of its own, made as the redis-sortedset transport of options
// makes its connection in env (DialTransport: the dispatcher's url,
// topology and TLS, and its prefix). It returns no transport.
func OpenSubmitter(options json.RawMessage, env transport.Env) (submit.Producer, transport.Transport, error) {
	var to rss.Options
	if err := transport.DecodeOptions(options, &to); err != nil {
		return nil, nil, err
	}
	p, err := DialTransport(to, env, Config{})
	if err != nil {
		return nil, nil, err
	}
	return NewSubmitter(p, submit.ReaderOptions{}), nil, nil
}

// Enqueue implements submit.Producer (EnqueueMany: validated
// first, then pipelined in chunks).
func (s *Submitter) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	return s.p.EnqueueMany(ctx, queue, reqs)
}

// Cancel implements submit.Producer. A job's waiting requests are
// answered CANCELLED without dispatch and counted; a single request is
// answered CANCELLED when it comes up, or aborted in flight (-1: not
// counted).
func (s *Submitter) Cancel(ctx context.Context, _ string, c transport.Cancellation) (int, error) {
	switch {
	case c.JobID != "":
		n, err := s.p.CancelJob(ctx, c.JobID)
		if err != nil {
			return 0, err
		}
		if c.RequestID != "" {
			return n, s.p.CancelRequest(ctx, c.RequestID)
		}
		return n, nil
	case c.RequestID != "":
		return -1, s.p.CancelRequest(ctx, c.RequestID)
	}
	return 0, errors.New("cancel: neither a job nor a request id")
}

// SubmitIdempotent implements submit.IdempotentProducer
// (SubmitIdempotentMany: flat form, single node).
func (s *Submitter) SubmitIdempotent(ctx context.Context, queue string, reqs []*wire.Request, keys []string) ([]*submit.Submission, error) {
	return s.p.SubmitIdempotentMany(ctx, queue, reqs, keys)
}

// LookupSubmission implements submit.IdempotentProducer.
func (s *Submitter) LookupSubmission(ctx context.Context, key string) (*submit.Submission, error) {
	return s.p.LookupSubmission(ctx, key)
}

// Results implements submit.Producer: route is a Redis list key.
func (s *Submitter) Results(_ context.Context, route string) (submit.Reader, error) {
	if route == "" {
		return nil, errors.New("results: empty route")
	}
	return &reader{r: s.p.Results(route, ReaderOptions{Lease: s.o.Lease, Batch: s.o.Batch, PollInterval: 200 * time.Millisecond}), route: route}, nil
}

// ReopenResults implements submit.RouteReopener
// (ResultReader.Reopen).
func (s *Submitter) ReopenResults(ctx context.Context, route string) (submit.Reader, error) {
	rd, err := s.Results(ctx, route)
	if err != nil {
		return nil, err
	}
	r := rd.(*reader)
	ls, err := r.r.Reopen(ctx)
	if err != nil {
		return nil, err
	}
	r.held = r.wrap(ls)
	return r, nil
}

// Capabilities implements submit.Producer: Redis keeps queued requests and
// unacked results; a request id enqueued twice is queued twice, unless it
// is submitted idempotently (on a single node, flat form).
func (s *Submitter) Capabilities() submit.Capabilities {
	return submit.Capabilities{Durable: true, Idempotent: s.p.IdempotentSubmits() == nil}
}

// Redis returns the connection the producer reaches the queues on (the
// transport's), for state that must live beside them (the Batch API's
// redis state); its Close is the producer's.
func (s *Submitter) Redis() redis.UniversalClient { return s.p.Client() }

// Close implements submit.Producer.
func (s *Submitter) Close() error { return s.p.Close() }

type reader struct {
	r     *ResultReader
	route string
	// held are the results a reopen took over, handed out by the first Next.
	held []submit.Result
}

// Next implements submit.Reader.
func (r *reader) Next(ctx context.Context) ([]submit.Result, error) {
	if len(r.held) > 0 {
		out := r.held
		r.held = nil
		return out, nil
	}
	ls, err := r.r.Next(ctx)
	if err != nil {
		return nil, err
	}
	return r.wrap(ls), nil
}

// wrap makes leases submit's results.
func (r *reader) wrap(ls []ResultLease) []submit.Result {
	out := make([]submit.Result, len(ls))
	for i, l := range ls {
		out[i] = submit.Result{Raw: []byte(l.Raw), Result: l.Result, Err: l.Err, Lease: l}
		if l.Result != nil {
			out[i].ID = l.Result.ID
		}
	}
	return out
}

// Ack implements submit.Reader.
func (r *reader) Ack(ctx context.Context, rs ...submit.Result) error {
	ls := make([]ResultLease, 0, len(rs))
	for _, res := range rs {
		l, ok := res.Lease.(ResultLease)
		if !ok {
			return fmt.Errorf("ack on %s: result %q has no lease of this reader", r.route, res.ID)
		}
		ls = append(ls, l)
	}
	return r.r.Ack(ctx, ls...)
}

// Close implements submit.Reader: what it leased and did not ack comes
// back after its lease.
func (r *reader) Close() error { return nil }
