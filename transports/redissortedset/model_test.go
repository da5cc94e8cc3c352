package redissortedset_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/model"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The state-machine test of the lease/fence protocol (docs/verification.md):
// rapid draws interleavings of the steps of three replicas on one queue of a
// real redis-server — claim, heartbeat, settle, hand-back, a lease running
// out, reclaim, a crash (a replica's state dropped with nothing handed back),
// a crash between the calls of one settle, a graceful close, a restart, a
// restart of Redis (kill -9, append-only file fsynced on every write) — and
// compares Redis with internal/model's LeaseQueue after every step. At the
// end every request must have exactly one result. Failing runs shrink to a
// minimal sequence that rapid keeps under testdata/rapid and replays first.
//
// The replicas' own loops (heartbeat, reclaim) are held off by leases of ten
// minutes; the test runs their steps itself. A lease runs out by setting its
// expiry in <q>:claims-idx into the past by Redis' clock, which is what a
// holder that misses its heartbeats for a lease's length leads to.

// modelChecks bounds the number of rapid checks of a model test in `make
// test` unless -rapid.checks was given (make verify runs thousands).
func modelChecks(t *testing.T, n int) {
	t.Helper()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
	if given {
		return
	}
	f := flag.Lookup("rapid.checks")
	old := f.Value.String()
	if err := f.Value.Set(strconv.Itoa(n)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Value.Set(old) })
}

// modelRedis is the test's redis-server; restart kills it and starts it again
// on the same port and data.
type modelRedis struct {
	t    *testing.T
	r    *testenv.Redis
	port int
}

func (m *modelRedis) restart() {
	dir := m.r.Dir()
	m.r.Stop()
	m.r = testenv.StartRedis(m.t, testenv.RedisOptions{Persist: true, Dir: dir, Port: m.port})
}

func startModelRedis(t *testing.T) *modelRedis {
	port := testenv.FreePort(t)
	return &modelRedis{t: t, port: port, r: testenv.StartRedis(t, testenv.RedisOptions{Persist: true, Dir: t.TempDir(), Port: port})}
}

func TestModelSortedSet(t *testing.T) {
	modelChecks(t, 12)
	rd := startModelRedis(t)
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		m := newSSMachine(rt, rd, fmt.Sprintf("mq%d", run.Add(1)), rapid.Bool().Draw(rt, "envelope"))
		defer m.close()
		rt.Repeat(map[string]func(*rapid.T){
			"enqueue":      m.enqueue,
			"claim":        m.claim,
			"heartbeat":    m.heartbeat,
			"settle":       m.settle,
			"settleCrash":  m.settleCrash,
			"handBack":     m.handBack,
			"expire":       m.expire,
			"reclaim":      m.reclaim,
			"crash":        m.crash,
			"close":        m.closeReplica,
			"restart":      m.restart,
			"redisRestart": m.redisRestart,
			"":             m.check,
		})
		m.drain(rt)
	})
}

const modelReplicas = 3

type ssMachine struct {
	rd    *modelRedis
	ctx   context.Context
	q     transport.Queue
	k     keys.Queue
	env   bool
	prod  *producer.Producer
	admin *redis.Client
	model *model.LeaseQueue
	reps  [modelReplicas]*ssReplica
	ids   int
	base  time.Time
}

// ssReplica is one sluice replica: its transport, source and publisher, and
// the deliveries it holds (by owner token).
type ssReplica struct {
	tp     *rss.Transport
	src    transport.Source
	pub    message.Publisher
	cancel context.CancelFunc
	held   map[string]*message.Message
	order  []string // tokens in the order they were delivered
}

func newSSMachine(rt *rapid.T, rd *modelRedis, queue string, envelope bool) *ssMachine {
	m := &ssMachine{rd: rd, ctx: context.Background(), env: envelope, model: model.NewLeaseQueue(2),
		base: time.Now().Add(time.Hour).Truncate(time.Second)}
	m.q = transport.Queue{Name: queue, ResultName: queue + ":results"}
	m.k = keys.Names{}.Queue(queue)
	m.admin = redis.NewClient(&redis.Options{Addr: rd.r.Addr})
	p, err := producer.Dial(rd.r.URL, producer.Config{Envelope: envelope, ResultQueueName: m.q.ResultName})
	if err != nil {
		rt.Fatal(err)
	}
	m.prod = p
	for i := range m.reps {
		m.reps[i] = m.start(rt)
	}
	return m
}

func (m *ssMachine) start(rt *rapid.T) *ssReplica {
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: m.rd.r.URL}, LeaseMS: 600000, HeartbeatMS: 300000, ReclaimIntervalMS: 600000,
		PollIntervalMS: 600000, MaxDeliveries: 2}, nil)
	if err != nil {
		rt.Fatal(err)
	}
	src, err := tp.Source(m.q)
	if err != nil {
		rt.Fatal(err)
	}
	pub, err := tp.Publisher(m.q)
	if err != nil {
		rt.Fatal(err)
	}
	ctx, cancel := context.WithCancel(m.ctx)
	if err := src.Open(ctx); err != nil {
		rt.Fatal(err)
	}
	return &ssReplica{tp: tp, src: src, pub: pub, cancel: cancel, held: map[string]*message.Message{}}
}

// crash ends a replica as kill -9 would: its loops stop and its client
// closes, nothing is handed back.
func (r *ssReplica) crash() {
	r.cancel()
	rss.Crash(r.tp)
	_ = r.src.Close()
}

func (m *ssMachine) close() {
	for i, r := range m.reps {
		if r != nil {
			r.crash()
			m.reps[i] = nil
		}
	}
	_ = m.prod.Close()
	_ = m.admin.Close()
}

// replica draws a live replica, skipping the step when none is.
func (m *ssMachine) replica(rt *rapid.T) (int, *ssReplica) {
	var live []int
	for i, r := range m.reps {
		if r != nil {
			live = append(live, i)
		}
	}
	if len(live) == 0 {
		rt.Skip("no replica up")
	}
	i := rapid.SampledFrom(live).Draw(rt, "replica")
	return i, m.reps[i]
}

// delivery draws a delivery a live replica holds.
func (m *ssMachine) delivery(rt *rapid.T) (int, *ssReplica, string, *message.Message) {
	var cands [][2]int
	for i, r := range m.reps {
		if r != nil {
			for j := range r.order {
				cands = append(cands, [2]int{i, j})
			}
		}
	}
	if len(cands) == 0 {
		rt.Skip("no delivery held")
	}
	c := rapid.SampledFrom(cands).Draw(rt, "delivery")
	r := m.reps[c[0]]
	tok := r.order[c[1]]
	return c[0], r, tok, r.held[tok]
}

func (r *ssReplica) forget(tok string) {
	delete(r.held, tok)
	r.order = slices.DeleteFunc(r.order, func(s string) bool { return s == tok })
}

func requestID(rt *rapid.T, member []byte) string {
	req, err := wire.Decode(member)
	if err != nil {
		rt.Fatalf("undecodable member %q: %v", member, err)
	}
	return req.ID
}

func (m *ssMachine) enqueue(rt *rapid.T) {
	n := rapid.IntRange(1, 3).Draw(rt, "n")
	reqs := make([]*wire.Request, n)
	for i := range reqs {
		m.ids++
		id := "r" + strconv.Itoa(m.ids)
		dl := m.base.Add(time.Duration(rapid.IntRange(0, 2).Draw(rt, "deadline")) * time.Second)
		reqs[i] = &wire.Request{ID: id, Deadline: dl, Created: time.Now(), Payload: json.RawMessage(`{"prompt":"hi"}`)}
	}
	if err := m.prod.EnqueueMany(m.ctx, m.q.Name, reqs); err != nil {
		rt.Fatal(err)
	}
	for _, r := range reqs {
		m.model.Enqueue(r.ID, r.Deadline.UnixMilli())
	}
}

func (m *ssMachine) claim(rt *rapid.T) {
	_, r := m.replica(rt)
	n := rapid.IntRange(1, 3).Draw(rt, "n")
	msgs, err := r.src.Claim(m.ctx, n)
	if err != nil {
		rt.Fatal(err)
	}
	want := m.model.Claim(n)
	var wantIDs []string
	for _, c := range want {
		if !c.GaveUp {
			wantIDs = append(wantIDs, c.ID)
		}
	}
	var got []string
	for _, msg := range msgs {
		got = append(got, requestID(rt, msg.Payload))
	}
	if !slices.Equal(got, wantIDs) {
		rt.Fatalf("claim of %d delivered %v, the model %v (claim order: deadline, then enqueue order; given up: %v)", n, got, wantIDs, want)
	}
	for i, msg := range msgs {
		if err := m.model.Bind(got[i], msg.UUID); err != nil {
			rt.Fatal(err)
		}
		r.held[msg.UUID] = msg
		r.order = append(r.order, msg.UUID)
	}
}

func (m *ssMachine) heartbeat(rt *rapid.T) {
	_, r := m.replica(rt)
	rss.Heartbeat(r.tp, m.q.Name)
	held := map[string]string{}
	for tok, msg := range r.held {
		held[tok] = requestID(rt, msg.Payload)
	}
	m.model.Heartbeat(held)
}

// result is the result message the core publishes for delivery d.
func result(rt *rapid.T, d *message.Message) *message.Message {
	id := requestID(rt, d.Payload)
	res := message.NewMessage("res-"+d.UUID, (&wire.Result{ID: id, StatusCode: 200, Payload: `{"ok":true}`}).Marshal())
	for k, v := range d.Metadata {
		res.Metadata.Set(k, v)
	}
	return res
}

func (m *ssMachine) settle(rt *rapid.T) {
	_, r, tok, d := m.delivery(rt)
	if err := r.pub.Publish(m.q.ResultName, result(rt, d)); err != nil {
		rt.Fatal(err)
	}
	r.src.Settle(d, true)
	r.forget(tok)
	m.model.Settle(requestID(rt, d.Payload), tok)
}

// settleCrash settles a delivery and crashes the replica right after the
// first script call of the settle (the whole settle, as it is one call).
func (m *ssMachine) settleCrash(rt *rapid.T) {
	m.keepOneUp(rt)
	i, r, tok, d := m.delivery(rt)
	rss.SetSettleHook(r.tp, func() error { return rss.ErrClosed })
	if err := r.pub.Publish(m.q.ResultName, result(rt, d)); !errors.Is(err, rss.ErrClosed) {
		rt.Fatalf("settle with a crash after its first call: %v, want ErrClosed", err)
	}
	m.model.Settle(requestID(rt, d.Payload), tok)
	r.crash()
	m.reps[i] = nil
}

func (m *ssMachine) handBack(rt *rapid.T) {
	_, r, tok, d := m.delivery(rt)
	r.src.Settle(d, false) // a nack
	r.forget(tok)
	m.model.HandBack(requestID(rt, d.Payload), tok)
}

// claimOf returns the claim id owned by token (claims-owners).
func (m *ssMachine) claimOf(rt *rapid.T, token string) string {
	owners, err := m.admin.HGetAll(m.ctx, m.k.Owners).Result()
	if err != nil {
		rt.Fatal(err)
	}
	for ck, tok := range owners {
		if tok == token {
			return ck
		}
	}
	rt.Fatalf("no claim owned by %s in %s (%v)", token, m.k.Owners, owners)
	return ""
}

func (m *ssMachine) redisNow(rt *rapid.T) time.Time {
	now, err := m.admin.Time(m.ctx).Result()
	if err != nil {
		rt.Fatal(err)
	}
	return now
}

func (m *ssMachine) expire(rt *rapid.T) {
	claims := m.model.Claims()
	var ids []string
	for id := range claims {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		rt.Skip("nothing claimed")
	}
	slices.Sort(ids)
	id := rapid.SampledFrom(ids).Draw(rt, "claim")
	ck := m.claimOf(rt, claims[id].Token)
	past := float64(m.redisNow(rt).Add(-time.Second).UnixMilli()) / 1000
	if err := m.admin.ZAddXX(m.ctx, m.k.ClaimsIdx, redis.Z{Score: past, Member: ck}).Err(); err != nil {
		rt.Fatal(err)
	}
	m.model.Expire(id)
}

func (m *ssMachine) reclaim(rt *rapid.T) {
	_, r := m.replica(rt)
	rss.Reclaim(r.tp, m.q.Name)
	m.model.Reclaim()
}

func (m *ssMachine) crash(rt *rapid.T) {
	m.keepOneUp(rt)
	i, r := m.replica(rt)
	r.crash()
	m.reps[i] = nil
}

// closeReplica shuts a replica down gracefully: Close hands back what it holds.
func (m *ssMachine) closeReplica(rt *rapid.T) {
	m.keepOneUp(rt)
	i, r := m.replica(rt)
	r.cancel()
	if err := r.tp.Close(); err != nil {
		rt.Fatal(err)
	}
	_ = r.src.Close()
	for tok, d := range r.held {
		m.model.HandBack(requestID(rt, d.Payload), tok)
	}
	m.reps[i] = nil
}

func (m *ssMachine) restart(rt *rapid.T) {
	var down []int
	for i, r := range m.reps {
		if r == nil {
			down = append(down, i)
		}
	}
	if len(down) == 0 {
		rt.Skip("every replica is up")
	}
	i := rapid.SampledFrom(down).Draw(rt, "slot")
	m.reps[i] = m.start(rt)
}

func (m *ssMachine) redisRestart(rt *rapid.T) {
	if rapid.IntRange(0, 7).Draw(rt, "rarely") != 0 {
		rt.Skip("Redis restarts are slow: one draw in eight")
	}
	m.rd.restart()
}

// check compares Redis with the model.
func (m *ssMachine) check(rt *rapid.T) {
	if err := m.model.Check(); err != nil {
		rt.Fatal(err)
	}
	ctx := m.ctx
	members, err := m.admin.ZRange(ctx, m.q.Name, 0, -1).Result()
	if err != nil {
		rt.Fatal(err)
	}
	var waiting []string
	for _, mb := range members {
		waiting = append(waiting, requestID(rt, []byte(mb)))
	}
	if want := m.model.Waiting(); !slices.Equal(waiting, want) {
		rt.Fatalf("waiting in Redis %v, in the model %v", waiting, want)
	}
	owners, err := m.admin.HGetAll(ctx, m.k.Owners).Result()
	if err != nil {
		rt.Fatal(err)
	}
	claimed, err := m.admin.HGetAll(ctx, m.k.Claimed).Result()
	if err != nil {
		rt.Fatal(err)
	}
	idx, err := m.admin.ZRangeWithScores(ctx, m.k.ClaimsIdx, 0, -1).Result()
	if err != nil {
		rt.Fatal(err)
	}
	exp := map[string]float64{}
	for _, z := range idx {
		exp[z.Member.(string)] = z.Score
	}
	want := m.model.Claims()
	if len(owners) != len(want) || len(claimed) != len(want) || len(exp) != len(want) {
		rt.Fatalf("claims in Redis: %d owners, %d claimed, %d in the index; in the model %d (%v)", len(owners), len(claimed), len(exp), len(want), want)
	}
	now := float64(m.redisNow(rt).UnixMilli()) / 1000
	for ck, tok := range owners {
		id := requestID(rt, []byte(claimed[ck]))
		c, ok := want[id]
		if !ok || c.Token != tok {
			rt.Fatalf("claim %q of %s owned by %s in Redis; the model: %+v (claimed %v)", ck, id, tok, c, ok)
		}
		e, ok := exp[ck]
		if !ok {
			rt.Fatalf("claim %q of %s has no lease expiry", ck, id)
		}
		if live := e > now; live != c.Live {
			rt.Fatalf("lease of %s live=%v in Redis (expiry %.3f, now %.3f), the model live=%v", id, live, e, now, c.Live)
		}
	}
	got := m.results(rt)
	if wantR := m.model.Results(); !mapsEqual(got, wantR) {
		rt.Fatalf("results in Redis %v, in the model %v", got, wantR)
	}
}

func (m *ssMachine) results(rt *rapid.T) map[string]int {
	res, err := m.admin.LRange(m.ctx, m.q.ResultName, 0, -1).Result()
	if err != nil {
		rt.Fatal(err)
	}
	got := map[string]int{}
	for _, s := range res {
		var r struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			rt.Fatalf("result %q: %v", s, err)
		}
		got[r.ID]++
	}
	return got
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// drain ends a run: every lease runs out and is reclaimed, and one replica
// claims and settles until the queue is empty. Then every request must have
// exactly one result.
func (m *ssMachine) drain(rt *rapid.T) {
	if m.reps[0] == nil {
		m.reps[0] = m.start(rt)
	}
	r := m.reps[0]
	for round := 0; round < 20; round++ {
		for id, c := range m.model.Claims() {
			ck := m.claimOf(rt, c.Token)
			if err := m.admin.ZAddXX(m.ctx, m.k.ClaimsIdx, redis.Z{Score: 0, Member: ck}).Err(); err != nil {
				rt.Fatal(err)
			}
			m.model.Expire(id)
		}
		rss.Reclaim(r.tp, m.q.Name)
		m.model.Reclaim()
		m.check(rt)
		if len(m.model.Waiting()) == 0 {
			break
		}
		before := len(r.order)
		m.claimN(rt, r, 100)
		for _, tok := range r.order[before:] {
			d := r.held[tok]
			if err := r.pub.Publish(m.q.ResultName, result(rt, d)); err != nil {
				rt.Fatal(err)
			}
			r.src.Settle(d, true)
			m.model.Settle(requestID(rt, d.Payload), tok)
		}
		for _, tok := range slices.Clone(r.order[before:]) {
			r.forget(tok)
		}
		m.check(rt)
	}
	if left := m.model.Unanswered(); len(left) > 0 {
		rt.Fatalf("requests without a result after the drain: %v", left)
	}
	for id, n := range m.results(rt) {
		if n != 1 {
			rt.Fatalf("request %s has %d results", id, n)
		}
	}
}

func (m *ssMachine) claimN(rt *rapid.T, r *ssReplica, n int) {
	msgs, err := r.src.Claim(m.ctx, n)
	if err != nil {
		rt.Fatal(err)
	}
	want := m.model.Claim(n)
	var wantIDs []string
	for _, c := range want {
		if !c.GaveUp {
			wantIDs = append(wantIDs, c.ID)
		}
	}
	var got []string
	for _, msg := range msgs {
		got = append(got, requestID(rt, msg.Payload))
	}
	if !slices.Equal(got, wantIDs) {
		rt.Fatalf("drain claim delivered %v, the model %v", got, wantIDs)
	}
	for i, msg := range msgs {
		if err := m.model.Bind(got[i], msg.UUID); err != nil {
			rt.Fatal(err)
		}
		r.held[msg.UUID] = msg
		r.order = append(r.order, msg.UUID)
	}
}

// keepOneUp skips a step that would take down the last replica up: the
// interesting interleavings need a live one.
func (m *ssMachine) keepOneUp(rt *rapid.T) {
	up := 0
	for _, r := range m.reps {
		if r != nil {
			up++
		}
	}
	if up < 2 {
		rt.Skip("keep one up")
	}
}
