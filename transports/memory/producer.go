package memory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// defaultBatch is the most results one Next of a Producer's readers
// returns when its options say none.
const defaultBatch = 1000

// Producer is the submit.Producer of a memory transport: requests go onto
// its in-process queues, results are read from its result lists, one per
// route, leased and acked.
//
// Nothing survives the process (Capabilities.Durable is false): a front on
// it serves a single node, in the same process as the dispatcher.
type Producer struct {
	t *Transport
	o submit.ReaderOptions
}

var _ submit.Producer = (*Producer)(nil)

// NewProducer returns a producer on t (the transport the dispatcher runs
// on), whose readers take o (Batch default 1000: one Next per that many
// results); Close leaves t open.
func NewProducer(t *Transport, o submit.ReaderOptions) *Producer {
	return &Producer{t: t, o: o.WithDefaults(defaultBatch)}
}

// OpenProducer is the transport's submit.Factory.New: a transport of
// options (as Factory builds it) and a producer on it. The dispatcher must run on the
// transport returned, the only way to its queues.
func OpenProducer(options json.RawMessage, _ transport.Env) (submit.Producer, transport.Transport, error) {
	var o Options
	if err := transport.DecodeOptions(options, &o); err != nil {
		return nil, nil, err
	}
	t := New(o)
	return NewProducer(t, submit.ReaderOptions{}), t, nil
}

// Enqueue implements submit.Producer: all of reqs in one step, or none
// when one does not encode.
func (p *Producer) Enqueue(_ context.Context, queue string, reqs []*wire.Request) error {
	payloads := make([][]byte, len(reqs))
	for i, r := range reqs {
		b, err := wire.EncodeRequest(r)
		if err != nil {
			return fmt.Errorf("enqueue to %s: %w", queue, err)
		}
		payloads[i] = b
	}
	if err := p.t.EnqueueMany(queue, payloads); err != nil {
		return fmt.Errorf("enqueue to %s: %w", queue, err)
	}
	return nil
}

// Cancel implements submit.Producer: waiting requests are removed (and
// counted), those in flight are aborted.
func (p *Producer) Cancel(_ context.Context, queue string, c transport.Cancellation) (int, error) {
	if c.JobID == "" && c.RequestID == "" {
		return 0, errors.New("cancel: neither a job nor a request id")
	}
	return p.t.Cancel(queue, c), nil
}

// Results implements submit.Producer.
func (p *Producer) Results(_ context.Context, route string) (submit.Reader, error) {
	if route == "" {
		return nil, errors.New("results: empty route")
	}
	return &reader{p: p, route: route}, nil
}

// Capabilities implements submit.Producer: nothing survives the process,
// and an id enqueued twice is queued twice.
func (p *Producer) Capabilities() submit.Capabilities { return submit.Capabilities{} }

// Close implements submit.Producer; the transport stays open.
func (p *Producer) Close() error { return nil }

type reader struct {
	p     *Producer
	route string
}

// Next implements submit.Reader. It looks again at every publish, and at
// least every quarter lease (a lapsed lease of another reader publishes
// nothing).
func (r *reader) Next(ctx context.Context) ([]submit.Result, error) {
	poll := min(r.p.o.Lease/4, time.Second)
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for {
		ls, more := r.p.t.LeaseResults(r.route, r.p.o.Batch, r.p.o.Lease)
		if len(ls) > 0 {
			out := make([]submit.Result, len(ls))
			for i, l := range ls {
				out[i] = submit.Result{Raw: l.Payload, Lease: l.Token}
				out[i].Result, out[i].Err = wire.DecodeResult(l.Payload)
				if out[i].Result != nil {
					out[i].ID = out[i].Result.ID
				}
			}
			return out, nil
		}
		timer.Reset(poll)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-more:
		case <-timer.C:
		}
	}
}

// Ack implements submit.Reader.
func (r *reader) Ack(_ context.Context, rs ...submit.Result) error {
	toks := make([]uint64, 0, len(rs))
	for _, res := range rs {
		tok, ok := res.Lease.(uint64)
		if !ok {
			return fmt.Errorf("ack on %s: result %q has no lease of this reader", r.route, res.ID)
		}
		toks = append(toks, tok)
	}
	r.p.t.AckResults(r.route, toks...)
	return nil
}

// Close implements submit.Reader; what it leased and did not ack is handed
// out again after its lease.
func (r *reader) Close() error { return nil }
