package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/redis/go-redis/v9"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// outMsg is one message the harness sends: its id ("" when the message
// carries no readable id) and its bytes.
type outMsg struct {
	id   string
	body []byte
}

// broker is one transport's broker as the harness drives it: what to put
// in sluice's config, how to send requests, how to read results and
// dead letters.
type broker interface {
	// deployment returns the sluice config's transport, transport_config
	// and redis_url for a deployment whose gateway is gw.
	deployment(gw string) (transport string, tc map[string]any, redisURL string)
	// send enqueues messages.
	send(ctx context.Context, msgs []outMsg) error
	// readResults reads results into l until ctx ends; a broker that is
	// away (a restart) is waited for, not an error.
	readResults(ctx context.Context, l *ledger)
	// deadLetters counts the dead-lettered messages.
	deadLetters(ctx context.Context) (int, error)
	// close releases what the broker holds (not the servers).
	close()
}

// deadLetterReader is a broker whose dead letters can be read back (the
// fuzz case matches each to the message it was).
type deadLetterReader interface {
	deadLetterBodies(ctx context.Context) ([][]byte, error)
}

// transportCase is one transport under test: adding a broker (NATS,
// Postgres, ...) is one entry in transportCases.
type transportCase struct {
	name string
	// dupOnCrash: a crash may repeat a result (publishing the result and
	// acking the request cannot be one step); up to the requests in flight.
	dupOnCrash bool
	// open starts what the transport needs in r and returns its broker.
	open func(ctx context.Context, r *rig, tweak brokerTweak) (broker, error)
	// kill9 sizes the kill -9 case for this broker.
	kill9 kill9Size
	// redis: the transport runs on Redis; the Redis faults (restarts,
	// outage, SIGTERM burst) run on it too.
	redis bool
	// noFuzz: the fuzz case does not run on it (see transportCases).
	noFuzz bool
}

// brokerTweak adjusts a broker for one fault.
type brokerTweak struct {
	persist bool // Redis with appendonly yes, appendfsync always
	// traced: the subscribers reach the broker through a recording proxy
	// where the broker has one (the Pub/Sub emulator; kill -9 case).
	traced bool
}

// transportCases lists the transports every per-transport fault runs on.
func transportCases() []transportCase {
	return []transportCase{
		{name: "redis-sortedset", open: openSortedSet, redis: true,
			kill9: kill9Size{requests: 4000, concurrency: 32, latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond, settle: 60 * time.Second}},
		{name: "redis-stream", open: openStream, redis: true,
			kill9: kill9Size{requests: 4000, concurrency: 32, latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond, settle: 60 * time.Second}},
		{name: "gcp-pubsub", dupOnCrash: true, open: openPubSub,
			kill9: kill9Size{requests: 60, concurrency: 8, latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond, settle: 90 * time.Second, quiet: 10 * time.Second, trickle: 5,
				stall: 10 * time.Second, stallMin: 30 * time.Second}},
		// The scale-out brokers (transport "watermill"), kill -9 only: the
		// fuzz case runs on the transports above, whose decoding is the
		// same core code (NATS refuses the fuzz case's 1-MiB messages
		// before sluice sees them anyway: max_payload).
		{name: "watermill-nats-jetstream", open: openNATS, noFuzz: true,
			kill9: kill9Size{requests: 6000, concurrency: 32, latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond, settle: 60 * time.Second}},
		{name: "watermill-postgres", open: openPostgres, noFuzz: true,
			kill9: kill9Size{requests: 2000, concurrency: 16, latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond, settle: 60 * time.Second}},
		// redis-sortedset on a Redis Cluster (min_replicas_acked 1); its
		// master is killed by redis-cluster-master-kill.
		{name: "redis-sortedset-cluster", open: openSortedSetCluster, noFuzz: true,
			kill9: kill9Size{requests: 3000, concurrency: 32, latencyMin: 50 * time.Millisecond, latencyMax: 250 * time.Millisecond, settle: 60 * time.Second}},
	}
}

// flatRequest is a good request: flat form, the id in a header the
// gateway records.
func flatRequest(id string, deadline time.Time) []byte {
	b, _ := json.Marshal(map[string]any{
		"id": id, "created": time.Now().Unix(), "deadline": float64(deadline.UnixMilli()) / 1000,
		"payload":  map[string]any{"model": "m", "prompt": "What is 2+2?", "max_tokens": 4},
		"headers":  map[string]string{idHeader: id},
		"metadata": map[string]string{"job_id": "chaos"},
	})
	return b
}

// resultID decodes a result's id and code ("ok" for a 2xx answer,
// "http_<status>" for another answer, the error code otherwise).
func resultID(b []byte) (string, string) {
	var r struct {
		ID         string `json:"id"`
		StatusCode int    `json:"status_code"`
		ErrorCode  string `json:"error_code"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return "", "undecodable"
	}
	switch {
	case r.ErrorCode != "":
		return r.ID, r.ErrorCode
	case r.StatusCode >= 200 && r.StatusCode < 300:
		return r.ID, "ok"
	default:
		return r.ID, "http_" + strconv.Itoa(r.StatusCode)
	}
}

// readList reads results from a Redis list (sluice LPUSHes them) until
// ctx ends, tolerating a Redis that is away. It reads without removing
// (LRANGE from the tail past what it has read): a pop whose reply is lost
// when redis-server dies would lose results the harness never saw.
func readList(ctx context.Context, c redis.UniversalClient, key string, l *ledger) {
	n := int64(0) // results read: the n entries at the tail
	for ctx.Err() == nil {
		vals, err := c.LRange(ctx, key, -(n + 500), -(n + 1)).Result()
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		now := time.Now()
		for _, v := range vals {
			id, code := resultID([]byte(v))
			l.record(id, code, now)
		}
		n += int64(len(vals))
		if len(vals) < 500 {
			sleep(ctx, 20*time.Millisecond)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func newRedisClient(url string) (*redis.Client, error) {
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, err
	}
	o.MaxRetries = -1
	return redis.NewClient(o), nil
}

// ---- redis-sortedset ----

type sortedSet struct {
	url, queue, results string
	c                   redis.UniversalClient
	p                   *producer.Producer
}

func openSortedSet(ctx context.Context, r *rig, tw brokerTweak) (broker, error) {
	srv, err := r.redis(tw.persist)
	if err != nil {
		return nil, err
	}
	c, err := newRedisClient(srv.URL)
	if err != nil {
		return nil, err
	}
	p, err := producer.Dial(srv.URL, producer.Config{})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &sortedSet{url: srv.URL, queue: "llm-d-async:requests:chaos", results: "chaos-results", c: c, p: p}, nil
}

func (s *sortedSet) deployment(gw string) (string, map[string]any, string) {
	return "redis-sortedset", map[string]any{
		"lease_ms": 2000, "heartbeat_ms": 400, "reclaim_interval_ms": 300, "max_deliveries": 100, "poll_interval_ms": 100,
		"result_queue_name": s.results,
		"queues":            []map[string]any{{"queue_name": s.queue, "igw_base_url": gw}},
	}, s.url
}

func (s *sortedSet) send(ctx context.Context, msgs []outMsg) error {
	var reqs []*wire.Request
	raw := s.c.Pipeline()
	nraw := 0
	for _, m := range msgs {
		var rq wire.Request
		if m.id != "" && json.Unmarshal(m.body, &struct{}{}) == nil && isFlatGood(m.body, &rq) {
			reqs = append(reqs, &rq)
			continue
		}
		// Fuzzed bytes go in as they are, scored one hour out.
		raw.ZAdd(ctx, s.queue, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: m.body})
		nraw++
	}
	if len(reqs) > 0 {
		if err := s.p.EnqueueMany(ctx, s.queue, reqs); err != nil {
			return err
		}
	}
	if nraw > 0 {
		if _, err := raw.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

// isFlatGood decodes a good request the harness made into rq (for the
// producer library); fuzzed messages are not decoded.
func isFlatGood(b []byte, rq *wire.Request) bool {
	var f struct {
		ID       string            `json:"id"`
		Deadline float64           `json:"deadline"`
		Payload  json.RawMessage   `json:"payload"`
		Headers  map[string]string `json:"headers"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(b, &f); err != nil || f.Headers[idHeader] != f.ID || f.ID == "" {
		return false
	}
	*rq = wire.Request{ID: f.ID, Created: time.Now(), Deadline: time.UnixMilli(int64(f.Deadline * 1000)),
		Payload: f.Payload, Headers: f.Headers, Metadata: f.Metadata}
	return true
}

func (s *sortedSet) readResults(ctx context.Context, l *ledger) { readList(ctx, s.c, s.results, l) }

func (s *sortedSet) deadLetters(ctx context.Context) (int, error) {
	n, err := s.c.LLen(ctx, s.queue+":dead").Result()
	return int(n), err
}

// deadLetterBodies returns the messages of the dead-letter list.
func (s *sortedSet) deadLetterBodies(ctx context.Context) ([][]byte, error) {
	return listBodies(ctx, s.c, s.queue+":dead")
}

// listBodies returns every entry of a Redis list.
func listBodies(ctx context.Context, c redis.UniversalClient, key string) ([][]byte, error) {
	vals, err := c.LRange(ctx, key, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	out := make([][]byte, len(vals))
	for i, v := range vals {
		out[i] = []byte(v)
	}
	return out, nil
}

func (s *sortedSet) close() { s.p.Close(); s.c.Close() }

// ---- redis-stream ----

type stream struct {
	url, queue, results string
	c                   *redis.Client
}

func openStream(ctx context.Context, r *rig, tw brokerTweak) (broker, error) {
	srv, err := r.redis(tw.persist)
	if err != nil {
		return nil, err
	}
	c, err := newRedisClient(srv.URL)
	if err != nil {
		return nil, err
	}
	return &stream{url: srv.URL, queue: "chaos-stream", results: "chaos-stream-results", c: c}, nil
}

func (s *stream) deployment(gw string) (string, map[string]any, string) {
	return "redis-stream", map[string]any{
		"claim_idle_ms": 2000, "heartbeat_ms": 400, "block_ms": 200, "retry_poll_interval_ms": 100,
		"result_mode": "list", "result_queue_name": s.results,
		"queues": []map[string]any{{"queue_name": s.queue, "igw_base_url": gw}},
	}, s.url
}

func (s *stream) send(ctx context.Context, msgs []outMsg) error {
	for i := 0; i < len(msgs); i += 500 {
		pipe := s.c.Pipeline()
		for j, m := range msgs[i:min(i+500, len(msgs))] {
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.queue, Values: []any{"_watermill_message_uuid", fmt.Sprintf("u-%d-%d", i, j), "payload", m.body}})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (s *stream) readResults(ctx context.Context, l *ledger) { readList(ctx, s.c, s.results, l) }

func (s *stream) deadLetters(ctx context.Context) (int, error) {
	n, err := s.c.XLen(ctx, s.queue+":dead").Result()
	return int(n), err
}

// deadLetterBodies returns the payloads of the dead-letter stream.
func (s *stream) deadLetterBodies(ctx context.Context) ([][]byte, error) {
	es, err := s.c.XRange(ctx, s.queue+":dead", "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("read %s:dead: %w", s.queue, err)
	}
	out := make([][]byte, 0, len(es))
	for _, e := range es {
		p, _ := e.Values["payload"].(string)
		out = append(out, []byte(p))
	}
	return out, nil
}

func (s *stream) close() { s.c.Close() }

// ---- gcp-pubsub (emulator) ----

// pubSubProject is the emulator project the harness uses.
const pubSubProject = "sluice-chaos"

type pubSub struct {
	r       *rig
	emuAddr string // the emulator, host:port (a restart keeps its port)
	c       *pubsub.Client
	proxy   *pubSubProxy // what sluice and the bare control connect to, when traced
	prefix  string
	dead    atomic.Int64
	// seen holds the message ids of the results and dead letters read:
	// the emulator delivering one again (the harness's ack lost) is not a
	// second result.
	seenMu     sync.Mutex
	seen       map[string]bool
	deadBodies [][]byte // the dead letters read, in order
	// resultsSubAt is when createTopics last created the result
	// subscription (a result published to the topic before it is dropped).
	resultsSubAt time.Time
}

func openPubSub(ctx context.Context, r *rig, tw brokerTweak) (broker, error) {
	emu, err := r.emulator()
	if err != nil {
		return nil, err
	}
	c, err := pubsub.NewClient(ctx, pubSubProject, option.WithEndpoint(emu), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return nil, err
	}
	var proxy *pubSubProxy
	if tw.traced {
		if proxy, err = startPubSubProxy(emu, func(port int) int { return socketOwner(port, r.replicaPIDs()) }); err != nil {
			c.Close()
			return nil, err
		}
	}
	p := &pubSub{r: r, emuAddr: emu, c: c, proxy: proxy, seen: map[string]bool{}, prefix: "c" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	if err := p.createTopics(ctx); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *pubSub) name(kind, id string) string {
	return "projects/" + pubSubProject + "/" + kind + "/" + p.prefix + "-" + id
}

// createTopics creates the request, result and dead-letter topics and a
// subscription of each, with a 10-s ack deadline (the emulator's
// shortest), so a killed subscriber's leases come back soon.
func (p *pubSub) createTopics(ctx context.Context) error {
	for _, id := range []string{"requests", "results", "dead"} {
		if _, err := p.c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: p.name("topics", id)}); err != nil {
			return fmt.Errorf("create topic %s: %w", id, err)
		}
		if _, err := p.c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
			Name: p.name("subscriptions", id+"-sub"), Topic: p.name("topics", id), AckDeadlineSeconds: 10}); err != nil {
			return fmt.Errorf("create subscription %s: %w", id, err)
		}
		if id == "results" {
			p.resultsSubAt = time.Now()
		}
	}
	// A new emulator numbers its messages afresh: the ids read from the
	// old one say nothing about the new one's.
	p.seenMu.Lock()
	p.seen = map[string]bool{}
	p.seenMu.Unlock()
	return nil
}

func (p *pubSub) deployment(gw string) (string, map[string]any, string) {
	return "gcp-pubsub", map[string]any{
		"project_id": pubSubProject, "emulator_host": p.subscriberAddr(),
		"dead_letter_topic": p.prefix + "-dead", "result_queue_name": p.prefix + "-results",
		"max_extension_seconds": 60,
		"queues":                []map[string]any{{"queue_name": p.prefix + "-requests-sub", "igw_base_url": gw}},
	}, ""
}

func (p *pubSub) send(ctx context.Context, msgs []outMsg) error {
	pub := p.c.Publisher(p.name("topics", "requests"))
	defer pub.Stop()
	res := make([]*pubsub.PublishResult, len(msgs))
	for i, m := range msgs {
		res[i] = pub.Publish(ctx, &pubsub.Message{Data: m.body})
	}
	for _, r := range res {
		if _, err := r.Get(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (p *pubSub) receive(ctx context.Context, sub string, fn func(*pubsub.Message)) {
	for ctx.Err() == nil {
		err := p.c.Subscriber(p.name("subscriptions", sub)).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			fn(m)
			m.Ack()
		})
		if err != nil && ctx.Err() == nil {
			sleep(ctx, 200*time.Millisecond)
		}
	}
}

func (p *pubSub) readResults(ctx context.Context, l *ledger) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.receive(ctx, "dead-sub", func(m *pubsub.Message) {
			if p.first(m.ID) {
				p.dead.Add(1)
				p.seenMu.Lock()
				p.deadBodies = append(p.deadBodies, m.Data)
				p.seenMu.Unlock()
			}
		})
	}()
	defer func() { <-done }()
	p.receive(ctx, "results-sub", func(m *pubsub.Message) { p.recordResult(l, m.ID, m.Data) })
}

// first reports whether message id is read for the first time.
func (p *pubSub) first(msgID string) bool {
	p.seenMu.Lock()
	defer p.seenMu.Unlock()
	if p.seen[msgID] {
		return false
	}
	p.seen[msgID] = true
	return true
}

// recordResult records a result message the first time it is read.
func (p *pubSub) recordResult(l *ledger, msgID string, data []byte) {
	if p.first(msgID) {
		id, code := resultID(data)
		l.record(id, code, time.Now())
	}
}

// drain takes, with a fresh client of its own, every message still held
// in subscription sub (id: "requests-sub", "results-sub"): it seeks the
// subscription to since, which makes every message published after it and
// not acked available again (acked ones are not retained), then pulls and
// acks until three pulls in a row come back empty (each waits up to 10 s:
// the emulator is slow on a loaded machine). The emulator's seek leaves
// alone what it still counts as leased to a stream it has not seen end, so
// while sought says something is still missing the drain seeks and pulls
// again, until within has passed. A pull that fails otherwise is an
// error: the drain proves nothing then. fn gets each message's id and
// data; the count of messages and of seeks is returned.
func (p *pubSub) drain(ctx context.Context, sub string, since time.Time, within time.Duration, sought func() bool,
	fn func(msgID string, data []byte)) (n, seeks int, err error) {
	c, err := pubsub.NewClient(ctx, pubSubProject, option.WithEndpoint(p.emuAddr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		return 0, 0, fmt.Errorf("drain %s: %w", sub, err)
	}
	defer c.Close()
	name := p.name("subscriptions", sub)
	end := time.Now().Add(within)
	for ctx.Err() == nil {
		if _, err := c.SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{Subscription: name,
			Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.New(since)}}); err != nil {
			return n, seeks, fmt.Errorf("drain %s: seek: %w", sub, err)
		}
		seeks++
		for empty := 0; empty < 3 && time.Now().Before(end) && ctx.Err() == nil; {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			r, err := c.SubscriptionAdminClient.Pull(cctx, &pubsubpb.PullRequest{Subscription: name, MaxMessages: 100})
			cancel()
			if err != nil && ctx.Err() == nil && status.Code(err) != codes.DeadlineExceeded {
				return n, seeks, fmt.Errorf("drain %s: pull: %w", sub, err)
			}
			if err != nil || len(r.ReceivedMessages) == 0 {
				empty++
				continue
			}
			empty = 0
			ackIDs := make([]string, 0, len(r.ReceivedMessages))
			for _, m := range r.ReceivedMessages {
				n++
				fn(m.GetMessage().GetMessageId(), m.GetMessage().GetData())
				ackIDs = append(ackIDs, m.AckId)
			}
			if err := c.SubscriptionAdminClient.Acknowledge(ctx, &pubsubpb.AcknowledgeRequest{Subscription: name, AckIds: ackIDs}); err != nil {
				return n, seeks, fmt.Errorf("drain %s: ack: %w", sub, err)
			}
		}
		if sought == nil || !sought() || !time.Now().Before(end) {
			return n, seeks, nil
		}
	}
	return n, seeks, ctx.Err()
}

// deadLetters is how many messages the dead-letter subscription has
// delivered so far (readResults reads it alongside the results).
func (p *pubSub) deadLetters(context.Context) (int, error) { return int(p.dead.Load()), nil }

// deadLetterBodies returns the dead letters read so far.
func (p *pubSub) deadLetterBodies(context.Context) ([][]byte, error) {
	p.seenMu.Lock()
	defer p.seenMu.Unlock()
	return append([][]byte(nil), p.deadBodies...), nil
}

func (p *pubSub) close() {
	p.c.Close()
	if p.proxy != nil {
		p.proxy.close()
	}
}

// subscriberAddr is where sluice and the bare control reach the emulator:
// the proxy when traced.
func (p *pubSub) subscriberAddr() string {
	if p.proxy != nil {
		return p.proxy.Addr
	}
	return p.emuAddr
}

// traced reports whether the subscribers' traffic is recorded (the proxy).
func (p *pubSub) traced() bool { return p.proxy != nil }
