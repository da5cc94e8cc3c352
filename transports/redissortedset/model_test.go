package redissortedset_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/model"
	"github.com/sluice-io/sluice/internal/redisclient"
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
// restart of Redis (kill -9, append-only file fsynced on every write), a
// jump of Redis' own wall clock forward past the lease or back — and
// compares Redis with internal/model's LeaseQueue after every step. At the
// end every request must have exactly one result. Failing runs shrink to a
// minimal sequence that rapid keeps under testdata/rapid and replays first.
//
// The replicas' own loops (heartbeat, reclaim) are held off by leases of ten
// minutes; the test runs their steps itself. A lease runs out by setting its
// expiry in <q>:claims-idx into the past by Redis' clock, which is what a
// holder that misses its heartbeats for a lease's length leads to.

// modelChecks bounds the number of rapid checks of the model tests in
// `make test` unless -rapid.checks was given (make verify runs thousands).
// The bound is set once and kept (only the model tests of this package use
// rapid), so that the two model tests can run side by side: each waits on
// its own servers most of the time.
func modelChecks(t *testing.T, n int) {
	t.Helper()
	modelChecksOnce.Do(func() {
		given := false
		flag.Visit(func(f *flag.Flag) { given = given || f.Name == "rapid.checks" })
		if !given {
			modelChecksErr = flag.Lookup("rapid.checks").Value.Set(strconv.Itoa(n))
		}
	})
	if modelChecksErr != nil {
		t.Fatal(modelChecksErr)
	}
}

var (
	modelChecksOnce sync.Once
	modelChecksErr  error
)

// modelRedis is the test's redis-server (or a Redis Cluster of one master,
// for the cross-slot settle); restart kills it (kill -9) and starts it
// again on the same port and data: an append-only file fsynced on every
// write, what a deployment that relies on Redis' durability runs.
type modelRedis struct {
	t     *testing.T
	r     *testenv.Redis
	c     *testenv.RedisCluster
	port  int
	clock *testenv.FakeClock // steps the server's wall clock (the clock-jump steps)
}

func (m *modelRedis) url() string {
	if m.c != nil {
		return m.c.URL
	}
	return m.r.URL
}

func (m *modelRedis) addr() string {
	if m.c != nil {
		return m.c.Nodes[0].Addr
	}
	return m.r.Addr
}

func (m *modelRedis) restart() error {
	if m.c != nil {
		return m.c.Restart(0)
	}
	dir := m.r.Dir()
	m.r.Stop()
	r, err := testenv.StartRedisProcess(testenv.RedisOptions{Persist: true, Dir: dir, Port: m.port, Env: m.clock.Env()})
	if err != nil {
		return err
	}
	m.t.Cleanup(r.Stop)
	m.r = r
	return nil
}

func startModelRedis(t *testing.T) *modelRedis {
	port := testenv.FreePort(t)
	clk := testenv.NewFakeClock(t)
	return &modelRedis{t: t, port: port, clock: clk,
		r: testenv.StartRedis(t, testenv.RedisOptions{Persist: true, Dir: t.TempDir(), Port: port, Env: clk.Env()})}
}

// startModelCluster starts a Redis Cluster of one master (every slot on
// it), persistent as startModelRedis: upstream's queue names put the result
// list in another slot than the claims there, so results take the
// cross-slot settle (three script calls).
func startModelCluster(t *testing.T) *modelRedis {
	clk := testenv.NewFakeClock(t)
	return &modelRedis{t: t, clock: clk, c: testenv.StartRedisCluster(t, testenv.RedisClusterOptions{Masters: 1, NoReplicas: true, Persist: true, Env: clk.Env()})}
}

func TestModelSortedSet(t *testing.T) {
	modelChecks(t, 12)
	t.Parallel()
	runSSModel(t, startModelRedis(t))
}

// TestModelSortedSetCrossSlot is the same machine on a Redis Cluster with
// upstream's queue names, whose results take the three-step cross-slot
// settle (xslot.go), with three more steps inserted between its script
// calls: a crash, a restart of Redis, and a pause of the settling replica
// (frozen there while its lease runs out and another replica's reclaimer
// finishes its settle, then resumed).
func TestModelSortedSetCrossSlot(t *testing.T) {
	modelChecks(t, 12)
	t.Parallel()
	runSSModel(t, startModelCluster(t))
}

func runSSModel(t *testing.T, rd *modelRedis) {
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		// Envelopes: on one Redis sluice's producer writes them; on the
		// cluster, where sluice's producer refuses them (upstream's
		// per-request keys are in other slots), upstream's own producer
		// does, as it writes them there (upProducer, mode cluster).
		envelope := rapid.Bool().Draw(rt, "envelope")
		m := newSSMachine(rt, rd, fmt.Sprintf("mq%d", run.Add(1)), envelope)
		defer m.close()
		steps := map[string]func(*rapid.T){
			"enqueue":      m.enqueue,
			"claim":        m.claim,
			"heartbeat":    m.heartbeat,
			"settle":       m.settle,
			"settleCrash":  m.settleCrash,
			"handBack":     m.handBack,
			"requeue":      m.requeue,
			"due":          m.due,
			"expire":       m.expire,
			"reclaim":      m.reclaim,
			"crash":        m.crash,
			"close":        m.closeReplica,
			"restart":      m.restart,
			"redisRestart": m.redisRestart,
			"clockForward": m.clockForward,
			"clockBack":    m.clockBack,
			"":             m.check,
		}
		if m.cross {
			steps["settleRedisRestart"] = m.settleRedisRestart
			steps["pause"] = m.pause
			steps["resume"] = m.resume
		}
		rt.Repeat(steps)
		m.drain(rt)
	})
}

const modelReplicas = 3

type ssMachine struct {
	rd    *modelRedis
	cross bool // a cluster, the result list in another slot: the cross-slot settle
	ctx   context.Context
	q     transport.Queue
	k     keys.Queue
	env   bool
	prod  *producer.Producer
	up    *upProducer // upstream's producer (the cluster's envelope runs), else nil
	idp   string      // request id prefix (upstream's per-request keys are global)
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
	paused *pausedSettle
}

// pausedSettle is a settle frozen between two of its script calls (the
// replica paused there, as by SIGSTOP: it takes no step until resumed).
type pausedSettle struct {
	id, tok string
	release chan struct{}
	done    chan error
}

func newSSMachine(rt *rapid.T, rd *modelRedis, queue string, envelope bool) *ssMachine {
	m := &ssMachine{rd: rd, cross: rd.c != nil, ctx: context.Background(), env: envelope, model: model.NewLeaseQueue(2),
		base: time.Now().Add(time.Hour).Truncate(time.Second)}
	// Leases of 610 s (modelLeaseMS): the clock jumps are multiples of five
	// minutes, so no sum of them lands on a lease's edge, where the claim's
	// rounding of the expiry up to a whole second would decide.
	m.model.LeaseTTL = modelLeaseMS / 1000
	if err := rd.clock.Set(0); err != nil { // the model's clock starts at 0
		rt.Fatal(err)
	}
	m.q = transport.Queue{Name: queue, ResultName: queue + ":results"}
	m.k = keys.Names{}.Queue(queue)
	mode := ""
	if m.cross {
		// Upstream's names: no hash tag, so the result list is (for
		// this pool) in another slot than the claim keys.
		pool := queue
		for i := 0; ; i++ {
			m.q = transport.Queue{Name: "llm-d-async:requests:" + pool, ResultName: "llm-d-async:results:" + pool + ":$batch"}
			if redisclient.Slot(m.q.Name) != redisclient.Slot(m.q.ResultName) {
				break
			}
			pool = queue + "x" + strconv.Itoa(i)
		}
		m.k = keys.Names{Cluster: true}.Queue(m.q.Name)
		mode = "cluster"
	}
	m.admin = redis.NewClient(&redis.Options{Addr: rd.addr()})
	if m.cross && envelope {
		m.up = &upProducer{c: m.admin, queue: m.q.Name, results: m.q.ResultName, cluster: true}
		m.idp = queue + "."
		envelope = false
	}
	p, err := producer.Dial(rd.url(), producer.Config{TopologyOptions: rss.TopologyOptions{Mode: mode}, Envelope: envelope, ResultQueueName: m.q.ResultName})
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
	mode := ""
	if m.cross {
		mode = "cluster"
	}
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: m.rd.url()}, TopologyOptions: rss.TopologyOptions{Mode: mode},
		LeaseMS: modelLeaseMS, HeartbeatMS: 300000, ReclaimIntervalMS: 600000,
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
			if r.paused != nil {
				close(r.paused.release)
				select {
				case <-r.paused.done:
				case <-time.After(30 * time.Second):
				}
			}
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
		if r != nil && r.paused == nil {
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
		if r != nil && r.paused == nil {
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
		id := m.idp + "r" + strconv.Itoa(m.ids)
		dl := m.base.Add(time.Duration(rapid.IntRange(0, 2).Draw(rt, "deadline")) * time.Second)
		reqs[i] = &wire.Request{ID: id, Deadline: dl, Created: time.Now(), Payload: json.RawMessage(`{"prompt":"hi"}`)}
	}
	if m.up != nil {
		// Upstream's producer, one request at a time: its score is
		// deadline + enqueue_seq/2^21, the sequence per (queue, deadline).
		for _, r := range reqs {
			if _, err := m.up.submitErr(m.ctx, r.ID, r.Deadline.Unix(), string(r.Payload)); err != nil {
				rt.Fatal(err)
			}
		}
	} else if err := m.prod.EnqueueMany(m.ctx, m.q.Name, reqs); err != nil {
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

// settleCrash settles a delivery and crashes the replica inside the
// settle: on one slot right after its one script call; across slots (drawn)
// before any of its three steps, or after them before the payload key's
// DEL.
func (m *ssMachine) settleCrash(rt *rapid.T) {
	m.keepOneUp(rt)
	i, r, tok, d := m.delivery(rt)
	id := requestID(rt, d.Payload)
	if m.cross {
		p := rapid.SampledFrom(faultPoints).Draw(rt, "crashBefore")
		rss.SetFaultHook(r.tp, func(q int) error {
			if q == p {
				return rss.ErrClosed
			}
			return nil
		})
		if err := r.pub.Publish(m.q.ResultName, result(rt, d)); !errors.Is(err, rss.ErrClosed) {
			rt.Fatalf("settle with a crash before step %d: %v, want ErrClosed", p, err)
		}
		m.stepsBefore(id, tok, p)
	} else {
		rss.SetSettleHook(r.tp, func() error { return rss.ErrClosed })
		if err := r.pub.Publish(m.q.ResultName, result(rt, d)); !errors.Is(err, rss.ErrClosed) {
			rt.Fatalf("settle with a crash after its first call: %v, want ErrClosed", err)
		}
		m.model.Settle(id, tok)
	}
	r.crash()
	m.reps[i] = nil
}

// faultPoints are the points of the cross-slot settle a step can stop at:
// before PREPARE, PUSH, COMMIT, and the payload key's DEL.
var faultPoints = []int{rss.FaultBeforePrepare, rss.FaultBeforePush, rss.FaultBeforeCommit, rss.FaultBeforePayloadDel}

// stepsBefore applies to the model the steps of a cross-slot settle of id
// under tok that ran before fault point p. Each is fenced by tok, as in
// Redis: a settle whose PREPARE found the claim lost pushes and commits
// nothing.
func (m *ssMachine) stepsBefore(id, tok string, p int) {
	switch p {
	case rss.FaultBeforePush:
		m.model.Prepare(id, tok)
	case rss.FaultBeforeCommit:
		m.model.Prepare(id, tok)
		m.model.Push(id, tok)
	case rss.FaultBeforePayloadDel:
		m.model.Settle(id, tok)
	}
}

// settleRedisRestart settles a delivery across slots with a restart of
// Redis (kill -9, then the same append-only file) before one of its steps,
// drawn: the settle goes on on the restarted server (retrying from the
// step that failed) and must end settled, its result written once.
func (m *ssMachine) settleRedisRestart(rt *rapid.T) {
	if rapid.IntRange(0, 3).Draw(rt, "rarely") != 0 {
		rt.Skip("Redis restarts are slow: one draw in four")
	}
	_, r, tok, d := m.delivery(rt)
	p := rapid.SampledFrom(faultPoints).Draw(rt, "restartBefore")
	var once sync.Once
	var rerr error
	rss.SetFaultHook(r.tp, func(q int) error {
		if q == p {
			once.Do(func() { rerr = m.rd.restart() })
		}
		return nil
	})
	err := r.pub.Publish(m.q.ResultName, result(rt, d))
	rss.SetFaultHook(r.tp, nil)
	if rerr != nil {
		rt.Fatal(rerr)
	}
	if err != nil {
		rt.Fatalf("settle with a Redis restart before step %d: %v", p, err)
	}
	r.src.Settle(d, true)
	r.forget(tok)
	m.model.Settle(requestID(rt, d.Payload), tok)
}

// pause freezes a replica inside a cross-slot settle, before PREPARE, PUSH
// or COMMIT (drawn), as SIGSTOP would: its settle stops between two script
// calls, it heartbeats no more and takes no step until resume. Meanwhile
// its leases can run out and another replica reclaim them, claim them
// again, or finish its prepared settle.
func (m *ssMachine) pause(rt *rapid.T) {
	m.keepOneUp(rt)
	_, r, tok, d := m.delivery(rt)
	id := requestID(rt, d.Payload)
	p := rapid.SampledFrom(faultPoints[:3]).Draw(rt, "pauseBefore")
	ps := &pausedSettle{id: id, tok: tok, release: make(chan struct{}), done: make(chan error, 1)}
	reached := make(chan struct{})
	var once sync.Once
	rss.SetFaultHook(r.tp, func(q int) error {
		if q == p {
			once.Do(func() {
				close(reached)
				<-ps.release
			})
		}
		return nil
	})
	res := result(rt, d)
	go func() { ps.done <- r.pub.Publish(m.q.ResultName, res) }()
	select {
	case <-reached:
	case err := <-ps.done:
		rt.Fatalf("settle ended (%v) before the pause at step %d", err, p)
	case <-time.After(10 * time.Second):
		rt.Fatalf("settle did not reach step %d within 10 s", p)
	}
	r.paused = ps
	m.stepsBefore(id, tok, p)
}

// resume lets a paused replica go on: its settle runs its remaining steps
// (the model's Settle, fenced by its token: a holder whose claim was taken
// writes nothing, one whose settle a reclaimer finished adds nothing).
func (m *ssMachine) resume(rt *rapid.T) {
	var paused []int
	for i, r := range m.reps {
		if r != nil && r.paused != nil {
			paused = append(paused, i)
		}
	}
	if len(paused) == 0 {
		rt.Skip("no replica paused")
	}
	m.resumeReplica(rt, m.reps[rapid.SampledFrom(paused).Draw(rt, "paused")])
}

func (m *ssMachine) resumeReplica(rt *rapid.T, r *ssReplica) {
	ps := r.paused
	close(ps.release)
	select {
	case err := <-ps.done:
		if err != nil {
			rt.Fatalf("resumed settle of %s: %v", ps.id, err)
		}
	case <-time.After(30 * time.Second):
		rt.Fatalf("resumed settle of %s did not end within 30 s", ps.id)
	}
	rss.SetFaultHook(r.tp, nil)
	r.paused = nil
	r.src.Settle(r.held[ps.tok], true)
	r.forget(ps.tok)
	m.model.Settle(ps.id, ps.tok)
}

func (m *ssMachine) handBack(rt *rapid.T) {
	_, r, tok, d := m.delivery(rt)
	r.src.Settle(d, false) // a nack
	r.forget(tok)
	m.model.HandBack(requestID(rt, d.Payload), tok)
}

// requeue retries a delivery as the core's retry middleware does: its
// message rewritten with the next retry count, swapped for an entry of the
// delay set due at once or in ten minutes (the due step moves it).
func (m *ssMachine) requeue(rt *rapid.T) {
	_, r, tok, d := m.delivery(rt)
	req, err := wire.Decode(d.Payload)
	if err != nil {
		rt.Fatal(err)
	}
	payload, err := wire.WithEnvelope(d.Payload, req.RetryCount+1, req.Labels)
	if err != nil {
		rt.Fatal(err)
	}
	now := rapid.Bool().Draw(rt, "dueAtOnce")
	due := time.Now()
	if !now {
		due = due.Add(time.Duration(m.model.LeaseTTL) * time.Second) // the model delays a retry by a lease
	}
	if err := r.tp.Requeue(m.ctx, m.q, d, payload, due); err != nil {
		rt.Fatal(err)
	}
	r.forget(tok)
	m.model.Requeue(req.ID, tok, now)
}

// due lets a retry's delay run out: its due time in the delay set moved
// into the past by Redis' clock (the clock jump that matters to it).
func (m *ssMachine) due(rt *rapid.T) {
	var ids []string
	for id, due := range m.model.DelayedIDs() {
		if !due {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		rt.Skip("no retry waiting")
	}
	slices.Sort(ids)
	id := rapid.SampledFrom(ids).Draw(rt, "retry")
	entries, err := m.admin.ZRange(m.ctx, m.k.Delayed, 0, -1).Result()
	if err != nil {
		rt.Fatal(err)
	}
	for _, e := range entries {
		if delayedID(rt, e) == id {
			if err := m.admin.ZAddXX(m.ctx, m.k.Delayed, redis.Z{Score: 0, Member: e}).Err(); err != nil {
				rt.Fatal(err)
			}
			m.model.MakeDue(id)
			return
		}
	}
	rt.Fatalf("retry %s not in %s (%v)", id, m.k.Delayed, entries)
}

// delayedID is the request id of a delay-set entry, "<score>|<message>".
func delayedID(rt *rapid.T, e string) string {
	_, msg, ok := strings.Cut(e, "|")
	if !ok {
		rt.Fatalf("delay-set entry %q has no score", e)
	}
	return requestID(rt, []byte(msg))
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

// modelLeaseMS is the replicas' lease in the model tests.
const modelLeaseMS = 610000

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
	if err := m.rd.restart(); err != nil {
		rt.Fatal(err)
	}
}

// Clock jumps: the model's clock is in seconds, Redis' wall clock is
// stepped by the same amount (testenv.FakeClock), and the replicas' clocks
// do not move. Jumps are whole multiples of five minutes and the offset
// stays within [-10 min, +15 min] of the real clock, so a run (seconds
// long) never sits near a lease's or delay's edge, the leases (ten
// minutes) are the only thing a jump passes, and the cross-slot dedupe
// window (half an hour) is never passed.
const (
	jumpUnit     = 300 // s
	jumpForward  = 3 * jumpUnit
	jumpMaxAhead = 3 * jumpUnit
	jumpMaxBack  = 2 * jumpUnit
)

func (m *ssMachine) jump(rt *rapid.T, d int64) {
	if err := m.rd.clock.Set(time.Duration(m.model.Now()+d) * time.Second); err != nil {
		rt.Fatal(err)
	}
	m.model.Jump(d)
}

// clockForward steps Redis' clock forward by more than the lease: every
// lease not renewed since expires, the retries waiting a lease's length
// fall due.
func (m *ssMachine) clockForward(rt *rapid.T) {
	if m.model.Now()+jumpForward > jumpMaxAhead {
		rt.Skip("Redis' clock is ahead already")
	}
	m.jump(rt, jumpForward)
}

// clockBack steps Redis' clock back by five or ten minutes (drawn): the
// leases it passes are live again unless they were reclaimed, the retries
// due at once wait again.
func (m *ssMachine) clockBack(rt *rapid.T) {
	n := rapid.IntRange(1, 2).Draw(rt, "jumpBackUnits")
	if m.model.Now()-int64(n*jumpUnit) < -jumpMaxBack {
		rt.Skip("Redis' clock is behind enough")
	}
	m.jump(rt, -int64(n*jumpUnit))
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
	delayed, err := m.admin.ZRangeWithScores(ctx, m.k.Delayed, 0, -1).Result()
	if err != nil {
		rt.Fatal(err)
	}
	nowMS := float64(m.redisNow(rt).UnixMilli())
	gotDelayed := map[string]bool{}
	for _, z := range delayed {
		id := delayedID(rt, z.Member.(string))
		if _, dup := gotDelayed[id]; dup {
			rt.Fatalf("request %s is twice in the delay set", id)
		}
		gotDelayed[id] = z.Score <= nowMS
	}
	if want := m.model.DelayedIDs(); !maps.Equal(gotDelayed, want) {
		rt.Fatalf("delay set in Redis (id: due) %v, in the model %v", gotDelayed, want)
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
	settling, err := m.admin.HGetAll(ctx, m.k.Settling).Result()
	if err != nil {
		rt.Fatal(err)
	}
	gotSettling, wantSettling := map[string]string{}, map[string]string{}
	for ck, rec := range settling {
		tok, _, _ := strings.Cut(rec, "|")
		gotSettling[tok] = ck
	}
	for _, c := range want {
		if c.Settling {
			wantSettling[c.Token] = ""
		}
	}
	for tok, ck := range gotSettling {
		if _, ok := wantSettling[tok]; !ok || owners[ck] != tok {
			rt.Fatalf("settling record of %s on claim %q (owned by %q); the model's settles under way: %v", tok, ck, owners[ck], wantSettling)
		}
	}
	if len(gotSettling) != len(wantSettling) {
		rt.Fatalf("settling records in Redis (owner: claim) %v; the model's settles under way: %v", gotSettling, wantSettling)
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
	for _, r := range m.reps {
		if r != nil && r.paused != nil {
			m.resumeReplica(rt, r)
		}
	}
	if m.reps[0] == nil {
		m.reps[0] = m.start(rt)
	}
	r := m.reps[0]
	for round := 0; round < 20; round++ {
		entries, err := m.admin.ZRange(m.ctx, m.k.Delayed, 0, -1).Result()
		if err != nil {
			rt.Fatal(err)
		}
		for _, e := range entries {
			if err := m.admin.ZAddXX(m.ctx, m.k.Delayed, redis.Z{Score: 0, Member: e}).Err(); err != nil {
				rt.Fatal(err)
			}
		}
		for id := range m.model.DelayedIDs() {
			m.model.MakeDue(id)
		}
		for id, c := range m.model.Claims() {
			ck := m.claimOf(rt, c.Token)
			if err := m.admin.ZAddXX(m.ctx, m.k.ClaimsIdx, redis.Z{Score: 0, Member: ck}).Err(); err != nil {
				rt.Fatal(err)
			}
			m.model.ExpireForGood(id)
		}
		rss.Reclaim(r.tp, m.q.Name)
		m.model.Reclaim()
		m.check(rt)
		if len(m.model.Waiting()) == 0 && len(m.model.DelayedIDs()) == 0 {
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
		if r != nil && r.paused == nil {
			up++
		}
	}
	if up < 2 {
		rt.Skip("keep one up")
	}
}
