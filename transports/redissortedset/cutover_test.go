package redissortedset_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// Rolling cut-overs between upstream llm-d-async and sluice on one queue:
// upstream replicas (upReplica, upstream's claim protocol re-implemented)
// and sluice replicas run at once; no request may be dispatched twice
// while both live, none lost, and every request answered once, also when a
// replica of either kind dies holding claims.

// cutoverFixture is a fixture whose gateway counts dispatches per id.
func cutoverFixture(t *testing.T, delay time.Duration) (*fixture, *gateway) {
	f := newFixture(t, simulator.Config{})
	g := newGateway(t, delay)
	f.sim = g.srv.URL
	return f, g
}

// checkAnsweredOnce checks that every id has exactly one result in list,
// carrying its request token, and returns the results by id.
func checkAnsweredOnce(t *testing.T, c redis.UniversalClient, list string, tokens map[string]string) map[string]map[string]any {
	t.Helper()
	byID := map[string]map[string]any{}
	for _, r := range rawResults(t, c, list) {
		id, _ := r["id"].(string)
		if _, dup := byID[id]; dup {
			t.Errorf("%s answered twice", id)
		}
		byID[id] = r
		if tok, ok := tokens[id]; !ok {
			t.Errorf("result for unknown id %q", id)
		} else if r["request_token"] != tok {
			t.Errorf("%s: request_token %v, want %s", id, r["request_token"], tok)
		}
	}
	for id := range tokens {
		if byID[id] == nil {
			t.Errorf("%s was never answered", id)
		}
	}
	return byID
}

func TestCutoverMixedFleet(t *testing.T) {
	f, gw := cutoverFixture(t, 2*time.Millisecond)
	c := f.prod.Client()
	const q, results, n = "llm-d-async:requests:mixed", "llm-d-async:results:mixed", 300
	up := upProducer{c: c, queue: q, results: results}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("mix-%03d", i)
		tokens[id] = up.submit(t, id, dl+int64(i%3), payloadFor(id))
	}
	var byUpstream atomic.Int64
	u := newUpReplica(t, c, q, 3*time.Second, func(id string, p json.RawMessage) {
		byUpstream.Add(1)
		gw.dispatch(id, p)
	})
	stopUp := make(chan struct{})
	wg := u.run(stopUp, 5*time.Millisecond, 200*time.Millisecond, 10)
	tp := f.transport(rss.Options{PollIntervalMS: 20, LeaseMS: 3000, ReclaimIntervalMS: 200})
	stop := f.runApp(tp, q, results, 8)
	waitResults(t, c, results, n, 30*time.Second)
	close(stopUp)
	wg.Wait()
	stop()
	calls, _ := gw.counts()
	for id := range tokens {
		if calls[id] != 1 {
			t.Errorf("%s dispatched %d times, want 1", id, calls[id])
		}
	}
	up2 := byUpstream.Load()
	t.Logf("upstream replica dispatched %d, sluice %d", up2, int64(n)-up2)
	if up2 == 0 || up2 == n {
		t.Errorf("one side dispatched everything (upstream %d of %d): the fleet was not mixed", up2, n)
	}
	checkAnsweredOnce(t, c, results, tokens)
	checkClaimsGone(t, c, q)
	// Each claim call deletes the previous one's record: one is left.
	if ks := c.Keys(context.Background(), q+":claim-call:*").Val(); len(ks) > 1 {
		t.Errorf("%d claim-call records left, want at most 1", len(ks))
	}
	if st := tp.Stats(); st.LateResults != 0 {
		t.Errorf("late results with both fleets alive: %+v", st)
	}
}

func TestCutoverUpstreamReplicaDiesMidClaim(t *testing.T) {
	f, gw := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results, n = "llm-d-async:requests:updies", "llm-d-async:results:updies", 30
	up := upProducer{c: c, queue: q, results: results}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("ud-%02d", i)
		tokens[id] = up.submit(t, id, dl, payloadFor(id))
	}
	// An upstream replica claims everything and dies before dispatching:
	// its claims stay until their lease (1 s) lapses.
	dead := newUpReplica(t, c, q, time.Second, func(string, json.RawMessage) { t.Error("the dead replica dispatched") })
	if got := len(dead.claimSome(ctx, n)); got != n {
		t.Fatalf("the upstream replica claimed %d, want %d", got, n)
	}
	owners := c.HGetAll(ctx, q+":claim-owners").Val()
	for ck, o := range owners {
		if o != dead.owner || !strings.Contains(ck, "\x00") {
			t.Fatalf("claim %q owned by %q", ck, o)
		}
	}
	if c.ZCard(ctx, q).Val() != 0 {
		t.Fatal("the queue still holds requests")
	}
	tp := f.transport(rss.Options{PollIntervalMS: 20, ReclaimIntervalMS: 200})
	stop := f.runApp(tp, q, results, 8)
	waitResults(t, c, results, n, 15*time.Second)
	stop()
	calls, _ := gw.counts()
	for id := range tokens {
		if calls[id] != 1 {
			t.Errorf("%s dispatched %d times, want 1", id, calls[id])
		}
	}
	checkAnsweredOnce(t, c, results, tokens)
	checkClaimsGone(t, c, q)
	if st := tp.Stats(); st.Reclaimed < n {
		t.Errorf("sluice reclaimed %d, want %d: %+v", st.Reclaimed, n, st)
	}
	// The dead replica's late ack (were it to come back) is fenced.
	for _, id := range []string{"ud-00"} {
		ck := id + "\x00" + tokens[id]
		res := `{"id":"` + id + `","payload":"late"}`
		if got, err := upstreamAckScript.Run(ctx, c, []string{q + ":claimed", q + ":claim-owners", q + ":claims-idx", results}, ck, res, dead.owner, 0).Int(); err != nil || got != 0 {
			t.Errorf("the dead replica's ack: %d %v, want fenced (0)", got, err)
		}
	}
}

func TestCutoverSluiceReplicaDiesUpstreamReclaims(t *testing.T) {
	f, gw := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results, n = "llm-d-async:requests:sdies", "llm-d-async:results:sdies", 20
	up := upProducer{c: c, queue: q, results: results}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	for i := range n {
		id := fmt.Sprintf("sd-%02d", i)
		tokens[id] = up.submit(t, id, dl, payloadFor(id))
	}
	before := map[string]float64{}
	for _, z := range c.ZRangeWithScores(ctx, q, 0, -1).Val() {
		before[z.Member.(string)] = z.Score
	}
	// A sluice replica claims all of them and dies (no heartbeat, no
	// hand-back) while they are in flight.
	tp := f.transport(rss.Options{LeaseMS: 1500, HeartbeatMS: 500})
	t.Cleanup(func() { _ = tp.Close() })
	qq := queueOf(q)
	qq.ResultName = results
	s := subscribe(t, tp, qq, n)
	for range n {
		s.next(5 * time.Second)
	}
	owners := c.HGetAll(ctx, q+":claim-owners").Val()
	if len(owners) != n {
		t.Fatalf("%d claims, want %d", len(owners), n)
	}
	for ck, o := range owners {
		id, tok, ok := strings.Cut(ck, "\x00")
		if !ok || tokens[id] != tok || !rss.SluiceOwner(o) {
			t.Fatalf("claim id %q owner %q: want <id>\\0<token> owned by a sluice replica", ck, o)
		}
	}
	s.close()
	crash(tp)

	// An upstream replica's reclaimer returns them once their lease lapsed:
	// the stored member, byte for byte, at upstream's score.
	u := newUpReplica(t, c, q, 5*time.Second, gw.dispatch)
	end := time.Now().Add(10 * time.Second)
	got := 0
	for got < n && time.Now().Before(end) {
		got += u.reclaim(ctx)
		time.Sleep(50 * time.Millisecond)
	}
	if got != n {
		t.Fatalf("upstream reclaimed %d of %d", got, n)
	}
	after := c.ZRangeWithScores(ctx, q, 0, -1).Val()
	if len(after) != n {
		t.Fatalf("%d back in the queue, want %d", len(after), n)
	}
	for _, z := range after {
		m := z.Member.(string)
		if s, ok := before[m]; !ok || s != z.Score {
			t.Errorf("member back as %.60q score %v, want the original at %v", m, z.Score, s)
		}
	}
	for u.tick(ctx, 10) > 0 {
	}
	calls, _ := gw.counts()
	for id := range tokens {
		if calls[id] != 1 {
			t.Errorf("%s dispatched %d times by upstream, want 1", id, calls[id])
		}
	}
	checkAnsweredOnce(t, c, results, tokens)
	checkClaimsGone(t, c, q)
}

// TestEqualDeadlinesKeepEnqueueOrder: requests with one deadline, written
// alternately by upstream's producer and sluice's (Envelope), come out in
// enqueue order, also after sluice re-scored them: handed back (nack),
// retried through the delay set, and returned after their claim expired
// with a dead replica (upstream #462: re-ZADDs at the plain deadline broke
// this order).
func TestEqualDeadlinesKeepEnqueueOrder(t *testing.T) {
	f, _ := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results, n = "llm-d-async:requests:order", "llm-d-async:results:order", 40
	up := upProducer{c: c, queue: q, results: results}
	sp := producer.New(c, producer.Config{Envelope: true, ResultQueueName: results})
	dl := time.Now().Add(time.Hour).Truncate(time.Second)
	var want []string
	for i := range n {
		id := fmt.Sprintf("o-%02d", i)
		want = append(want, id)
		if i%2 == 0 {
			up.submit(t, id, dl.Unix(), payloadFor(id))
			continue
		}
		r := request(id, "", time.Hour, nil)
		r.Deadline, r.Payload = dl, json.RawMessage(payloadFor(id))
		if err := sp.Enqueue(ctx, q, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, z := range c.ZRangeWithScores(ctx, q, 0, -1).Val() {
		m := z.Member.(string)
		if got := strconv.FormatFloat(z.Score, 'g', 17, 64); got != upQueueScore(m) {
			t.Fatalf("enqueued at %s, want upstream's score %s: %.120s", got, upQueueScore(m), m)
		}
	}

	// A replica takes them all: hands back a third, retries a third at
	// once, and dies holding the rest.
	a := f.transport(rss.Options{LeaseMS: 1500, HeartbeatMS: 500})
	t.Cleanup(func() { _ = a.Close() })
	qq := queueOf(q)
	qq.ResultName = results
	s := subscribe(t, a, qq, n)
	for i := range n {
		m := s.next(5 * time.Second)
		switch i % 3 {
		case 0:
			transport.Nack(m)
		case 1:
			r, err := wire.Decode(m.Payload)
			if err != nil {
				t.Fatal(err)
			}
			payload, err := wire.WithRetryCount(m.Payload, r.RetryCount+1)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Requeue(ctx, qq, m, payload, time.Now()); err != nil {
				t.Fatal(err)
			}
			transport.Ack(m)
		}
	}
	s.close()
	crash(a)
	time.Sleep(1600 * time.Millisecond)
	if got, err := rss.ReclaimExpired(ctx, c, f.prod.Names().Queue(q), time.Now()); err != nil || got != n/3 {
		t.Fatalf("reclaimed %d (%v), want %d", got, err, n/3)
	}

	// Another replica, one request at a time.
	b := f.transport(rss.Options{PollIntervalMS: 20})
	t.Cleanup(func() { _ = b.Close() })
	s2 := subscribe(t, b, qq, 1)
	defer s2.close()
	var got []string
	for range n {
		m := s2.next(5 * time.Second)
		got = append(got, idOf(t, m))
		s2.answer(m)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("dispatch order\n%v\nwant\n%v", got, want)
	}
}

// TestUpstreamReclaimTakesOverSluiceClaim: an upstream replica that claims
// the same request (same id and token: it re-claims a retried copy, as its
// retry path does) takes the claim over; the sluice replica's heartbeat
// reports it lost and its result is fenced off, so one result is written.
func TestUpstreamReclaimTakesOverSluiceClaim(t *testing.T) {
	f, _ := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results = "llm-d-async:requests:takeover", "llm-d-async:results:takeover"
	up := upProducer{c: c, queue: q, results: results}
	tok := up.submit(t, "tk", time.Now().Add(time.Hour).Unix(), payloadFor("tk"))
	tp := f.transport(rss.Options{LeaseMS: 3000, HeartbeatMS: 200})
	t.Cleanup(func() { _ = tp.Close() })
	qq := queueOf(q)
	qq.ResultName = results
	s := subscribe(t, tp, qq, 1)
	defer s.close()
	msg := s.next(5 * time.Second)
	if got := msg.Metadata.Get(rss.MetaClaim); got != "tk\x00"+tok {
		t.Fatalf("claim id %q", got)
	}
	// The retried copy (retry_count 1) comes back and upstream claims it.
	var e upEnvelope
	if err := json.Unmarshal(msg.Payload, &e); err != nil {
		t.Fatal(err)
	}
	e.Internal.RetryCount = 1
	copyM, _ := json.Marshal(e)
	c.ZAdd(ctx, q, redis.Z{Score: 1, Member: string(copyM)})
	u := newUpReplica(t, c, q, time.Hour, nil)
	if n := len(u.claimSome(ctx, 1)); n != 1 {
		t.Fatalf("upstream claimed %d", n)
	}
	end := time.Now().Add(5 * time.Second)
	for tp.Stats().LostLeases == 0 && time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond)
	}
	if st := tp.Stats(); st.LostLeases != 1 {
		t.Errorf("sluice's heartbeat did not see the takeover: %+v", st)
	}
	s.answer(msg)
	if st := tp.Stats(); st.LateResults != 1 {
		t.Errorf("sluice's result was not fenced: %+v", st)
	}
	if n := c.LLen(ctx, results).Val(); n != 0 {
		t.Errorf("%d results written by the replica that lost the claim", n)
	}
	if o := c.HGet(ctx, q+":claim-owners", "tk\x00"+tok).Val(); o != u.owner {
		t.Errorf("claim owned by %q, want upstream's %q", o, u.owner)
	}
}
