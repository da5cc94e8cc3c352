package redisstream_test

import (
	"context"
	"encoding/json"
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
	"github.com/sluice-io/sluice/transports/redisstream"
)

// The state-machine test of pending-entry ownership (docs/verification.md):
// rapid draws interleavings of three consumers' steps on one stream of a real
// redis-server — read/take over (XREADGROUP, XAUTOCLAIM), heartbeat, settle
// (the fenced result script), hand-back, an entry going idle, a crash (a
// consumer's state dropped, nothing handed back), a graceful close, a
// restart (a new consumer), a restart of Redis (kill -9, append-only file
// fsynced on every write), a jump of Redis' wall clock forward past
// claim_idle_ms or back — and checks every move against internal/model's
// PendingEntries and compares Redis with it after every step. At the end
// every request must have exactly one result.
//
// Heartbeats and takeovers run as steps: claim_idle_ms is ten minutes, and an
// entry goes idle by XCLAIM to its own consumer with IDLE of an hour, what a
// consumer that misses its heartbeats for claim_idle_ms leads to.

const (
	streamIdleMS = 600000
	idleHour     = time.Hour
)

// modelChecks bounds the number of rapid checks in `make test` unless
// -rapid.checks was given (make verify runs thousands).
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

func TestModelStream(t *testing.T) {
	modelChecks(t, 12)
	port := testenv.FreePort(t)
	dir := t.TempDir()
	clk := testenv.NewFakeClock(t) // Redis' wall clock, stepped by the clock-jump steps
	// No automatic rewrite of the append-only file: a rewrite writes the
	// delivery times as they are in memory, which changes what a later
	// restart gives back after a backward jump (PendingEntries.Restart).
	ro := testenv.RedisOptions{Persist: true, Dir: dir, Port: port, Env: clk.Env(), Args: []string{"--auto-aof-rewrite-percentage", "0"}}
	rd := testenv.StartRedis(t, ro)
	restart := func() {
		rd.Stop()
		rd = testenv.StartRedis(t, ro)
	}
	var run atomic.Int64
	rapid.Check(t, func(rt *rapid.T) {
		if err := clk.Set(0); err != nil { // the model's clock starts at 0
			rt.Fatal(err)
		}
		m := &stMachine{ctx: context.Background(), url: rd.URL, restartRedis: restart, model: model.NewPendingEntries(), clock: clk}
		m.q = transport.Queue{Name: fmt.Sprintf("ms%d", run.Add(1))}
		m.results = m.q.Name + ":results"
		m.admin = redis.NewClient(&redis.Options{Addr: rd.Addr})
		defer m.close()
		for i := range m.cons {
			m.cons[i] = m.start(rt, i)
		}
		rt.Repeat(map[string]func(*rapid.T){
			"add":          m.add,
			"claim":        m.claim,
			"heartbeat":    m.heartbeat,
			"settle":       m.settle,
			"handBack":     m.handBack,
			"expire":       m.expire,
			"takeover":     m.takeover,
			"crash":        m.crash,
			"close":        m.closeConsumer,
			"restart":      m.restart,
			"redisRestart": m.redisRestart,
			"clockForward": m.clockForward,
			"clockBack":    m.clockBack,
			"":             m.check,
		})
		m.drain(rt)
	})
}

type stMachine struct {
	clock        *testenv.FakeClock
	ctx          context.Context
	url          string
	restartRedis func()
	q            transport.Queue
	results      string
	admin        *redis.Client
	model        *model.PendingEntries
	cons         [3]*stConsumer
	gen, ids     int
}

type stConsumer struct {
	name  string
	tp    *redisstream.Transport
	src   transport.Source
	pub   message.Publisher
	held  map[string]*message.Message // by entry id
	order []string
}

func (m *stMachine) start(rt *rapid.T, slot int) *stConsumer {
	m.gen++
	name := fmt.Sprintf("c%d-%d", slot, m.gen)
	tp, err := redisstream.New(redisstream.Options{Server: redisstream.Server{URL: m.url}, Consumer: name, ClaimIdleMS: streamIdleMS, HeartbeatMS: streamIdleMS / 2}, transport.Env{})
	if err != nil {
		rt.Fatal(err)
	}
	src, err := tp.Source(m.q)
	if err != nil {
		rt.Fatal(err)
	}
	if err := src.Open(m.ctx); err != nil {
		rt.Fatal(err)
	}
	pub, err := tp.Publisher(m.q)
	if err != nil {
		rt.Fatal(err)
	}
	return &stConsumer{name: name, tp: tp, src: src, pub: pub, held: map[string]*message.Message{}}
}

func (m *stMachine) close() {
	for i, c := range m.cons {
		if c != nil {
			redisstream.Crash(c.tp)
			m.cons[i] = nil
		}
	}
	_ = m.admin.Close()
}

func (m *stMachine) consumer(rt *rapid.T) (int, *stConsumer) {
	var live []int
	for i, c := range m.cons {
		if c != nil {
			live = append(live, i)
		}
	}
	if len(live) == 0 {
		rt.Skip("no consumer up")
	}
	i := rapid.SampledFrom(live).Draw(rt, "consumer")
	return i, m.cons[i]
}

func (m *stMachine) delivery(rt *rapid.T) (*stConsumer, string, *message.Message) {
	var cands [][2]int
	for i, c := range m.cons {
		if c != nil {
			for j := range c.order {
				cands = append(cands, [2]int{i, j})
			}
		}
	}
	if len(cands) == 0 {
		rt.Skip("no delivery held")
	}
	p := rapid.SampledFrom(cands).Draw(rt, "delivery")
	c := m.cons[p[0]]
	e := c.order[p[1]]
	return c, e, c.held[e]
}

func (c *stConsumer) forget(entry string) {
	delete(c.held, entry)
	c.order = slices.DeleteFunc(c.order, func(s string) bool { return s == entry })
}

func reqID(rt *rapid.T, b []byte) string {
	var r struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.ID == "" {
		rt.Fatalf("payload %q has no id: %v", b, err)
	}
	return r.ID
}

func (m *stMachine) add(rt *rapid.T) {
	_, c := m.consumer(rt)
	m.ids++
	id := "r" + strconv.Itoa(m.ids)
	req := &wire.Request{ID: id, Deadline: time.Now().Add(time.Hour), Created: time.Now(), Payload: json.RawMessage(`{"prompt":"hi"}`)}
	b, err := json.Marshal(req)
	if err != nil {
		rt.Fatal(err)
	}
	if err := c.tp.PublishRequest(m.ctx, m.q, b); err != nil {
		rt.Fatal(err)
	}
	m.model.Add(id)
}

func (m *stMachine) claim(rt *rapid.T) {
	_, c := m.consumer(rt)
	m.claimN(rt, c, rapid.IntRange(1, 3).Draw(rt, "n"))
}

func (m *stMachine) claimN(rt *rapid.T, c *stConsumer, n int) {
	redisstream.AllowTakeover(c.src)
	msgs, err := c.src.Claim(m.ctx, n)
	if err != nil {
		rt.Fatal(err)
	}
	if len(msgs) > n {
		rt.Fatalf("claim of %d delivered %d", n, len(msgs))
	}
	for _, msg := range msgs {
		e := msg.Metadata.Get(redisstream.MetaEntry)
		if err := m.model.Deliver(c.name, reqID(rt, msg.Payload), e); err != nil {
			rt.Fatal(err)
		}
		c.held[e] = msg
		c.order = append(c.order, e)
	}
	// XAUTOCLAIM may have returned entries this consumer runs already (its
	// own that went idle, or ones taken from it that went idle at their new
	// consumer): dropped, not delivered twice, but this consumer owns them
	// again, so its delivery is the live one. A take-over, which must have
	// been of an idle entry; of its own, a heartbeat.
	pend := m.pendingNow(rt)
	model := m.model.PendingOf()
	own := map[string]string{}
	for _, e := range c.order[len(c.order)-len(msgs):] {
		own[e] = "new"
	}
	for _, e := range c.order {
		p, ok := pend[e]
		if _, fresh := own[e]; fresh || !ok || p.Consumer != c.name || p.Idle {
			continue
		}
		id := reqID(rt, c.held[e].Payload)
		if w := model[id]; w.Consumer != c.name {
			if err := m.model.Deliver(c.name, id, e); err != nil {
				rt.Fatalf("taken back by XAUTOCLAIM: %v", err)
			}
			continue
		}
		if model[id].Idle {
			// Idle in the model, live in Redis: XAUTOCLAIM reset its
			// delivery time. (One live in both was not touched: its
			// delivery time stays, which a later clock jump shows.)
			m.model.Heartbeat(c.name, map[string]string{e: id})
		}
	}
}

func (m *stMachine) heartbeat(rt *rapid.T) {
	_, c := m.consumer(rt)
	if err := redisstream.Touch(c.src); err != nil {
		rt.Fatal(err)
	}
	held := map[string]string{}
	for e, msg := range c.held {
		held[e] = reqID(rt, msg.Payload)
	}
	m.model.Heartbeat(c.name, held)
}

func (m *stMachine) settle(rt *rapid.T) {
	c, e, d := m.delivery(rt)
	id := reqID(rt, d.Payload)
	res := message.NewMessage("res-"+e, (&wire.Result{ID: id, StatusCode: 200, Payload: `{}`}).Marshal())
	for k, v := range d.Metadata {
		res.Metadata.Set(k, v)
	}
	if err := c.pub.Publish(m.results, res); err != nil {
		rt.Fatal(err)
	}
	c.src.Settle(d, true)
	c.forget(e)
	m.model.Settle(c.name, id, e)
}

func (m *stMachine) handBack(rt *rapid.T) {
	c, e, d := m.delivery(rt)
	c.src.Settle(d, false)
	c.forget(e)
	m.model.HandBack(c.name, reqID(rt, d.Payload), e)
}

func (m *stMachine) expire(rt *rapid.T) {
	pend := m.model.PendingOf()
	var ids []string
	for id := range pend {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		rt.Skip("nothing pending")
	}
	slices.Sort(ids)
	id := rapid.SampledFrom(ids).Draw(rt, "request")
	m.idle(rt, pend[id])
	m.model.Expire(id)
}

// takeover is a consumer pausing past claim_idle_ms and another taking its
// entry over: one entry goes idle and another consumer claims.
func (m *stMachine) takeover(rt *rapid.T) {
	pend := m.model.PendingOf()
	var ids []string
	for id := range pend {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		rt.Skip("nothing pending")
	}
	slices.Sort(ids)
	id := rapid.SampledFrom(ids).Draw(rt, "request")
	m.idle(rt, pend[id])
	m.model.Expire(id)
	var others []int
	for i, c := range m.cons {
		if c != nil && c.name != pend[id].Consumer {
			others = append(others, i)
		}
	}
	if len(others) == 0 {
		return
	}
	c := m.cons[rapid.SampledFrom(others).Draw(rt, "taker")]
	m.claimN(rt, c, rapid.IntRange(1, 3).Draw(rt, "n"))
}

// idle makes entry p idle for an hour, its consumer unchanged.
func (m *stMachine) idle(rt *rapid.T, p model.Pending) {
	err := m.admin.Do(m.ctx, "XCLAIM", m.q.Name, "sluice", p.Consumer, 0, p.Entry, "IDLE", idleHour.Milliseconds(), "JUSTID").Err()
	if err != nil {
		rt.Fatal(err)
	}
}

func (m *stMachine) crash(rt *rapid.T) {
	m.keepOneUp(rt)
	i, c := m.consumer(rt)
	redisstream.Crash(c.tp)
	m.cons[i] = nil
}

func (m *stMachine) closeConsumer(rt *rapid.T) {
	m.keepOneUp(rt)
	i, c := m.consumer(rt)
	tail := "0-0"
	if es, err := m.admin.XRevRangeN(m.ctx, m.q.Name, "+", "-", 1).Result(); err != nil {
		rt.Fatal(err)
	} else if len(es) == 1 {
		tail = es[0].ID
	}
	if err := c.tp.Close(); err != nil {
		rt.Fatal(err)
	}
	// Close hands back in no particular order: follow the order it appended
	// in. Of two deliveries of one request (a stale one and a later read)
	// only the one the model says is current can have been handed back.
	byReq := map[string]string{}
	pend := m.model.PendingOf()
	for _, e := range c.order {
		if id := reqID(rt, c.held[e].Payload); pend[id].Entry == e {
			byReq[id] = e
		}
	}
	es, err := m.admin.XRange(m.ctx, m.q.Name, "("+tail, "+").Result()
	if err != nil {
		rt.Fatal(err)
	}
	for _, x := range es {
		p, _ := x.Values["payload"].(string)
		id := reqID(rt, []byte(p))
		e, ok := byReq[id]
		if !ok || !m.model.HandBack(c.name, id, e) {
			rt.Fatalf("closing %s appended %s, which it did not own", c.name, id)
		}
	}
	m.cons[i] = nil
}

func (m *stMachine) restart(rt *rapid.T) {
	var down []int
	for i, c := range m.cons {
		if c == nil {
			down = append(down, i)
		}
	}
	if len(down) == 0 {
		rt.Skip("every consumer is up")
	}
	i := rapid.SampledFrom(down).Draw(rt, "slot")
	m.cons[i] = m.start(rt, i)
}

func (m *stMachine) redisRestart(rt *rapid.T) {
	if rapid.IntRange(0, 7).Draw(rt, "rarely") != 0 {
		rt.Skip("Redis restarts are slow: one draw in eight")
	}
	m.restartRedis()
	m.model.Restart()
}

// Clock jumps of Redis' wall clock, as in the sorted-set test: whole
// multiples of five minutes, the offset within [-10 min, +15 min]. A
// pending entry's idle time is Redis' clock minus its delivery time, so a
// forward jump past claim_idle_ms makes every entry idle (another consumer
// may take it over) and a backward one makes those it passes live again.
const (
	jumpUnit     = 300 // s
	jumpForward  = 3 * jumpUnit
	jumpMaxAhead = 3 * jumpUnit
	jumpMaxBack  = 2 * jumpUnit
)

func (m *stMachine) jump(rt *rapid.T, d int64) {
	if err := m.clock.Set(time.Duration(m.model.Now()+d) * time.Second); err != nil {
		rt.Fatal(err)
	}
	m.model.Jump(d)
}

func (m *stMachine) clockForward(rt *rapid.T) {
	if m.model.Now()+jumpForward > jumpMaxAhead {
		rt.Skip("Redis' clock is ahead already")
	}
	m.jump(rt, jumpForward)
}

func (m *stMachine) clockBack(rt *rapid.T) {
	n := rapid.IntRange(1, 2).Draw(rt, "jumpBackUnits")
	if m.model.Now()-int64(n*jumpUnit) < -jumpMaxBack {
		rt.Skip("Redis' clock is behind enough")
	}
	m.jump(rt, -int64(n*jumpUnit))
}

// pendingNow reads the group's pending entries: entry id -> consumer and idleness.
func (m *stMachine) pendingNow(rt *rapid.T) map[string]model.Pending {
	ps, err := m.admin.XPendingExt(m.ctx, &redis.XPendingExtArgs{Stream: m.q.Name, Group: "sluice", Start: "-", End: "+", Count: 10000}).Result()
	if err != nil {
		rt.Fatal(err)
	}
	out := map[string]model.Pending{}
	for _, p := range ps {
		out[p.ID] = model.Pending{Entry: p.ID, Consumer: p.Consumer, Idle: p.Idle >= streamIdleMS*time.Millisecond}
	}
	return out
}

func (m *stMachine) entryRequest(rt *rapid.T, id string) string {
	es, err := m.admin.XRange(m.ctx, m.q.Name, id, id).Result()
	if err != nil || len(es) != 1 {
		rt.Fatalf("pending entry %s not in the stream: %v %v", id, es, err)
	}
	p, _ := es[0].Values["payload"].(string)
	return reqID(rt, []byte(p))
}

func (m *stMachine) check(rt *rapid.T) {
	if err := m.model.Check(); err != nil {
		rt.Fatal(err)
	}
	groups, err := m.admin.XInfoGroups(m.ctx, m.q.Name).Result()
	if err != nil {
		rt.Fatal(err)
	}
	last := "0-0"
	for _, g := range groups {
		if g.Name == "sluice" {
			last = g.LastDeliveredID
		}
	}
	es, err := m.admin.XRange(m.ctx, m.q.Name, "("+last, "+").Result()
	if err != nil {
		rt.Fatal(err)
	}
	var unread []string
	for _, e := range es {
		p, _ := e.Values["payload"].(string)
		unread = append(unread, reqID(rt, []byte(p)))
	}
	if want := m.model.Unread(); !slices.Equal(unread, want) {
		rt.Fatalf("unread entries in Redis %v, in the model %v", unread, want)
	}
	pend := m.pendingNow(rt)
	want := m.model.PendingOf()
	if len(pend) != len(want) {
		rt.Fatalf("pending in Redis %v, in the model %v", pend, want)
	}
	for e, p := range pend {
		id := m.entryRequest(rt, e)
		if w, ok := want[id]; !ok || w.Entry != p.Entry || w.Consumer != p.Consumer || w.Idle != p.Idle {
			rt.Fatalf("request %s pending in Redis as %+v, in the model %+v", id, p, w)
		}
	}
	res, err := m.admin.LRange(m.ctx, m.results, 0, -1).Result()
	if err != nil {
		rt.Fatal(err)
	}
	got := map[string]int{}
	for _, s := range res {
		got[reqID(rt, []byte(s))]++
	}
	wantR := m.model.Results()
	if len(got) != len(wantR) {
		rt.Fatalf("results in Redis %v, in the model %v", got, wantR)
	}
	for id, n := range got {
		if wantR[id] != n {
			rt.Fatalf("results in Redis %v, in the model %v", got, wantR)
		}
	}
}

// drain ends a run: every pending entry goes idle, and one consumer takes
// over, reads and settles until nothing is left; then every request must
// have exactly one result.
func (m *stMachine) drain(rt *rapid.T) {
	if m.cons[0] == nil {
		m.cons[0] = m.start(rt, 0)
	}
	c := m.cons[0]
	for round := 0; round < 30 && len(m.model.Unanswered()) > 0; round++ {
		for id, p := range m.model.PendingOf() {
			if p.Consumer != c.name {
				m.idle(rt, p)
				m.model.Expire(id)
			}
		}
		before := len(c.order)
		m.claimN(rt, c, 100)
		for _, e := range slices.Clone(c.order[before:]) {
			d := c.held[e]
			id := reqID(rt, d.Payload)
			res := message.NewMessage("res-"+e, (&wire.Result{ID: id, StatusCode: 200, Payload: `{}`}).Marshal())
			for k, v := range d.Metadata {
				res.Metadata.Set(k, v)
			}
			if err := c.pub.Publish(m.results, res); err != nil {
				rt.Fatal(err)
			}
			c.src.Settle(d, true)
			c.forget(e)
			m.model.Settle(c.name, id, e)
		}
		m.check(rt)
	}
	// Deliveries this consumer held from before the drain.
	for _, e := range slices.Clone(c.order) {
		d := c.held[e]
		id := reqID(rt, d.Payload)
		res := message.NewMessage("res-"+e, (&wire.Result{ID: id, StatusCode: 200, Payload: `{}`}).Marshal())
		for k, v := range d.Metadata {
			res.Metadata.Set(k, v)
		}
		if err := c.pub.Publish(m.results, res); err != nil {
			rt.Fatal(err)
		}
		c.forget(e)
		m.model.Settle(c.name, id, e)
	}
	m.check(rt)
	if left := m.model.Unanswered(); len(left) > 0 {
		rt.Fatalf("requests without a result after the drain: %v", left)
	}
}

// keepOneUp skips a step that would take down the last replica up: the
// interesting interleavings need a live one.
func (m *stMachine) keepOneUp(rt *rapid.T) {
	up := 0
	for _, r := range m.cons {
		if r != nil {
			up++
		}
	}
	if up < 2 {
		rt.Skip("keep one up")
	}
}
