// Package redissortedset is the front/submit adapter of the Redis
// sorted-set transport, on its producer (transports/redissortedset/producer):
// requests are enqueued pipelined in chunks, a job is cancelled through the
// producer's job index (waiting requests answered CANCELLED at once, those
// in flight aborted), and a route is a Redis result list read durably (a
// result is leased into the list's pending set and comes back to another
// reader when the one holding it dies before its Ack).
package redissortedset

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/submit"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// Options configure a Producer's result readers (Batch default 256: one
// Next per that many results).
type Options = submit.ReaderOptions

// defaultBatch is the most results one Next returns when Options say none.
const defaultBatch = 256

// Producer is the submit.Producer of the Redis sorted-set transport.
type Producer struct {
	p *producer.Producer
	o Options
}

var (
	_ submit.Producer           = (*Producer)(nil)
	_ submit.IdempotentProducer = (*Producer)(nil)
	_ submit.RouteReopener      = (*Producer)(nil)
)

// New returns a producer on p; Close closes p.
func New(p *producer.Producer, o Options) *Producer {
	o = o.WithDefaults(defaultBatch)
	return &Producer{p: p, o: o}
}

// Dial returns a producer on a connection of its own, made as the
// redis-sortedset transport of options to makes its connection in env
// (producer.DialTransport: the dispatcher's url, topology and TLS, and its
// prefix); Close closes it.
func Dial(to rss.Options, env transport.Env, o Options) (*Producer, error) {
	p, err := producer.DialTransport(to, env, producer.Config{})
	if err != nil {
		return nil, fmt.Errorf("redis-sortedset producer: %w", err)
	}
	return New(p, o), nil
}

// Enqueue implements submit.Producer (producer.EnqueueMany: validated
// first, then pipelined in chunks).
func (p *Producer) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	return p.p.EnqueueMany(ctx, queue, reqs)
}

// Cancel implements submit.Producer. A job's waiting requests are
// answered CANCELLED without dispatch and counted; a single request is
// answered CANCELLED when it comes up, or aborted in flight (-1: not
// counted).
func (p *Producer) Cancel(ctx context.Context, _ string, c transport.Cancellation) (int, error) {
	switch {
	case c.JobID != "":
		n, err := p.p.CancelJob(ctx, c.JobID)
		if err != nil {
			return 0, err
		}
		if c.RequestID != "" {
			return n, p.p.CancelRequest(ctx, c.RequestID)
		}
		return n, nil
	case c.RequestID != "":
		return -1, p.p.CancelRequest(ctx, c.RequestID)
	}
	return 0, errors.New("cancel: neither a job nor a request id")
}

// SubmitIdempotent implements submit.IdempotentProducer
// (producer.SubmitIdempotentMany: flat form, single node).
func (p *Producer) SubmitIdempotent(ctx context.Context, queue string, reqs []*wire.Request, keys []string) ([]*submit.Submission, error) {
	subs, err := p.p.SubmitIdempotentMany(ctx, queue, reqs, keys)
	if subs == nil && err != nil {
		return nil, err
	}
	out := make([]*submit.Submission, len(subs))
	for i, s := range subs {
		out[i] = submissionOf(s)
	}
	return out, asSubmitErr(err)
}

// LookupSubmission implements submit.IdempotentProducer.
func (p *Producer) LookupSubmission(ctx context.Context, key string) (*submit.Submission, error) {
	s, err := p.p.LookupSubmission(ctx, key)
	if err != nil {
		return nil, asSubmitErr(err)
	}
	return submissionOf(s), nil
}

func submissionOf(s *producer.Submission) *submit.Submission {
	if s == nil {
		return nil
	}
	return &submit.Submission{Key: s.Key, RequestToken: s.RequestToken, IdentitySHA256: s.IdentitySHA256,
		RequestRoute: s.RequestRoute, ResultRoute: s.ResultRoute, Submitted: s.Submitted, Replayed: s.Replayed}
}

// asSubmitErr makes the producer's errors match submit's sentinels too.
func asSubmitErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, producer.ErrIdempotencyConflict):
		return &sentinelErr{err: err, is: submit.ErrIdempotencyConflict}
	case errors.Is(err, producer.ErrSubmissionNotFound):
		return &sentinelErr{err: err, is: submit.ErrSubmissionNotFound}
	}
	return err
}

// sentinelErr is err, also matching is.
type sentinelErr struct{ err, is error }

func (e *sentinelErr) Error() string   { return e.err.Error() }
func (e *sentinelErr) Unwrap() []error { return []error{e.err, e.is} }

// Results implements submit.Producer: route is a Redis list key.
func (p *Producer) Results(_ context.Context, route string) (submit.Reader, error) {
	if route == "" {
		return nil, errors.New("results: empty route")
	}
	return &reader{r: p.p.Results(route, producer.ReaderOptions{Lease: p.o.Lease, Batch: p.o.Batch, PollInterval: 200 * time.Millisecond}), route: route}, nil
}

// ReopenResults implements submit.RouteReopener
// (producer.ResultReader.Reopen).
func (p *Producer) ReopenResults(ctx context.Context, route string) (submit.Reader, error) {
	rd, err := p.Results(ctx, route)
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
func (p *Producer) Capabilities() submit.Capabilities {
	return submit.Capabilities{Durable: true, Idempotent: p.p.IdempotentSubmits() == nil}
}

// Redis returns the connection the producer reaches the queues on (the
// transport's), for state that must live beside them (the Batch API's
// redis state); its Close is the producer's.
func (p *Producer) Redis() redis.UniversalClient { return p.p.Client() }

// Close implements submit.Producer.
func (p *Producer) Close() error { return p.p.Close() }

type reader struct {
	r     *producer.ResultReader
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
func (r *reader) wrap(ls []producer.ResultLease) []submit.Result {
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
	ls := make([]producer.ResultLease, 0, len(rs))
	for _, res := range rs {
		l, ok := res.Lease.(producer.ResultLease)
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
