package redissortedset_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The cross-slot settle on a Redis Cluster (see xslot.go): upstream's own
// names, whose result list is in another hash slot than the queue's claim
// keys. These run inside TestCluster, on its cluster.

// upstreamPair is upstream's queue and result list of pool: no hash tag, so
// (for the pools used here) in different slots.
func upstreamPair(t *testing.T, pool string) (queue, results string) {
	t.Helper()
	queue, results = "llm-d-async:requests:"+pool, "llm-d-async:results:"+pool+":$batch"
	if redisclient.Slot(queue) == redisclient.Slot(results) {
		t.Fatalf("%s and %s share a slot: pick another pool name", queue, results)
	}
	return queue, results
}

// crossSlotDrain: upstream's names are accepted (with a warning) and a mix
// of flat requests and upstream envelopes is drained exactly once, the
// envelopes' results carrying their request_token; nothing is left claimed
// or settling.
func crossSlotDrain(t *testing.T, f *fixture, c *testenv.RedisCluster) {
	ctx := context.Background()
	q, res := upstreamPair(t, "xs-drain")
	cl := f.prod.Client()
	const flat, env = 300, 30
	for i := range flat {
		if err := f.prod.Enqueue(ctx, q, request(fmt.Sprintf("f-%04d", i), "", 3*time.Minute, nil)); err != nil {
			t.Fatal(err)
		}
	}
	tokens := map[string]string{}
	for i := range env {
		r := upstreamReq{id: fmt.Sprintf("e-%04d", i), queueID: q, queue: q, results: res, token: newToken(t), deadline: time.Now().Add(3 * time.Minute)}
		tokens[r.id] = r.token
		enqueueUpstream(t, cl, r)
	}
	tp := f.transport(rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, PollIntervalMS: 50})
	if err := tp.CheckQueue(transport.Queue{Name: q, ResultName: res}); err != nil {
		t.Fatalf("upstream's names refused: %v", err)
	}
	if w := tp.QueueWarnings(transport.Queue{Name: q, ResultName: res}); len(w) != 1 || !strings.Contains(w[0], "cross-slot") {
		t.Fatalf("warnings %q, want one naming the cross-slot settle", w)
	}
	stop := f.runAppQueues(tp, []string{q}, func(string) string { return res }, 16)
	got := collectRaw(t, f, res, flat+env, 30*time.Second)
	stop()
	f.expectNoMore(res, 200*time.Millisecond)
	for id, raw := range got {
		r, err := wire.DecodeResult([]byte(raw))
		if err != nil || r.ErrorCode != wire.CodeNone {
			t.Errorf("%s: %s (%v)", id, raw, err)
		}
		if tok, ok := tokens[id]; ok && !strings.Contains(raw, `"request_token":"`+tok+`"`) {
			t.Errorf("%s: result %s lacks its request_token %s", id, raw, tok)
		}
	}
	k := f.prod.Names().Queue(q)
	for _, key := range []string{k.Settling, k.Claimed, k.ClaimsIdx, q} {
		if n := keyLen(t, cl, key); n != 0 {
			t.Errorf("%s holds %d entries after the drain", key, n)
		}
	}
}

// collectRaw reads n results from list (acking them) within d, by id, as
// written; a second result for an id fails the test.
func collectRaw(t *testing.T, f *fixture, list string, n int, d time.Duration) map[string]string {
	t.Helper()
	r := f.prod.Results(list, producer.ReaderOptions{Batch: 500, PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	out := map[string]string{}
	for len(out) < n {
		ls, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("collected %d of %d results: %v", len(out), n, err)
		}
		for _, l := range ls {
			if l.Err != nil {
				t.Fatalf("bad result %q: %v", l.Raw, l.Err)
			}
			if _, dup := out[l.Result.ID]; dup {
				t.Errorf("second result for %s", l.Result.ID)
			}
			out[l.Result.ID] = l.Raw
		}
		if err := r.Ack(ctx, ls...); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// keyLen is the number of entries of a hash, sorted set or list (0 when
// the key is missing).
func keyLen(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	ctx := context.Background()
	switch typ := c.Type(ctx, key).Val(); typ {
	case "none":
		return 0
	case "hash":
		return c.HLen(ctx, key).Val()
	case "zset":
		return c.ZCard(ctx, key).Val()
	case "list":
		return c.LLen(ctx, key).Val()
	default:
		t.Fatalf("%s is a %s", key, typ)
		return 0
	}
}

var errCrashed = errors.New("crashed (test)")

// crashAt is a fault hook that, the first time point is reached, reports it
// on hit, waits for release and fails; every later step fails too, as in a
// process that died there.
type crashAt struct {
	point   int
	hit     chan struct{}
	release chan struct{}
	mu      sync.Mutex
	crashed bool
}

func newCrashAt(point int) *crashAt {
	return &crashAt{point: point, hit: make(chan struct{}), release: make(chan struct{})}
}

func (c *crashAt) hook(p int) error {
	c.mu.Lock()
	if c.crashed {
		c.mu.Unlock()
		return errCrashed
	}
	if p != c.point {
		c.mu.Unlock()
		return nil
	}
	c.crashed = true
	c.mu.Unlock()
	close(c.hit)
	<-c.release
	return errCrashed
}

// crossSlotCrash: replica A claims envelopes of upstream's names and dies
// at one point of the cross-slot settle (before each of its steps, and
// after the last); replica B then serves the queue. Every request ends in
// exactly one result, nothing stays claimed or settling, and what A had
// written survives: a result A pushed (or had recorded) is the one read,
// not a second dispatch.
func crossSlotCrash(t *testing.T, f *fixture, c *testenv.RedisCluster) {
	points := []struct {
		name  string
		point int
		// fromA: the result A was writing is the one read (the crash
		// left its record, or its push), not a second dispatch's.
		fromA bool
	}{
		{"BeforePrepare", rss.FaultBeforePrepare, false},
		{"BeforePush", rss.FaultBeforePush, true},
		{"BeforeCommit", rss.FaultBeforeCommit, true},
		{"BeforePayloadDelete", rss.FaultBeforePayloadDel, true},
	}
	for _, pt := range points {
		t.Run(pt.name, func(t *testing.T) {
			q, res := upstreamPair(t, "xs-crash-"+strings.ToLower(pt.name))
			results, finished := crashAndRecover(t, f, c, q, res, pt.point, false)
			wantFinished := int64(0)
			if pt.point == rss.FaultBeforePush || pt.point == rss.FaultBeforeCommit {
				wantFinished = 1 // the record A left
			}
			if finished != wantFinished {
				t.Errorf("B finished %d settle(s) of A's after a crash %s, want %d", finished, pt.name, wantFinished)
			}
			fromA := 0
			for _, r := range results {
				if strings.Contains(r, "from-a") {
					fromA++
				}
			}
			if pt.fromA && fromA != 1 {
				t.Errorf("%d results of A after a crash %s, want its 1 (else the request was dispatched again)", fromA, pt.name)
			}
			if !pt.fromA && fromA != 0 {
				t.Errorf("%d result(s) of A written though A died before preparing any", fromA)
			}
		})
	}
	t.Run("PushFailsThenNack", func(t *testing.T) { crossSlotNack(t, f, c) })
	// The one documented duplicate: the marker of A's push is gone (the
	// dedupe window passed before anyone finished A's settle), so B's
	// reclaimer pushes A's recorded result again: the same bytes, the same
	// id and request_token, which a consumer drops by (id, request_token).
	t.Run("MarkerExpired", func(t *testing.T) {
		q, res := upstreamPair(t, "xs-crash-window")
		results, _ := crashAndRecover(t, f, c, q, res, rss.FaultBeforeCommit, true)
		seen := map[string]string{}
		dups := 0
		for _, r := range results {
			var v struct {
				ID    string `json:"id"`
				Token string `json:"request_token"`
			}
			if err := json.Unmarshal([]byte(r), &v); err != nil || v.Token == "" {
				t.Fatalf("result %s: %v (no request_token)", r, err)
			}
			key := v.ID + "\x00" + v.Token
			if prev, ok := seen[key]; ok {
				dups++
				if prev != r {
					t.Errorf("a duplicate that differs: %s vs %s", prev, r)
				}
			}
			seen[key] = r
		}
		if dups != 1 {
			t.Errorf("%d duplicates after the marker expired, want 1 (A's one pushed result)", dups)
		}
		if len(seen) != crashRequests {
			t.Errorf("%d distinct (id, token) results, want %d", len(seen), crashRequests)
		}
	})
}

// crashRequests is how many requests crashAndRecover enqueues.
const crashRequests = 6

// crashAndRecover runs the crash of crossSlotCrash at point and returns
// every result written to res and how many settles B finished. With dropMarkers, the pushed set of res is
// deleted after the crash. Unless dropMarkers, it fails the test unless
// there is exactly one result per request.
func crashAndRecover(t *testing.T, f *fixture, c *testenv.RedisCluster, q, res string, point int, dropMarkers bool) (results []string, finished int64) {
	ctx := context.Background()
	cl := f.prod.Client()
	for i := range crashRequests {
		enqueueUpstream(t, cl, upstreamReq{id: fmt.Sprintf("c-%02d", i), queueID: q, queue: q, results: res, token: newToken(t), deadline: time.Now().Add(3 * time.Minute)})
	}
	opts := rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, LeaseMS: 600, HeartbeatMS: 150, ReclaimIntervalMS: 50, ResultRetryMS: 300, PollIntervalMS: 50}
	queue := transport.Queue{ID: q, Name: q, ResultName: res}
	a := f.transport(opts)
	crash := newCrashAt(point)
	rss.SetFaultHook(a, crash.hook)
	sa := subscribe(t, a, queue, crashRequests)
	var ms []*message.Message
	for range crashRequests {
		ms = append(ms, sa.next(10*time.Second))
	}
	pub, err := a.Publisher(queue)
	if err != nil {
		t.Fatal(err)
	}
	// One result is being written when A dies at point; the others it
	// holds, claimed, with no result begun (so each request is in a known
	// state at the crash).
	var wg sync.WaitGroup
	out := message.NewMessage(ms[0].UUID, (&wire.Result{ID: idOf(t, ms[0]), StatusCode: 200, Payload: `"from-a"`}).Marshal())
	out.Metadata = ms[0].Metadata
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = pub.Publish(res, out) // fails at the crash (but after the settle at FaultBeforePayloadDel)
	}()
	select {
	case <-crash.hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the settle never reached the crash point")
	}
	sa.close()
	_ = a.Client().Close() // dead: nothing more reaches Redis
	close(crash.release)
	wg.Wait()
	_ = a.Close()
	if dropMarkers {
		if err := cl.Del(ctx, "{"+res+"}:sluice-pushed").Err(); err != nil {
			t.Fatal(err)
		}
	}

	// B serves the queue: it re-dispatches what A never settled and its
	// reclaimer finishes what A had begun to.
	b := f.transport(opts)
	defer b.Close()
	sb := subscribe(t, b, queue, crashRequests)
	defer sb.close()
	distinct := func() (map[string]int, []string) {
		raw := cl.LRange(ctx, res, 0, -1).Val()
		n := map[string]int{}
		for _, r := range raw {
			var v struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal([]byte(r), &v)
			n[v.ID]++
		}
		return n, raw
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case m := <-sb.ch:
			out := message.NewMessage(m.UUID, (&wire.Result{ID: idOf(t, m), StatusCode: 200, Payload: `"from-b"`}).Marshal())
			out.Metadata = m.Metadata
			p, err := b.Publisher(queue)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Publish(res, out); err != nil {
				t.Fatal(err)
			}
			transport.Ack(m)
			continue
		case <-time.After(20 * time.Millisecond):
		}
		if n, _ := distinct(); len(n) == crashRequests {
			break
		}
		if time.Now().After(deadline) {
			n, raw := distinct()
			t.Fatalf("%d of %d requests answered 15 s after the crash: %q", len(n), crashRequests, raw)
		}
	}
	// Leases are 600 ms: a second dispatch or a second push would come
	// within a few of them.
	time.Sleep(time.Second)
	select {
	case m := <-sb.ch:
		t.Fatalf("a request was dispatched again after its result was written: %s", m.Payload)
	default:
	}
	n, raw := distinct()
	if !dropMarkers {
		for id, k := range n {
			if k != 1 {
				t.Errorf("%s answered %d times", id, k)
			}
		}
	}
	k := f.prod.Names().Queue(q)
	for _, key := range []string{k.Settling, k.Claimed, k.ClaimsIdx, q} {
		if n := keyLen(t, cl, key); n != 0 {
			t.Errorf("%s holds %d entries after the recovery", key, n)
		}
	}
	finished = b.Events()["cross_slot_finished"]
	t.Logf("crash at %d: %d results; B returned %d request(s) to the queue and finished %d settle(s)", point, len(raw), b.Stats().Reclaimed, finished)
	return raw, finished
}

// sameSlotOneScript: with one hash tag on the queue and its list the
// settle is the one-script settle (no cross-slot step runs).
func sameSlotOneScript(t *testing.T, f *fixture, c *testenv.RedisCluster) {
	ctx := context.Background()
	names := f.prod.Names()
	q, res := names.RequestQueue("xs-tagged"), names.ResultQueue("xs-tagged", "")
	for i := range 20 {
		if err := f.prod.Enqueue(ctx, q, request(fmt.Sprintf("t-%02d", i), "", 3*time.Minute, nil)); err != nil {
			t.Fatal(err)
		}
	}
	tp := f.transport(rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, PollIntervalMS: 50})
	if w := tp.QueueWarnings(transport.Queue{Name: q, ResultName: res}); len(w) != 0 {
		t.Fatalf("warnings for one hash tag: %q", w)
	}
	var mu sync.Mutex
	steps := 0
	rss.SetFaultHook(tp, func(p int) error {
		if p != rss.FaultBeforePayloadDel {
			mu.Lock()
			steps++
			mu.Unlock()
		}
		return nil
	})
	stop := f.runAppQueues(tp, []string{q}, func(string) string { return res }, 8)
	f.collect(res, 20, 20*time.Second)
	stop()
	mu.Lock()
	defer mu.Unlock()
	if steps != 0 {
		t.Errorf("%d cross-slot steps ran for a queue and list sharing a hash tag", steps)
	}
}

// crossSlotNack: Redis refuses the push until result_retry_ms runs out, the
// write is given up and the core nacks the request: the hand-back leaves
// the prepared claim alone (its result may be written), and once its lease
// runs out the replica's own reclaimer finishes the write: one result, the
// one computed, and the request is not delivered again.
func crossSlotNack(t *testing.T, f *fixture, c *testenv.RedisCluster) {
	ctx := context.Background()
	cl := f.prod.Client()
	q, res := upstreamPair(t, "xs-nack")
	enqueueUpstream(t, cl, upstreamReq{id: "n-1", queueID: q, queue: q, results: res, token: newToken(t), deadline: time.Now().Add(3 * time.Minute)})
	tp := f.transport(rss.Options{Server: rss.Server{URL: c.URL}, TopologyOptions: rss.TopologyOptions{Mode: "cluster"}, LeaseMS: 600, HeartbeatMS: 150, ReclaimIntervalMS: 50, ResultRetryMS: 300, PollIntervalMS: 50})
	defer tp.Close()
	var mu sync.Mutex
	failing := true
	rss.SetFaultHook(tp, func(p int) error {
		mu.Lock()
		defer mu.Unlock()
		if failing && p == rss.FaultBeforePush {
			return errors.New("push refused (test)")
		}
		return nil
	})
	queue := transport.Queue{ID: q, Name: q, ResultName: res}
	s := subscribe(t, tp, queue, 4)
	defer s.close()
	m := s.next(10 * time.Second)
	pub, err := tp.Publisher(queue)
	if err != nil {
		t.Fatal(err)
	}
	out := message.NewMessage(m.UUID, (&wire.Result{ID: "n-1", StatusCode: 200, Payload: `"computed"`}).Marshal())
	out.Metadata = m.Metadata
	if err := pub.Publish(res, out); err == nil {
		t.Fatal("publish succeeded though every push failed")
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	transport.Nack(m)
	deadline := time.Now().Add(10 * time.Second)
	for cl.LLen(ctx, res).Val() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no result 10 s after the nack; queue %d, claims %d", keyLen(t, cl, q), keyLen(t, cl, f.prod.Names().Queue(q).ClaimsIdx))
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case d := <-s.ch:
		t.Fatalf("the request was delivered again: %s", d.Payload)
	case <-time.After(time.Second):
	}
	raw := cl.LRange(ctx, res, 0, -1).Val()
	if len(raw) != 1 || !strings.Contains(raw[0], "computed") {
		t.Fatalf("results %q, want the one computed", raw)
	}
	k := f.prod.Names().Queue(q)
	for _, key := range []string{k.Settling, k.Claimed, k.ClaimsIdx, q} {
		if n := keyLen(t, cl, key); n != 0 {
			t.Errorf("%s holds %d entries", key, n)
		}
	}
}
