package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The tests below inject one loss, one duplicate, one request acked
// without a result and one wrong result code into each counting path the
// CHAOS lines come from — the sorted set's and the stream's result lists,
// the Pub/Sub recording proxy, the fuzz case's ledger and dead letters,
// and prometheus-gone's merged runs — through the production code (the
// brokers' readers, the proxy, the ledger, the accounting functions), with
// no server but in-process fakes, and check the exact figures and the
// reasons the verdict fails.

// result is a result message as sluice writes it.
func result(id, code string) []byte {
	m := map[string]any{"id": id, "payload": "{}"}
	if code == "ok" {
		m["status_code"] = 200
	} else {
		m["error_code"] = code
	}
	b, _ := json.Marshal(m)
	return b
}

// readAll runs b's result reader into l until it has read want results.
func readAll(t *testing.T, b broker, l *ledger, want int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.readResults(ctx, l) }()
	defer func() { cancel(); <-done }()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		n := l.total
		l.mu.Unlock()
		if n >= want {
			return
		}
	}
	t.Fatalf("the reader read fewer than %d results in 10 s", want)
}

// wantReasons checks that v failed for exactly the reasons given (each a
// prefix of one failure, in order).
func wantReasons(t *testing.T, v *verdict, reasons ...string) {
	t.Helper()
	if len(v.failures) != len(reasons) {
		t.Fatalf("failures = %q, want %d: %q", v.failures, len(reasons), reasons)
	}
	for i, r := range reasons {
		if !strings.HasPrefix(v.failures[i], r) {
			t.Errorf("failure %d = %q, want it to start with %q", i+1, v.failures[i], r)
		}
	}
	if !strings.HasSuffix(v.line(), " result=FAIL") {
		t.Errorf("line %q does not fail", v.line())
	}
}

// wantFigures checks the line's fixed figures and some extra ones.
func wantFigures(t *testing.T, v *verdict, fixed string, extra map[string]float64) {
	t.Helper()
	if line := v.line(); !strings.Contains(line, fixed) {
		t.Errorf("line %q does not contain %q", line, fixed)
	}
	for k, want := range extra {
		if got, ok := v.extra[k]; !ok || got != want {
			t.Errorf("%s = %v (set: %v), want %v", k, got, ok, want)
		}
	}
}

// TestCountingRedisLists: the sorted set's and the stream's result lists
// (readList, as their readers run it). A request acked without a result
// leaves no trace in the result list: the harness counts it as what it is
// to a user, one more unanswered id (lost=2 here: d never answered, e taken
// off the queue with no result).
func TestCountingRedisLists(t *testing.T) {
	for _, name := range []string{"redis-sortedset", "redis-stream"} {
		t.Run(name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			defer c.Close()
			ctx := context.Background()
			var b broker
			switch name {
			case "redis-sortedset":
				b = &sortedSet{queue: "q", results: "res", c: c}
			default:
				b = &stream{queue: "q", results: "res", c: c}
			}
			l := newLedger(true) // the faults on these transports answer 200
			l.callsUnseen = true // no gateway: the results are written here
			for _, id := range []string{"a", "b", "c", "d", "e"} {
				l.expect(id, time.Time{})
			}
			// As sluice would write them: a once, b twice (duplicate), c
			// with an error code (wrong code), d and e never (e acked
			// without a result), and one result for an id never sent.
			for _, r := range [][]byte{result("a", "ok"), result("b", "ok"), result("b", "ok"),
				result("c", "INFERENCE_ERROR"), result("zz", "ok")} {
				if err := c.LPush(ctx, "res", r).Err(); err != nil {
					t.Fatal(err)
				}
			}
			readAll(t, b, l, 5)
			v := &verdict{name: name, t: l.tally(), extra: figures{}}
			v.judge(0)
			wantFigures(t, v, "requests=5 answered=3 lost=2 duplicated=1", map[string]float64{"wrong_code": 1, "unknown": 1})
			if got := strings.Join(v.t.lostIDs, ","); got != "d,e" {
				t.Errorf("lost ids %s, want d,e", got)
			}
			wantReasons(t, v, "2 ids lost (first: d,e)", "1 ids duplicated, 0 allowed (first: b)", "1 results for ids never sent",
				"1 ids with a result code they do not allow (first: c=INFERENCE_ERROR)",
				"the history is not linearizable against the queue-with-results model: 2 ids (first: b,zz)")
		})
	}
}

// noSeek makes pstest's Seek a no-op: the fake's own redelivers acked
// messages without their data, which the emulator does not; the drain's
// pulls then find what a real seek would (what is not acked).
type noSeek struct{}

func (noSeek) React(any) (bool, any, error) { return true, &pubsubpb.SeekResponse{}, nil }

// TestCountingPubSubProxy: the kill -9 accounting on Pub/Sub, end to end
// through the recording proxy: a "replica" (a pubsub client reaching the
// fake server through the proxy, process 111) answers ok once, dup twice,
// wrong with an error code, acks awr without publishing anything, and holds
// held until the end; a result for an id never sent comes too. The
// accounting (pubSubAccounting: drain, history, accountPubSub, judge) must
// find exactly that: awr acked without a result, held still held by a
// running replica (found by the drain), both sluice's.
func TestCountingPubSubProxy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := pstest.NewServer(pstest.ServerReactorOption{FuncName: "Seek", Reactor: noSeek{}})
	defer srv.Close()
	dial := func(addr string) *pubsub.Client {
		c, err := pubsub.NewClient(ctx, pubSubProject, option.WithEndpoint(addr), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	hc := dial(srv.Addr)
	defer hc.Close()
	ps := &pubSub{r: &rig{name: "pubsub-test"}, emuAddr: srv.Addr, c: hc, seen: map[string]bool{}, prefix: "t"}
	if err := ps.createTopics(ctx); err != nil {
		t.Fatal(err)
	}
	proxy, err := startPubSubProxy(srv.Addr, func(int) int { return 111 })
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.close()
	ps.proxy = proxy

	gw, err := startGateway(gatewayFaults{})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.close()
	l := newLedger(true)
	l.callsUnseen = true // the results are published here, not by a gateway call
	v := &verdict{name: "kill9-gcp-pubsub", extra: figures{}}
	rctx, stopRd := context.WithCancel(ctx)
	s := &session{r: ps.r, b: ps, gw: gw, l: l, v: v, stopRd: stopRd, rdDone: make(chan struct{})}
	go func() { defer close(s.rdDone); ps.readResults(rctx, l) }()

	since := time.Now().Add(-time.Second)
	ids := []string{"ok", "dup", "wrong", "awr", "held"}
	var msgs []outMsg
	for _, id := range ids {
		l.expect(id, time.Time{})
		msgs = append(msgs, outMsg{id: id, body: flatRequest(id, time.Now().Add(time.Hour))})
	}
	if err := ps.send(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	// The replica.
	sc := dial(proxy.Addr)
	defer sc.Close()
	pub := sc.Publisher(ps.name("topics", "results"))
	defer pub.Stop()
	publish := func(ctx context.Context, b []byte) {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: b}).Get(ctx); err != nil {
			t.Error(err)
		}
	}
	sctx, stopReplica := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(len(ids))
	seen := map[string]bool{}
	var mu sync.Mutex
	recvDone := make(chan error, 1)
	rsub := sc.Subscriber(ps.name("subscriptions", "requests-sub"))
	// A short lease for held, so that the drain finds it soon once the
	// replica has stopped (the fake does not release a closed stream's
	// messages before their deadline).
	rsub.ReceiveSettings.MaxExtension = time.Second
	rsub.ReceiveSettings.MaxDurationPerAckExtension = 10 * time.Second
	go func() {
		recvDone <- rsub.Receive(sctx, func(ctx context.Context, m *pubsub.Message) {
			id := requestID(m.Data)
			mu.Lock()
			first := !seen[id]
			seen[id] = true
			mu.Unlock()
			if id == "held" {
				if first {
					wg.Done()
				}
				<-ctx.Done() // held until the replica stops
				m.Nack()
				return
			}
			if first {
				defer wg.Done()
			}
			switch id {
			case "ok":
				publish(ctx, result(id, "ok"))
				publish(ctx, result("zz", "ok")) // an id never sent
			case "dup":
				publish(ctx, result(id, "ok"))
				publish(ctx, result(id, "ok"))
			case "wrong":
				publish(ctx, result(id, "INFERENCE_ERROR"))
			case "awr":
				// acked, nothing published
			}
			m.Ack()
		})
	}()
	wg.Wait()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		l.mu.Lock()
		n := l.total
		l.mu.Unlock()
		h := proxy.history()
		if n >= 5 && len(h.acks["awr"]) > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("after 10 s: %d results read, awr acks %v", n, h.acks["awr"])
		}
	}
	until := time.Now()
	stopReplica()
	if err := <-recvDone; err != nil {
		t.Fatal(err)
	}

	pubSubAccounting(ctx, s, ps, v, since, until, map[int]bool{}, 0)
	wantFigures(t, v, "requests=5 answered=3 lost=2 duplicated=1", map[string]float64{
		"wrong_code": 1, "unknown": 1, "acked_without_result": 1, "sluice_lost": 2, "vanished": 0,
		"broker_held": 0, "result_dropped_by_broker": 0, "drained_requests": 1, "unmapped_acks": 0})
	wantReasons(t, v, "1 ids acked by a subscriber before any accepted publish of their result (first: awr)",
		"2 ids lost (first: awr,held)", "1 ids duplicated, 0 allowed (first: dup)", "1 results for ids never sent",
		"1 ids with a result code they do not allow (first: wrong=INFERENCE_ERROR)",
		"the history is not linearizable against the queue-with-results model: 2 ids (first: dup,zz)")

	// The same history with process 111 killed by the harness: held is
	// then the broker's (never acked, found by the drain), awr still not.
	h := proxy.history()
	a := accountPubSub(v.t, l.ids(), h, map[int]bool{111: true}, map[string]bool{"held": true}, until,
		map[string]bool{ps.name("topics", "results"): true}, ps.name("topics", "results"))
	if got := fmt.Sprint(a.ackedWithoutResult, a.sluiceLost, a.brokerHeld, a.vanished); got != "[awr] [awr] [held] []" {
		t.Errorf("killed replica: acked without result, sluice lost, broker held, vanished = %s, want [awr] [awr] [held] []", got)
	}
	// And without the drain finding it: held vanished, sluice's.
	a = accountPubSub(v.t, l.ids(), h, map[int]bool{111: true}, map[string]bool{}, until,
		map[string]bool{ps.name("topics", "results"): true}, ps.name("topics", "results"))
	if got := fmt.Sprint(a.sluiceLost, a.brokerHeld, a.vanished); got != "[awr held] [] [held]" {
		t.Errorf("not drained: sluice lost, broker held, vanished = %s, want [awr held] [] [held]", got)
	}
}

// TestCountingFuzz: the fuzz case's accounting (makeFuzz, expectFuzz, the
// sorted set's reader and dead-letter list, accountFuzz) with two messages
// of each kind. Injected: an oversized message never answered (lost), a
// wrong-type-payload one answered twice (duplicate), a past-deadline one
// answered ok instead of DEADLINE_EXCEEDED (wrong code), a garbage one
// taken and neither answered nor dead-lettered (the fuzz case's acked
// without a result), and an invalid-utf8 one dead-lettered instead of
// answered (one more lost id and a dead letter that is no unreadable
// message).
func TestCountingFuzz(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	ctx := context.Background()
	ss := &sortedSet{queue: "q", results: "res", c: c}
	fz, err := makeFuzz(rand.New(rand.NewPCG(1, 2)), 2*len(fuzzKinds), time.Now().Add(time.Hour).Unix())
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(true)
	l.callsUnseen = true         // no gateway: the results are written here
	l.expect("g-1", time.Time{}) // a good request among them
	expectFuzz(l, fz)
	first := map[string]bool{}
	results := 1
	if err := c.LPush(ctx, "res", result("g-1", "ok")).Err(); err != nil {
		t.Fatal(err)
	}
	for _, m := range fz {
		k := m.kind.name
		once := !first[k]
		first[k] = true
		var writes [][]byte
		dead := false
		switch {
		case once && k == "oversized":
		case once && k == "garbage":
		case once && k == "invalid-utf8":
			dead = true
		case once && k == "wrong-type-payload":
			writes = [][]byte{result(m.id, m.kind.code), result(m.id, m.kind.code)}
		case once && k == "past-deadline":
			writes = [][]byte{result(m.id, "ok")}
		case m.kind.dead:
			dead = true
		default:
			writes = [][]byte{result(m.id, m.kind.code)}
		}
		if dead {
			if err := c.LPush(ctx, "q:dead", m.body).Err(); err != nil {
				t.Fatal(err)
			}
		}
		for _, w := range writes {
			if err := c.LPush(ctx, "res", w).Err(); err != nil {
				t.Fatal(err)
			}
			results++
		}
	}
	readAll(t, ss, l, results)
	dead, err := ss.deadLetterBodies(ctx)
	if err != nil {
		t.Fatal(err)
	}
	v := &verdict{name: "fuzz-redis-sortedset", t: l.tally(), extra: figures{}}
	v.judge(0)
	accountFuzz(fz, l, v.t, dead).apply(v)
	readable := 0
	for _, k := range fuzzKinds {
		if !k.dead {
			readable += 2
		}
	}
	deadKinds := 2*len(fuzzKinds) - readable
	// duplicate-id's two messages share one id: one id fewer than readable messages.
	wantFigures(t, v, fmt.Sprintf("requests=%d answered=%d lost=2 duplicated=1", readable, readable-2), map[string]float64{
		"wrong_code": 1, "unknown": 0, "fuzz_readable": float64(readable), "fuzz_dead_expected": float64(deadKinds),
		"dead_lettered": float64(deadKinds), "dead_missing": 1, "dead_unexpected": 1})
	wantReasons(t, v, "2 ids lost", "1 ids duplicated, 0 allowed", "1 ids with a result code they do not allow",
		"the history is not linearizable against the queue-with-results model: 1 ids",
		"fuzz kind garbage: 2 sent, 0 lost, 0 duplicated, 0 with a wrong code, 1 not dead-lettered",
		"fuzz kind invalid-utf8: 2 sent, 1 lost,", "fuzz kind oversized: 2 sent, 1 lost,",
		"fuzz kind past-deadline: 2 sent, 0 lost, 0 duplicated, 1 with a wrong code",
		"fuzz kind wrong-type-payload: 2 sent, 0 lost, 1 duplicated",
		"1 dead letters are no fuzzed message meant for them")
}

// TestCountingMergedRuns: prometheus-gone's two runs merged into one
// ledger (ledger.merge). Injected in the first run a duplicate and a loss,
// in the second a wrong code, a result for an id never sent and a request
// acked without a result (on the sorted set: one more unanswered id).
func TestCountingMergedRuns(t *testing.T) {
	closed, open := newLedger(true), newLedger(true)
	closed.callsUnseen, open.callsUnseen = true, true // no gateway: the results are recorded here
	for i := range 3 {
		closed.expect(fmt.Sprintf("m-closed-%d", i), time.Time{})
		open.expect(fmt.Sprintf("m-open-%d", i), time.Time{})
	}
	now := time.Now() // the results are read after the requests were sent
	closed.record("m-closed-0", "ok", now)
	closed.record("m-closed-1", "ok", now)
	closed.record("m-closed-1", "ok", now) // duplicate; m-closed-2 lost
	open.record("m-open-0", "INFERENCE_ERROR", now)
	open.record("m-open-1", "ok", now) // m-open-2 acked without a result
	open.record("zz", "ok", now)
	all := newLedger(true)
	all.merge(closed)
	all.merge(open)
	v := &verdict{name: "prometheus-gone", t: all.tally(), extra: figures{}}
	v.judge(0)
	wantFigures(t, v, "requests=6 answered=4 lost=2 duplicated=1", map[string]float64{"wrong_code": 1, "unknown": 1})
	wantReasons(t, v, "2 ids lost (first: m-closed-2,m-open-2)", "1 ids duplicated, 0 allowed (first: m-closed-1)",
		"1 results for ids never sent", "1 ids with a result code they do not allow (first: m-open-0=INFERENCE_ERROR)",
		"the history is not linearizable against the queue-with-results model: 2 ids (first: m-closed-1,zz)")
	if all.codes["INFERENCE_ERROR"] != 1 || all.total != 6 {
		t.Errorf("merged codes %v, total %d; want INFERENCE_ERROR once, 6 results", all.codes, all.total)
	}
}

// TestSelfcheckVerdict: the self-check passes on exactly the planted
// figures, reasons and history, and fails when the counting or the
// history check misses any of them.
func TestSelfcheckVerdict(t *testing.T) {
	const wrong, forged = "s-00198", "s-00197" // s-00199 is lost
	planted := func() *verdict {
		l := newLedger(true)
		for i := range selfcheckRequests {
			l.expect(fmt.Sprintf("s-%05d", i), time.Time{})
		}
		sent := time.Now()
		l.sentDone(l.ids(), sent)
		// The harness's own results, read before sluice calls anything.
		l.record(wrong, "INFERENCE_ERROR", sent.Add(time.Millisecond))
		l.record(forged, "ok", sent.Add(time.Millisecond))
		l.record("s-00000", "ok", sent.Add(time.Millisecond))
		l.record("never-sent", "ok", sent.Add(time.Millisecond))
		// sluice's: a call, then the result, for every id still queued.
		at := sent.Add(10 * time.Millisecond)
		for i := range selfcheckRequests - 3 {
			id := fmt.Sprintf("s-%05d", i)
			l.dispatched(id, at, at.Add(time.Millisecond))
			l.record(id, "ok", at.Add(2*time.Millisecond))
		}
		v := &verdict{t: l.tally(), extra: figures{}}
		v.judge(0)
		return v
	}
	if v := checkPlanted(planted(), forged); len(v.failures) != 0 || v.extra["detected"] != 1 {
		t.Errorf("exact planted figures: failures %q, detected %v; want none, 1", v.failures, v.extra["detected"])
	} else if v.linear == nil || v.linear.ok || !strings.Contains(v.line(), " linearizable=false ") {
		t.Errorf("self-check line %q: want linearizable=false shown", v.line())
	}
	for name, breakIt := range map[string]func(*verdict){
		"loss not seen":       func(v *verdict) { v.t.lost = 0; v.failures = v.failures[1:] },
		"unknown not counted": func(v *verdict) { v.t.unknown = 0 },
		"wrong code missed":   func(v *verdict) { v.t.wrongCode = 0 },
		"no failure":          func(v *verdict) { v.failures = nil },
		"history unchecked":   func(v *verdict) { v.linear = nil; v.failures = v.failures[:len(v.failures)-1] },
		"forged id missed": func(v *verdict) {
			lin := *v.linear
			lin.badIDs = slices.DeleteFunc(slices.Clone(lin.badIDs), func(id string) bool { return id == forged })
			v.linear = &lin
		},
		"history said linearizable": func(v *verdict) {
			v.linear = &linearity{ok: true}
			v.failures = v.failures[:len(v.failures)-1]
		},
	} {
		pv := planted()
		breakIt(pv)
		if v := checkPlanted(pv, forged); len(v.failures) == 0 || v.extra["detected"] != 0 {
			t.Errorf("%s: the self-check passed", name)
		}
	}
}
