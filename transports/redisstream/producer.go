package redisstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	wmredis "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// defaultBatch is the most results one Next of a Producer's readers
// returns when its options say none.
const defaultBatch = 256

// chunk is how many XADDs one pipeline of Producer.Enqueue carries.
const chunk = 1000

// Producer is the submit.Producer of the Redis Streams transport: requests
// are XADDed to the request stream in watermill-redisstream's entry format,
// pipelined; a job or a request is cancelled through the transport's cancel
// keys (Cancel: queued requests are answered CANCELLED without dispatch
// when they come up, those in flight aborted); and a route is a Redis
// result list read durably (a result is leased into the sorted set
// <route>:pending and comes back to another reader when the one holding it
// dies before its Ack).
//
// Routes are lists: the transport's result_mode must be "list" (its
// default).
type Producer struct {
	client    *redis.Client
	own       bool
	cancelKey string
	o         submit.ReaderOptions
	seq       atomic.Uint64
	prefix    string
}

var _ submit.Producer = (*Producer)(nil)

// NewProducer returns a producer on client, with the transport's options
// to (for its cancel_key; its result_mode must be "list"), whose readers
// take o (Batch default 256: one Next per that many results); Close leaves
// client open.
func NewProducer(client *redis.Client, to Options, o submit.ReaderOptions) (*Producer, error) {
	if err := checkProducerOptions(to); err != nil {
		return nil, err
	}
	key := to.CancelKey
	if key == "" {
		key = DefaultCancelKey
	}
	return &Producer{client: client, cancelKey: key, o: o.WithDefaults(defaultBatch),
		prefix: strconv.FormatInt(time.Now().UnixNano(), 36) + "-s"}, nil
}

// DialProducer builds a producer on a client of its own for the
// transport's options to and env (the client NewClient builds, as the
// dispatcher's); Close closes it.
func DialProducer(to Options, env transport.Env, o submit.ReaderOptions) (*Producer, error) {
	if err := checkProducerOptions(to); err != nil {
		return nil, err
	}
	client, to, err := NewClient(to, env)
	if err != nil {
		return nil, err
	}
	p, err := NewProducer(client, to, o)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	p.own = true
	return p, nil
}

// OpenProducer is the transport's submit.Factory.New: DialProducer on the
// transport's options. It returns no transport.
func OpenProducer(options json.RawMessage, env transport.Env) (submit.Producer, transport.Transport, error) {
	var to Options
	if err := transport.DecodeOptions(options, &to); err != nil {
		return nil, nil, err
	}
	p, err := DialProducer(to, env, submit.ReaderOptions{})
	if err != nil {
		return nil, nil, err
	}
	return p, nil, nil
}

// CheckProducerOptions is the transport's submit.Factory.Check: options
// (decoded leniently: the transport checks them strictly) must leave the
// results in lists, which a producer's readers read.
func CheckProducerOptions(options json.RawMessage) error {
	var to Options
	if len(options) > 0 {
		_ = json.Unmarshal(options, &to)
	}
	return checkProducerOptions(to)
}

func checkProducerOptions(to Options) error {
	if to.ResultMode != "" && to.ResultMode != ResultList {
		return fmt.Errorf("redis-stream result_mode %q: the fronts read their result routes as lists (result_mode %q, the default)", to.ResultMode, ResultList)
	}
	return nil
}

// Enqueue implements submit.Producer: every request encoded first (one
// that does not encode fails the call before anything is written), then
// XADDed in order, pipelined. An error part-way leaves the earlier ones
// queued.
func (p *Producer) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	values := make([]map[string]any, len(reqs))
	for i, r := range reqs {
		b, err := wire.EncodeRequest(r)
		if err != nil {
			return fmt.Errorf("enqueue to %s: %w", queue, err)
		}
		v, err := wmredis.DefaultMarshallerUnmarshaller{}.Marshal(queue, message.NewMessage(p.prefix+strconv.FormatUint(p.seq.Add(1), 36), b))
		if err != nil {
			return fmt.Errorf("enqueue to %s: %w", queue, err)
		}
		values[i] = v
	}
	for len(values) > 0 {
		n := min(len(values), chunk)
		if _, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for _, v := range values[:n] {
				pl.XAdd(ctx, &redis.XAddArgs{Stream: queue, Values: v})
			}
			return nil
		}); err != nil {
			return fmt.Errorf("enqueue to %s: %w", queue, err)
		}
		values = values[n:]
	}
	return nil
}

// Cancel implements submit.Producer (the package's Cancel): the requests
// of the job or the request are answered CANCELLED without dispatch when
// a dispatcher claims them, and aborted in flight. It cannot count them
// (-1).
func (p *Producer) Cancel(ctx context.Context, _ string, c transport.Cancellation) (int, error) {
	if err := Cancel(ctx, p.client, p.cancelKey, c, 0); err != nil {
		return 0, err
	}
	return -1, nil
}

// Results implements submit.Producer: route is a Redis list key.
func (p *Producer) Results(_ context.Context, route string) (submit.Reader, error) {
	if route == "" {
		return nil, errors.New("results: empty route")
	}
	return &reader{p: p, list: route, pending: route + ":pending"}, nil
}

// Capabilities implements submit.Producer: Redis keeps queued requests and
// unacked results; a request id enqueued twice is queued twice.
func (p *Producer) Capabilities() submit.Capabilities { return submit.Capabilities{Durable: true} }

// Redis returns the connection the producer reaches the stream on (the
// transport's), for state that must live beside it (the Batch API's redis
// state); its Close is the producer's.
func (p *Producer) Redis() redis.UniversalClient { return p.client }

// Close implements submit.Producer.
func (p *Producer) Close() error {
	if p.own {
		return p.client.Close()
	}
	return nil
}

// leaseScript hands out up to ARGV[1] results of list KEYS[1], each leased
// in sorted set KEYS[2] until now + ARGV[2] ms: first those whose lease
// lapsed, then the oldest of the list.
var leaseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local exp = now + tonumber(ARGV[2])
local out = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, n)
for _, m in ipairs(out) do
  redis.call('ZADD', KEYS[2], exp, m)
end
while #out < n do
  local m = redis.call('RPOP', KEYS[1])
  if not m then break end
  redis.call('ZADD', KEYS[2], exp, m)
  out[#out + 1] = m
end
return out
`)

type reader struct {
	p             *Producer
	list, pending string
}

// Next implements submit.Reader: it looks at once, then again after 5 ms,
// doubling up to 200 ms while the route is empty.
func (r *reader) Next(ctx context.Context) ([]submit.Result, error) {
	wait := 5 * time.Millisecond
	for {
		raw, err := leaseScript.Run(ctx, r.p.client, []string{r.list, r.pending}, r.p.o.Batch, r.p.o.Lease.Milliseconds()).StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("read results from %s: %w", r.list, err)
		}
		if len(raw) > 0 {
			out := make([]submit.Result, len(raw))
			for i, s := range raw {
				out[i] = submit.Result{Raw: []byte(s), Lease: s}
				out[i].Result, out[i].Err = wire.DecodeResult([]byte(s))
				if out[i].Result != nil {
					out[i].ID = out[i].Result.ID
				}
			}
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, 200*time.Millisecond)
	}
}

// Ack implements submit.Reader.
func (r *reader) Ack(ctx context.Context, rs ...submit.Result) error {
	if len(rs) == 0 {
		return nil
	}
	members := make([]any, len(rs))
	for i, res := range rs {
		s, ok := res.Lease.(string)
		if !ok {
			return fmt.Errorf("ack on %s: result %q has no lease of this reader", r.list, res.ID)
		}
		members[i] = s
	}
	if err := r.p.client.ZRem(ctx, r.pending, members...).Err(); err != nil {
		return fmt.Errorf("ack %d result(s) of %s: %w", len(rs), r.list, err)
	}
	return nil
}

// Close implements submit.Reader: what it leased and did not ack comes
// back after its lease.
func (r *reader) Close() error { return nil }
