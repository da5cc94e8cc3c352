// Package producer is the client side of sluice's Redis sorted-set
// transport: enqueue requests (one, or many pipelined), cancel a job or a
// request, and read results durably (each result is leased, and comes back
// to another reader if the one holding it crashes before it acks).
//
// Requests are written in the flat form with a leading "_sluice" member that
// keeps requests with equal deadlines in enqueue order and indexes them by
// job (metadata.job_id), so cancelling a job costs O(requests of the job).
// The messages stay readable by any consumer of the flat form.
//
//	p, err := producer.Dial(os.Getenv("REDIS_URL"), producer.Config{})
//	q := p.Names().RequestQueue("pool-a")       // llm-d-async:requests:pool-a
//	err = p.EnqueueMany(ctx, q, reqs)
//	r := p.Results(p.Names().ResultQueue("pool-a", ""), producer.ReaderOptions{})
//	leases, err := r.Next(ctx)                  // ... handle, then:
//	err = r.Ack(ctx, leases...)
package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/internal/cancelset"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// RequestQueueName is the request queue of pool under the default prefix.
func RequestQueueName(pool string) string { return rss.RequestQueueName(pool) }

// ResultQueueName is the result list of pool and tenant ("$batch" when
// empty) under the default prefix.
func ResultQueueName(pool, tenant string) string { return rss.ResultQueueName(pool, tenant) }

// Names is the key layout under a prefix (see Config.Prefix).
type Names = keys.Names

// Config configures a Producer.
type Config struct {
	// Prefix is the key prefix (default llm-d-async); it must match the
	// dispatcher's "prefix" option.
	Prefix string
	// JobIndexTTL is how long a job's index outlives the latest deadline of
	// its requests (default 1h).
	JobIndexTTL time.Duration
	// CancelTTL is how long a cancellation is remembered (default 7 days, as upstream).
	CancelTTL time.Duration
	// ChunkSize is how many requests one enqueue script call carries (default 500).
	ChunkSize int
	// TopologyOptions are how Dial reaches the URL (redisclient's mode,
	// addrs and master_name, as in the transport's options): single
	// (default), cluster (URL redis://host:port?addr=host2:port2) or
	// sentinel (the URL's host is a sentinel; MasterName required). New
	// reads the mode from the client it is given.
	rss.TopologyOptions
	// MinReplicasAcked, when above 0, makes an enqueue, a result lease
	// (ResultReader.Next) and a result ack return only once that many
	// replicas of the key's master hold it (Redis WAIT), so a failover
	// right after it loses nothing and hands out no result twice. 0
	// (default): acked by the master alone.
	MinReplicasAcked int
	// MinReplicasTimeout bounds the wait for replicas (default 5s); a call
	// still short of them then fails, though it may have been written
	// (enqueueing again adds the requests a second time).
	MinReplicasTimeout time.Duration
	// Envelope writes requests as upstream llm-d-async's producer does
	// (main after v0.10): the tagged envelope with a fresh request_token,
	// request_queue_name, result_queue_name and the enqueue sequence
	// internal.enqueue_seq of upstream's request-seq:<queue>:<deadline>
	// counter, scored deadline + seq/2^21, with upstream's
	// request-active:<id> and request-cancel:<id> keys; created and deadline
	// are written in whole seconds (rounded down) as upstream reads them. Requests so written
	// are read by upstream replicas too (which drop the flat form), and
	// equal deadlines keep their enqueue order across this producer and
	// upstream's. They are not indexed by job: CancelJob answers them
	// CANCELLED when they come up. Single node only.
	Envelope bool
	// ResultQueueName is the internal.result_queue_name of envelopes whose
	// request names none (Envelope only; upstream's producer requires one).
	ResultQueueName string
	// PayloadKeys (with Envelope) keeps each payload in its own key,
	// request-payload:<id>:<token>, as upstream's WithPayloadKeys: the
	// envelope carries "payload":null and internal.payload_ref, the
	// dispatcher reads the payload after its claim and deletes the key
	// with the result. Redis needs maxmemory-policy noeviction.
	PayloadKeys bool
	// SubmissionRetention is how long SubmitIdempotent keeps the record of
	// a key (default DefaultSubmissionRetention, 7 days): a submit under
	// the key within it is answered from the record; after it the key is
	// free again. Keep it at least as long as the caller's recovery window.
	SubmissionRetention time.Duration
}

func (c *Config) setDefaults() {
	if c.JobIndexTTL <= 0 {
		c.JobIndexTTL = time.Hour
	}
	if c.CancelTTL <= 0 {
		c.CancelTTL = 7 * 24 * time.Hour
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = 500
	}
	if c.MinReplicasTimeout <= 0 {
		c.MinReplicasTimeout = 5 * time.Second
	}
}

// Producer enqueues requests, cancels them and reads results. It is safe
// for concurrent use.
type Producer struct {
	client redis.UniversalClient
	own    bool
	cfg    Config
	names  keys.Names
	load   sync.Once
	// loadIdem loads the idempotent submit script (SubmitIdempotentMany).
	loadIdem sync.Once
	// id and calls name each enqueue call's mark (see keys.Enqueue).
	id    string
	calls atomic.Uint64
}

// New returns a producer on client (a *redis.Client, or a
// *redis.ClusterClient for a Redis Cluster: names are then hash-tagged, see
// Names); Close leaves the client open.
func New(client redis.UniversalClient, cfg Config) *Producer {
	cfg.setDefaults()
	var b [8]byte
	_, _ = rand.Read(b[:])
	_, cluster := client.(*redis.ClusterClient)
	return &Producer{client: client, cfg: cfg, names: keys.Names{Prefix: cfg.Prefix, Cluster: cluster}, id: hex.EncodeToString(b[:])}
}

// Dial connects to the Redis URL (redis://, rediss://, with user:password@
// for AUTH) in cfg.TopologyOptions; Close closes
// the connection.
func Dial(url string, cfg Config) (*Producer, error) {
	ro, err := rss.RedisOptions(url, rss.Options{TopologyOptions: cfg.TopologyOptions})
	if err != nil {
		return nil, err
	}
	p := New(ro.New(), cfg)
	p.own = true
	return p, nil
}

// DialTransport connects as the redis-sortedset transport of options to
// does in env (rss.NewClient: its url, topology, tls_* and pool_size, else
// the deployment's REDIS_URL, topology and redis_tls), writing under the
// transport's prefix (cfg.Prefix and cfg.TopologyOptions are ignored);
// Close closes the connection.
func DialTransport(to rss.Options, env transport.Env, cfg Config) (*Producer, error) {
	client, to, err := rss.NewClient(to, env)
	if err != nil {
		return nil, err
	}
	cfg.Prefix, cfg.TopologyOptions = to.Prefix, to.TopologyOptions
	p := New(client, cfg)
	p.own = true
	return p, nil
}

// Names returns the key layout (request and result queue names).
func (p *Producer) Names() Names { return p.names }

// Client returns the Redis client.
func (p *Producer) Client() redis.UniversalClient { return p.client }

// Close closes the connection if Dial opened it.
func (p *Producer) Close() error {
	if p.own {
		return p.client.Close()
	}
	return nil
}

// Enqueue adds one request to queue.
func (p *Producer) Enqueue(ctx context.Context, queue string, req *wire.Request) error {
	return p.EnqueueMany(ctx, queue, []*wire.Request{req})
}

// EnqueueMany adds requests to queue in order, pipelined: one round trip
// for up to ChunkSize×64 requests. Requests are validated first (an invalid
// one fails the call before anything is written).
func (p *Producer) EnqueueMany(ctx context.Context, queue string, reqs []*wire.Request) error {
	if len(reqs) == 0 {
		return nil
	}
	if p.cfg.Envelope {
		return p.submitEnvelopes(ctx, queue, reqs)
	}
	if err := p.names.CheckSlots(queue); err != nil {
		return err
	}
	k := p.names.Queue(queue)
	now := time.Now()
	jobq := p.names.JobQueues("")
	var jobTTL map[string]time.Duration // a cluster's jobq entries, written apart
	if p.names.Cluster {
		jobq, jobTTL = "", map[string]time.Duration{}
	}
	head := []any{k.JobPrefix, jobq, p.cfg.JobIndexTTL.Milliseconds(), now.UnixMilli()}
	var chunks [][]any
	args := append([]any(nil), head...)
	for _, r := range reqs {
		b, err := wire.EncodeRequest(r)
		if err != nil {
			return err
		}
		job := indexableJob(r.JobID())
		if jobTTL != nil && job != "" {
			jobTTL[job] = max(jobTTL[job], r.Deadline.Sub(now)+p.cfg.JobIndexTTL)
		}
		args = append(args, rss.Score(r.Deadline), job, string(b[1:]))
		if (len(args)-len(head))/3 == p.cfg.ChunkSize {
			chunks = append(chunks, args)
			args = append([]any(nil), head...)
		}
	}
	if len(args) > len(head) {
		chunks = append(chunks, args)
	}
	if err := p.ensureLoaded(ctx); err != nil {
		return err
	}
	if len(jobTTL) > 0 {
		// Before the requests, so that a cancellation of the job racing
		// this enqueue finds the queue (cluster only; one script on a
		// single node does both).
		if _, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for job, ttl := range jobTTL {
				keys.JobQueue.Eval(ctx, pl, []string{p.names.JobQueues(job)}, queue, ttl.Milliseconds())
			}
			return nil
		}); err != nil {
			return fmt.Errorf("enqueue to %s: index jobs: %w", queue, err)
		}
	}
	ks := []string{queue, k.Seq, p.names.Registry()}
	for len(chunks) > 0 {
		n := min(len(chunks), 64)
		// Each chunk's call mark is fixed before the first attempt, so
		// that neither go-redis' retry nor the NOSCRIPT reload below can
		// enqueue a chunk twice.
		marks := make([]string, n)
		for i := range marks {
			marks[i] = k.CallMarks + p.id + ":" + strconv.FormatUint(p.calls.Add(1), 36)
		}
		err := p.runChunks(ctx, ks, marks, k.Notify, chunks[:n])
		if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
			if err = keys.Enqueue.Load(ctx, p.client).Err(); err == nil {
				err = p.runChunks(ctx, ks, marks, k.Notify, chunks[:n])
			}
		}
		if err != nil {
			return fmt.Errorf("enqueue to %s: %w", queue, err)
		}
		chunks = chunks[n:]
	}
	return nil
}

// runChunks runs the enqueue calls of chunks with their marks; ks is
// (queue, seq, registry).
func (p *Producer) runChunks(ctx context.Context, ks, marks []string, notify string, chunks [][]any) error {
	if p.cfg.MinReplicasAcked > 0 {
		return p.runChunksAcked(ctx, ks, marks, notify, chunks)
	}
	_, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		pl.SAdd(ctx, ks[2], ks[0])
		for i, c := range chunks {
			keys.Enqueue.EvalSha(ctx, pl, []string{ks[0], ks[1], marks[i]}, c...)
		}
		pl.Publish(ctx, notify, "1")
		return nil
	})
	return err
}

// runChunksAcked is runChunks with WAIT (see acked).
func (p *Producer) runChunksAcked(ctx context.Context, ks, marks []string, notify string, chunks [][]any) error {
	if err := p.acked(ctx, ks[0], func(pl redis.Pipeliner) {
		for i, c := range chunks {
			keys.Enqueue.EvalSha(ctx, pl, []string{ks[0], ks[1], marks[i]}, c...)
		}
	}, keys.Enqueue); err != nil {
		return err
	}
	_, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
		pl.SAdd(ctx, ks[2], ks[0])
		pl.Publish(ctx, notify, "1")
		return nil
	})
	return err
}

// acked runs the commands fn queues, all on key's slot, on the master
// holding key followed by WAIT (keys.WaitPipelined), and fails unless
// MinReplicasAcked replicas confirmed them within MinReplicasTimeout. Every
// script in scripts must be safe to run twice.
func (p *Producer) acked(ctx context.Context, key string, fn func(redis.Pipeliner), scripts ...*redis.Script) error {
	node, err := keys.MasterFor(ctx, p.client, key)
	if err != nil {
		return err
	}
	n, err := keys.WaitPipelined(ctx, node, p.cfg.MinReplicasAcked, p.cfg.MinReplicasTimeout, fn, scripts...)
	if err != nil {
		if cc, ok := p.client.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx) // the node client does not follow MOVED by itself
		}
		return err
	}
	if n < int64(p.cfg.MinReplicasAcked) {
		return fmt.Errorf("only %d of min_replicas_acked %d replicas confirmed within %s (the write is on the master; a failover could lose it)",
			n, p.cfg.MinReplicasAcked, p.cfg.MinReplicasTimeout)
	}
	return nil
}

func (p *Producer) ensureLoaded(ctx context.Context) error {
	var err error
	p.load.Do(func() { err = keys.Enqueue.Load(ctx, p.client).Err() })
	if err != nil {
		p.load = sync.Once{}
		return fmt.Errorf("load enqueue script: %w", err)
	}
	return nil
}

// indexableJob returns job when it can be carried in the member's tag (no
// quote, backslash or control character), "" otherwise: such a job is still
// cancelled, but its waiting requests are answered when they come up
// rather than at once.
func indexableJob(job string) string {
	for i := 0; i < len(job); i++ {
		if c := job[i]; c == '"' || c == '\\' || c < 0x20 {
			return ""
		}
	}
	return job
}

// CancelJob cancels every request of job (metadata.job_id): requests still
// waiting are moved to the front of their queues and answered CANCELLED at
// once (for requests enqueued by this library; others when they come up),
// requests in flight have their HTTP calls aborted and are answered
// CANCELLED, requests waiting for a retry are answered CANCELLED when due.
// It returns how many waiting requests were moved.
func (p *Producer) CancelJob(ctx context.Context, job string) (int, error) {
	if job == "" {
		return 0, errors.New("cancel job: empty job id")
	}
	jobq := p.names.JobQueues(job)
	if p.names.Cluster {
		jobq = "" // the job's queues are in other slots: fronted one by one below
	}
	n, err := keys.Cancel.Run(ctx, p.client, []string{p.names.Cancelled(), p.names.CancelEpoch()},
		cancelset.JobEntry(job), p.cfg.CancelTTL.Milliseconds(), p.names.CancelChannel(), jobq, ":job:"+job).Int()
	if err != nil {
		return 0, fmt.Errorf("cancel job %s: %w", job, err)
	}
	if !p.names.Cluster {
		return n, nil
	}
	qs, err := p.client.SMembers(ctx, p.names.JobQueues(job)).Result()
	if err != nil {
		return 0, fmt.Errorf("cancel job %s: its queues: %w", job, err)
	}
	for _, q := range qs {
		k := p.names.Queue(q)
		m, err := keys.CancelFront.Run(ctx, p.client, []string{q, k.JobPrefix + job}, k.Notify).Int()
		if err != nil {
			return n, fmt.Errorf("cancel job %s: front of %s: %w", job, q, err)
		}
		n += m
	}
	if err := p.client.Del(ctx, p.names.JobQueues(job)).Err(); err != nil {
		return n, fmt.Errorf("cancel job %s: %w", job, err)
	}
	return n, nil
}

// CancelRequest cancels one request by id: answered CANCELLED when it comes
// up, or aborted if it is in flight.
func (p *Producer) CancelRequest(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("cancel request: empty id")
	}
	err := keys.Cancel.Run(ctx, p.client, []string{p.names.Cancelled(), p.names.CancelEpoch()},
		cancelset.RequestEntry(id), p.cfg.CancelTTL.Milliseconds(), p.names.CancelChannel(), "", "").Err()
	if err != nil {
		return fmt.Errorf("cancel request %s: %w", id, err)
	}
	return nil
}

// ReaderOptions configure a ResultReader.
type ReaderOptions struct {
	// Lease is how long a result handed out by Next stays reserved before it
	// is handed out again (default 60s).
	Lease time.Duration
	// Batch is the most results one Next returns (default 100).
	Batch int
	// PollInterval is the longest wait between two looks at an empty list
	// (default 500ms).
	PollInterval time.Duration
}

// ResultReader reads a result list durably: Next leases results, Ack
// removes them; a result not acked within the lease is handed out again.
type ResultReader struct {
	p       *Producer
	list    string
	pending string
	o       ReaderOptions
}

// Results returns a durable reader of result list.
func (p *Producer) Results(list string, o ReaderOptions) *ResultReader {
	if o.Lease <= 0 {
		o.Lease = time.Minute
	}
	if o.Batch <= 0 {
		o.Batch = 100
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 500 * time.Millisecond
	}
	return &ResultReader{p: p, list: list, pending: p.names.Pending(list), o: o}
}

// ResultLease is one leased result.
type ResultLease struct {
	// Raw is the result as written; Ack needs it.
	Raw string
	// Result is the decoded result (nil when Raw does not decode; see Err).
	Result *wire.Result
	// Err is why Raw did not decode.
	Err error
}

// TryNext leases up to Batch results without waiting (none when the list is empty).
func (r *ResultReader) TryNext(ctx context.Context) ([]ResultLease, error) {
	var raw []string
	var err error
	if r.p.cfg.MinReplicasAcked > 0 {
		var cmd *redis.Cmd
		if err = r.p.acked(ctx, r.list, func(pl redis.Pipeliner) {
			cmd = keys.LeaseResults.EvalSha(ctx, pl, []string{r.list, r.pending}, r.o.Batch, r.o.Lease.Milliseconds())
		}, keys.LeaseResults); err == nil {
			raw, err = cmd.StringSlice()
		}
	} else {
		raw, err = keys.LeaseResults.Run(ctx, r.p.client, []string{r.list, r.pending}, r.o.Batch, r.o.Lease.Milliseconds()).StringSlice()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read results from %s: %w", r.list, err)
	}
	return leasesOf(raw), nil
}

// Reopen is for a consumer restarted on its route (upstream's proposal
// for durable result-route opening): it leases to this reader, afresh,
// every result of the list still leased and not acked (by the consumer's
// earlier incarnation, which died before its Ack), so they need not wait
// for their leases to lapse. Handle and Ack them, then read on with Next.
// A route shared by live readers is not for Reopen: it takes their leases
// too.
func (r *ResultReader) Reopen(ctx context.Context) ([]ResultLease, error) {
	raw, err := keys.ReopenResults.Run(ctx, r.p.client, []string{r.pending}, r.o.Lease.Milliseconds()).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("reopen results of %s: %w", r.list, err)
	}
	return leasesOf(raw), nil
}

// leasesOf decodes leased results.
func leasesOf(raw []string) []ResultLease {
	out := make([]ResultLease, len(raw))
	for i, s := range raw {
		out[i].Raw = s
		out[i].Result, out[i].Err = wire.DecodeResult([]byte(s))
	}
	return out
}

// Next waits until at least one result is available (or ctx ends) and
// leases up to Batch of them.
func (r *ResultReader) Next(ctx context.Context) ([]ResultLease, error) {
	wait := 5 * time.Millisecond
	for {
		out, err := r.TryNext(ctx)
		if err != nil || len(out) > 0 {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(wait*2, r.o.PollInterval)
	}
}

// Ack removes results for good.
func (r *ResultReader) Ack(ctx context.Context, ls ...ResultLease) error {
	if len(ls) == 0 {
		return nil
	}
	members := make([]any, len(ls))
	for i, l := range ls {
		members[i] = l.Raw
	}
	var err error
	if r.p.cfg.MinReplicasAcked > 0 {
		err = r.p.acked(ctx, r.pending, func(pl redis.Pipeliner) { pl.ZRem(ctx, r.pending, members...) })
	} else {
		err = r.p.client.ZRem(ctx, r.pending, members...).Err()
	}
	if err != nil {
		return fmt.Errorf("ack %d result(s) of %s: %w", len(ls), r.list, err)
	}
	return nil
}

// Pending returns how many results are leased and not yet acked.
func (r *ResultReader) Pending(ctx context.Context) (int64, error) {
	n, err := r.p.client.ZCard(ctx, r.pending).Result()
	if err != nil {
		return 0, fmt.Errorf("pending results of %s: %w", r.list, err)
	}
	return n, nil
}

// Seq returns the last enqueue sequence number of queue (for tools).
func (p *Producer) Seq(ctx context.Context, queue string) (int64, error) {
	s, err := p.client.Get(ctx, p.names.Queue(queue).Seq).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(s, 10, 64)
}
