package redissortedset_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// sub is a subscription made directly on a transport, without the pipeline.
type sub struct {
	t       *testing.T
	tp      *rss.Transport
	q       transport.Queue
	credits *credit.Pool
	s       message.Subscriber
	ch      <-chan *message.Message
	cancel  context.CancelFunc
}

func subscribe(t *testing.T, tp *rss.Transport, q transport.Queue, maxInflight int) *sub {
	t.Helper()
	c := credit.NewPool(maxInflight, credit.Ramp{})
	c.SetBudget(1)
	s, err := transport.NewSubscriber(tp, q, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := s.Subscribe(ctx, q.Name)
	if err != nil {
		t.Fatal(err)
	}
	return &sub{t: t, tp: tp, q: q, credits: c, s: s, ch: ch, cancel: cancel}
}

func (s *sub) next(within time.Duration) *message.Message {
	s.t.Helper()
	select {
	case m := <-s.ch:
		return m
	case <-time.After(within):
		s.t.Fatalf("no message within %s", within)
		return nil
	}
}

func (s *sub) none(within time.Duration) {
	s.t.Helper()
	select {
	case m := <-s.ch:
		s.t.Fatalf("unexpected message %s", m.Payload)
	case <-time.After(within):
	}
}

// answer publishes an OK result for m and acks it.
func (s *sub) answer(m *message.Message) {
	s.t.Helper()
	req, err := wire.Decode(m.Payload)
	if err != nil {
		s.t.Fatal(err)
	}
	pub, err := s.tp.Publisher(s.q)
	if err != nil {
		s.t.Fatal(err)
	}
	out := message.NewMessage(m.UUID, (&wire.Result{ID: req.ID, StatusCode: 200, Payload: "{}"}).Marshal())
	out.Metadata = m.Metadata
	if err := pub.Publish(s.q.ResultName, out); err != nil {
		s.t.Fatal(err)
	}
	transport.Ack(m)
}

func (s *sub) close() {
	s.cancel()
	_ = s.s.Close()
}

func idOf(t *testing.T, m *message.Message) string {
	t.Helper()
	r, err := wire.Decode(m.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return r.ID
}

// crash makes tp unable to reach Redis, as if its process died: no
// heartbeat, no hand-back.
func crash(tp *rss.Transport) { _ = tp.Client().Close() }

func queueOf(name string) transport.Queue {
	return transport.Queue{ID: name, Name: name, ResultName: name + ":results"}
}

func TestOrdering(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("order")
	base := time.Now().Add(time.Hour).Truncate(time.Second)
	at := func(id string, d time.Duration) *wire.Request {
		r := request(id, "", 0, nil)
		r.Deadline = base.Add(d)
		return r
	}
	// Deadlines 1 ms apart must come out in deadline order; equal deadlines in enqueue order.
	batch := []*wire.Request{at("c", 3*time.Millisecond), at("eq1", time.Millisecond), at("a", 0)}
	if err := f.prod.EnqueueMany(ctx, q.Name, batch); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"eq2", "eq3"} {
		if err := f.prod.Enqueue(ctx, q.Name, at(id, time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.prod.Enqueue(ctx, q.Name, at("b", 2*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// An upstream producer's flat message, scored in whole seconds, one second earlier.
	up := fmt.Sprintf(`{"id":"up","deadline":%d,"payload":{}}`, base.Unix()-1)
	if err := f.prod.Client().ZAdd(ctx, q.Name, redisZ(float64(base.Unix()-1), up)).Err(); err != nil {
		t.Fatal(err)
	}
	tp := f.transport(rss.Options{})
	defer tp.Close()
	s := subscribe(t, tp, q, 100)
	defer s.close()
	var got []string
	for range 7 {
		m := s.next(5 * time.Second)
		got = append(got, idOf(t, m))
		s.answer(m)
	}
	want := []string{"up", "a", "eq1", "eq2", "eq3", "b", "c"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestClaimWithinCredits(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("credits")
	var reqs []*wire.Request
	for _, id := range ids("c", 10) {
		reqs = append(reqs, request(id, "", time.Hour, nil))
	}
	if err := f.prod.EnqueueMany(ctx, q.Name, reqs); err != nil {
		t.Fatal(err)
	}
	tp := f.transport(rss.Options{})
	defer tp.Close()
	s := subscribe(t, tp, q, 3)
	defer s.close()
	held := []*message.Message{s.next(5 * time.Second), s.next(time.Second), s.next(time.Second)}
	s.none(300 * time.Millisecond)
	if d := f.depth(q.Name); d != "waiting=7 inflight=3 delayed=0 dead=0" {
		t.Fatalf("depth %s", d)
	}
	s.answer(held[0])
	held = append(held[1:], s.next(5*time.Second))
	s.none(100 * time.Millisecond)
	for _, m := range held {
		s.answer(m)
	}
}

func TestHeartbeatKeepsLongRequestsLeased(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("long")
	if err := f.prod.Enqueue(ctx, q.Name, request("long", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	tp := f.transport(rss.Options{LeaseMS: 300, HeartbeatMS: 80, ReclaimIntervalMS: 50})
	defer tp.Close()
	s := subscribe(t, tp, q, 10)
	defer s.close()
	m := s.next(5 * time.Second)
	time.Sleep(time.Second) // > 3 leases
	s.none(10 * time.Millisecond)
	if st := tp.Stats(); st.Reclaimed != 0 || st.LostLeases != 0 {
		t.Fatalf("a heartbeated lease was reclaimed: %+v", st)
	}
	if d := f.depth(q.Name); d != "waiting=0 inflight=1 delayed=0 dead=0" {
		t.Fatalf("depth %s", d)
	}
	s.answer(m)
	if st := tp.Stats(); st.LateResults != 0 {
		t.Fatalf("result discarded: %+v", st)
	}
	if n := f.prod.Client().LLen(ctx, q.ResultName).Val(); n != 1 {
		t.Fatalf("%d results", n)
	}
}

func TestReclaimAfterCrashAndFencedAck(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("reclaim")
	if err := f.prod.Enqueue(ctx, q.Name, request("r1", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	opts := rss.Options{LeaseMS: 300, HeartbeatMS: 100, ReclaimIntervalMS: 50}
	// Replica A claims, then stalls (its heartbeats stop reaching Redis).
	a := f.transport(opts)
	sa := subscribe(t, a, q, 10)
	ma := sa.next(5 * time.Second)
	sa.close()
	crash(a)
	defer a.Close()

	// Replica B gets it back once the lease expired.
	b := f.transport(opts)
	defer b.Close()
	sb := subscribe(t, b, q, 10)
	defer sb.close()
	mb := sb.next(5 * time.Second)
	if idOf(t, mb) != "r1" || mb.Metadata.Get(rss.MetaDeliveries) != "2" {
		t.Fatalf("reclaimed delivery: %s %v", mb.Payload, mb.Metadata)
	}
	if b.Stats().Reclaimed != 1 {
		t.Fatalf("stats %+v", b.Stats())
	}
	// A's late result, written through a healthy client, is discarded: the
	// fence is the lease token, not the replica.
	c := f.transport(rss.Options{})
	defer c.Close()
	pub, _ := c.Publisher(q)
	late := message.NewMessage(ma.UUID, []byte(`{"id":"r1","payload":"late"}`))
	late.Metadata = ma.Metadata
	if err := pub.Publish(q.ResultName, late); err != nil {
		t.Fatal(err)
	}
	if c.Stats().LateResults != 1 {
		t.Fatalf("late result not counted: %+v", c.Stats())
	}
	sb.answer(mb)
	res := f.prod.Client().LRange(ctx, q.ResultName, 0, -1).Val()
	if len(res) != 1 || res[0] == `{"id":"r1","payload":"late"}` {
		t.Fatalf("results %q", res)
	}
	if n := f.prod.Client().HGet(ctx, q.Name+":stats", "late_results").Val(); n != "1" {
		t.Fatalf("late_results counter %q", n)
	}
	if d := f.depth(q.Name); d != "waiting=0 inflight=0 delayed=0 dead=0" {
		t.Fatalf("depth %s", d)
	}
}

func TestMaxDeliveriesDeadLetters(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("poison")
	if err := f.prod.Enqueue(ctx, q.Name, request("p1", "job-p", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	opts := rss.Options{LeaseMS: 250, HeartbeatMS: 80, ReclaimIntervalMS: 50, MaxDeliveries: 2}
	for want := 1; want <= 2; want++ {
		tp := f.transport(opts)
		s := subscribe(t, tp, q, 10)
		m := s.next(5 * time.Second)
		if got := m.Metadata.Get(rss.MetaDeliveries); got != strconv.Itoa(want) {
			t.Fatalf("delivery %s, want %d", got, want)
		}
		s.close()
		crash(tp)
		_ = tp.Close()
	}
	tp := f.transport(opts)
	defer tp.Close()
	s := subscribe(t, tp, q, 10)
	defer s.close()
	res := f.collect(q.ResultName, 1, 5*time.Second)["p1"]
	if res == nil || res.ErrorCode != wire.CodeInferenceError || res.Metadata["job_id"] != "job-p" {
		t.Fatalf("result %+v", res)
	}
	s.none(100 * time.Millisecond)
	if d := f.depth(q.Name); d != "waiting=0 inflight=0 delayed=0 dead=1" {
		t.Fatalf("depth %s", d)
	}
	if tp.Stats().GaveUp != 1 {
		t.Fatalf("stats %+v", tp.Stats())
	}
}

func TestRetryWaitsInDelaySetWithOriginalScore(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("retry")
	req := request("r1", "", time.Hour, nil)
	if err := f.prod.Enqueue(ctx, q.Name, req); err != nil {
		t.Fatal(err)
	}
	// A later request with an earlier deadline must still come second once
	// r1 is due: the retry keeps r1's original (earlier) deadline.
	tp := f.transport(rss.Options{})
	defer tp.Close()
	s := subscribe(t, tp, q, 10)
	defer s.close()
	m := s.next(5 * time.Second)
	score := m.Metadata.Get(rss.MetaScore)
	want, _ := strconv.ParseFloat(rss.Score(req.Deadline), 64)
	if got, err := strconv.ParseFloat(score, 64); err != nil || got != want {
		t.Fatalf("score %s, want %v (the deadline at ms precision)", score, want)
	}
	payload, err := wire.WithRetryCount(m.Payload, 1)
	if err != nil {
		t.Fatal(err)
	}
	const delay = 400 * time.Millisecond
	start := time.Now()
	if err := tp.Requeue(ctx, q, m, payload, start.Add(delay)); err != nil {
		t.Fatal(err)
	}
	transport.Ack(m)
	if d := f.depth(q.Name); d != "waiting=0 inflight=0 delayed=1 dead=0" {
		t.Fatalf("depth %s", d)
	}
	later := request("r2", "", 2*time.Hour, nil)
	if err := f.prod.Enqueue(ctx, q.Name, later); err != nil {
		t.Fatal(err)
	}
	m2 := s.next(time.Second)
	if idOf(t, m2) != "r2" {
		t.Fatalf("got %s before the retry was due", m2.Payload)
	}
	s.answer(m2)
	m3 := s.next(5 * time.Second)
	if waited := time.Since(start); waited < delay {
		t.Fatalf("retry came back after %s, before its due time %s", waited, delay)
	}
	r, err := wire.Decode(m3.Payload)
	if err != nil || r.ID != "r1" || r.RetryCount != 1 || m3.Metadata.Get(rss.MetaScore) != score {
		t.Fatalf("retried delivery %s %v (%v)", m3.Payload, m3.Metadata, err)
	}
	s.answer(m3)
}

func TestResultSurvivesRedisRestart(t *testing.T) {
	dir := t.TempDir()
	r := testenv.StartRedis(t, testenv.RedisOptions{Persist: true, Dir: dir})
	ctx := context.Background()
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	q := queueOf("outage")
	if err := p.Enqueue(ctx, q.Name, request("o1", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: r.URL}, LeaseMS: 10000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	s := subscribe(t, tp, q, 1)
	defer s.close()
	m := s.next(5 * time.Second)
	port, _ := strconv.Atoi(r.Addr[len("127.0.0.1:"):])
	r.Stop()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.answer(m) // retries while Redis is down
	}()
	time.Sleep(700 * time.Millisecond)
	testenv.StartRedis(t, testenv.RedisOptions{Persist: true, Dir: dir, Port: port})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("result write did not complete after Redis came back")
	}
	if n := p.Client().LLen(ctx, q.ResultName).Val(); n != 1 {
		t.Fatalf("%d results after the outage", n)
	}
}

// TestRetryKeepsEnqueueOrderAmongEqualDeadlines: a flat request's retry (the
// core rewrites it as an envelope) comes back at its place among requests of
// the same deadline, before those enqueued after it — the shrunk failure of
// TestModelSortedSet's requeue step, where it came back behind them.
func TestRetryKeepsEnqueueOrderAmongEqualDeadlines(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q := queueOf("retry-ties")
	dl := time.Now().Add(time.Hour)
	var reqs []*wire.Request
	for _, id := range []string{"a", "b", "c"} {
		r := request(id, "job1", time.Hour, nil)
		r.Deadline = dl
		reqs = append(reqs, r)
	}
	if err := f.prod.EnqueueMany(ctx, q.Name, reqs); err != nil {
		t.Fatal(err)
	}
	tp := f.transport(rss.Options{LeaseMS: 600000, HeartbeatMS: 300000, PollIntervalMS: 600000})
	defer tp.Close()
	src, err := tp.Source(q)
	if err != nil {
		t.Fatal(err)
	}
	octx, stop := context.WithCancel(ctx)
	if err := src.Open(octx); err != nil {
		t.Fatal(err)
	}
	defer func() { stop(); _ = src.Close() }()
	for retry := 1; retry <= 2; retry++ {
		ms, err := src.Claim(ctx, 1)
		if err != nil || len(ms) != 1 || idOf(t, ms[0]) != "a" {
			t.Fatalf("claim %d: %v %v, want a", retry, ms, err)
		}
		payload, err := wire.WithEnvelope(ms[0].Payload, retry, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tp.Requeue(ctx, q, ms[0], payload, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	ms, err := src.Claim(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, idOf(t, m))
	}
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("claim order %v after a's retries, want [a b c] (one deadline: enqueue order)", got)
	}
	r, err := wire.Decode(ms[0].Payload)
	if err != nil || r.RetryCount != 2 || r.ID != "a" || r.Metadata["job_id"] != "job1" {
		t.Fatalf("retried a decodes to %+v (%v)", r, err)
	}
}

// Every owner token is longer than Redis' hash-max-listpack-value (64
// bytes by default), so Q:claim-owners is a hash table from the first
// claim on: kept as a listpack (it would stay one up to 512 claims), every
// write and lookup of the claim, settle and renewal scans it from the start.
func TestOwnersHashIsAHashTable(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q, results := rss.RequestQueueName("owners"), rss.ResultQueueName("owners", "")
	if err := f.prod.EnqueueMany(ctx, q, []*wire.Request{request("a", "", time.Hour, nil), request("b", "", time.Hour, nil)}); err != nil {
		t.Fatal(err)
	}
	tp := f.transport(rss.Options{})
	t.Cleanup(func() { _ = tp.Close() })
	src, sctx := openSource(t, tp, q, results)
	ms, err := src.Claim(sctx, 2)
	if err != nil || len(ms) != 2 {
		t.Fatalf("claim: %d messages, %v", len(ms), err)
	}
	c := testenv.RedisClient(t, f.redisURL)
	cfg, err := c.ConfigGet(ctx, "hash-max-listpack-value").Result()
	if err != nil {
		t.Fatal(err)
	}
	limit, err := strconv.Atoi(cfg["hash-max-listpack-value"])
	if err != nil {
		t.Fatalf("hash-max-listpack-value: %v", err)
	}
	for _, m := range ms {
		if tok := m.Metadata.Get(rss.MetaLease); len(tok) <= limit {
			t.Errorf("owner token %q is %d bytes: not above hash-max-listpack-value %d", tok, len(tok), limit)
		}
	}
	if enc := c.ObjectEncoding(ctx, q+":claim-owners").Val(); enc != "hashtable" {
		t.Errorf("%s:claim-owners is a %q, want a hashtable", q, enc)
	}
}
