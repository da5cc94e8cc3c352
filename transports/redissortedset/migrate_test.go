package redissortedset_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// snapshot renders every key of the database with its type and contents.
func snapshot(t *testing.T, c redis.UniversalClient) string {
	t.Helper()
	ctx := context.Background()
	ks, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		typ := c.Type(ctx, k).Val()
		var v any
		switch typ {
		case "string":
			v = c.Get(ctx, k).Val()
		case "list":
			v = c.LRange(ctx, k, 0, -1).Val()
		case "zset":
			v = c.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "hash":
			h := c.HGetAll(ctx, k).Val()
			fs := make([]string, 0, len(h))
			for f, x := range h {
				fs = append(fs, f+"="+x)
			}
			sort.Strings(fs)
			v = fs
		case "set":
			m := c.SMembers(ctx, k).Val()
			sort.Strings(m)
			v = m
		}
		fmt.Fprintf(&b, "%s %s %v\n", k, typ, v)
	}
	return b.String()
}

// zscore returns member's score in key, failing when it is absent.
func zscore(t *testing.T, c redis.UniversalClient, key, member string) float64 {
	t.Helper()
	s, err := c.ZScore(context.Background(), key, member).Result()
	if err != nil {
		t.Fatalf("%s: member missing (%v): %.80s", key, err, member)
	}
	return s
}

// TestMigrateToUpstream builds sluice's state with the transport itself (a
// replica dies holding a lease; two requests wait for a retry), then rolls
// back: refused while the lease is renewed, a dry run writes nothing, the
// run produces upstream's shapes (which upstream's retry mover consumes), a
// second run is a no-op.
func TestMigrateToUpstream(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	c := f.prod.Client()
	q := queueOf("rollback")
	dl := time.Now().Add(time.Hour).Truncate(time.Second)
	e1 := upstreamReq{id: "e1", queueID: q.ID, queue: q.Name, results: q.ResultName, token: newToken(t), deadline: dl}
	e2 := e1
	e2.id, e2.token, e2.deadline = "e2", newToken(t), dl.Add(time.Minute)
	e1m, e2m := e1.member(t), e2.member(t)
	_ = e2m
	for _, m := range []string{e1m, e2m} {
		r, err := wire.Decode([]byte(m))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ZAdd(ctx, q.Name, redis.Z{Score: float64(r.Deadline.Unix()), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	f1 := request("f1", "", 2*time.Hour, nil) // sluice's producer: flat, names no queue
	if err := f.prod.Enqueue(ctx, q.Name, f1); err != nil {
		t.Fatal(err)
	}

	// A replica claims all three, parks e2 and f1 for a retry in an hour,
	// and dies running e1.
	tp := f.transport(rss.Options{LeaseMS: 3000, HeartbeatMS: 1000, ReclaimIntervalMS: 60000})
	t.Cleanup(func() { _ = tp.Close() })
	s := subscribe(t, tp, q, 3)
	msgs := map[string]*message.Message{}
	for range 3 {
		m := s.next(5 * time.Second)
		msgs[idOf(t, m)] = m
	}
	due := time.Now().Add(time.Hour)
	for _, id := range []string{"e2", "f1"} {
		m := msgs[id]
		if m == nil {
			t.Fatalf("%s was not delivered", id)
		}
		if err := tp.Requeue(ctx, q, m, m.Payload, due); err != nil {
			t.Fatal(err)
		}
	}
	s.close()
	crash(tp)

	m, err := rss.NewMigrator(c, rss.Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, c)
	_, err = m.ToUpstream(ctx, q.Name)
	var live *rss.LiveLeasesError
	if !errors.As(err, &live) || live.Count != 1 || live.Queue != q.Name {
		t.Fatalf("with a lease still renewed: %v, want a LiveLeasesError for 1 lease", err)
	}
	if after := snapshot(t, c); after != before {
		t.Fatalf("a refused migration wrote:\n%s\nwas:\n%s", after, before)
	}

	// The dead replica's lease expires.
	deadline := time.Now().Add(10 * time.Second)
	for m.CheckLeases(ctx, q.Name) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the lease did not expire")
		}
		time.Sleep(100 * time.Millisecond)
	}

	want := rss.RollbackReport{Queue: q.Name, Leased: 1, Retries: 1, RetriesToQueue: 1}
	m.DryRun = true
	before = snapshot(t, c)
	rep, err := m.ToUpstream(ctx, q.Name)
	if err != nil || rep != want {
		t.Fatalf("dry run: %+v %v, want %+v", rep, err, want)
	}
	if after := snapshot(t, c); after != before {
		t.Fatalf("the dry run wrote:\n%s\nwas:\n%s", after, before)
	}

	m.DryRun = false
	// Returned as the reclaimer would return it: the lost delivery is
	// counted in the (sluice-only, left) redelivery counts.
	want.Redeliveries = 1
	rep, err = m.ToUpstream(ctx, q.Name)
	if err != nil || rep != want {
		t.Fatalf("migration: %+v %v, want %+v", rep, err, want)
	}
	// Upstream's shapes: e1 waits in the queue scored by its deadline, e2
	// waits in the retry set scored by its due time in seconds, f1 (which
	// upstream's mover could not route) waits in the queue.
	if s := zscore(t, c, q.Name, e1m); s != float64(dl.Unix()) {
		t.Errorf("e1 score %v, want its deadline %d", s, dl.Unix())
	}
	// The retry is the envelope as the replica wrote it back: stamped with
	// its routing, as upstream stamps it at dequeue.
	var e2r string
	for _, m := range c.ZRange(ctx, rss.DefaultUpstreamRetryQueueName, 0, -1).Val() {
		if strings.Contains(m, `"id":"e2"`) {
			e2r = m
		}
	}
	if !strings.Contains(e2r, `"result_routing_resolved":true`) || !sameUnstamped(t, []byte(e2r), string(msgs["e2"].Payload)) {
		t.Errorf("e2's retry is not the delivered envelope with its routing stamped: %s", e2r)
	}
	if s := zscore(t, c, rss.DefaultUpstreamRetryQueueName, e2r); math.Abs(s-float64(due.UnixMilli())/1000) > 2 {
		t.Errorf("e2 score %v, want its due time %d", s, due.Unix())
	}
	f1m := string(msgs["f1"].Payload)
	if s := zscore(t, c, q.Name, f1m); strconv.FormatFloat(s, 'f', -1, 64) != rss.Score(f1.Deadline) {
		t.Errorf("f1 score %v, want %s", s, rss.Score(f1.Deadline))
	}
	if n := c.Exists(ctx, q.Name+":leases", q.Name+":leased", q.Name+":delayed").Val(); n != 0 {
		t.Errorf("%d of sluice's lease and delay keys left", n)
	}

	before = snapshot(t, c)
	rep, err = m.ToUpstream(ctx, q.Name)
	if err != nil || rep != (rss.RollbackReport{Queue: q.Name, Redeliveries: 1}) {
		t.Fatalf("second run: %+v %v, want nothing moved", rep, err)
	}
	if after := snapshot(t, c); after != before {
		t.Fatalf("the second run wrote:\n%s\nwas:\n%s", after, before)
	}

	// Upstream's retry mover, once e2 is due: ZRANGEBYSCORE -inf now, parse
	// the envelope, ZADD into internal.request_queue_name at the deadline.
	later := float64(due.Unix() + 5)
	entries, err := c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: rss.DefaultUpstreamRetryQueueName, ByScore: true, Start: "-inf", Stop: strconv.FormatFloat(later, 'f', -1, 64)}).Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("due retries for upstream: %q %v", entries, err)
	}
	var env upstreamEnvelope
	if err := json.Unmarshal([]byte(entries[0]), &env); err != nil || env.Internal.RequestQueueName != q.Name || env.Data.Deadline != e2.deadline.Unix() {
		t.Fatalf("upstream's mover would read %+v (%v)", env, err)
	}
}

// TestMigrateToUpstreamForce moves a lease a live replica still renews: the
// replica's result is then discarded as late, and the request waits in the
// queue for upstream, so it is still answered once.
func TestMigrateToUpstreamForce(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	c := f.prod.Client()
	q := queueOf("rollback-force")
	if err := f.prod.Enqueue(ctx, q.Name, request("r1", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	tp := f.transport(rss.Options{})
	t.Cleanup(func() { _ = tp.Close() })
	s := subscribe(t, tp, q, 1)
	defer s.close()
	msg := s.next(5 * time.Second)

	m, err := rss.NewMigrator(c, rss.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ToUpstream(ctx, q.Name); err == nil {
		t.Fatal("moved a live lease without Force")
	}
	m.Force = true
	rep, err := m.ToUpstream(ctx, q.Name)
	if err != nil || rep.Leased != 1 || rep.LiveLeases != 1 {
		t.Fatalf("forced: %+v %v", rep, err)
	}
	if n := c.ZCard(ctx, q.Name).Val(); n != 1 {
		t.Fatalf("%d requests waiting, want 1", n)
	}
	s.answer(msg)
	if st := tp.Stats(); st.LateResults != 1 {
		t.Errorf("the replica's result was not discarded: %+v", st)
	}
	if n := c.LLen(ctx, q.ResultName).Val(); n != 0 {
		t.Errorf("%d results written for a request handed to upstream", n)
	}
}

// TestMigrateFromUpstream adopts upstream's retry set into the delay sets of
// the given queues, keeping due times; entries of other queues stay; a dry
// run writes nothing; a second run is a no-op; a sluice replica then claims
// the due entry with its deadline.
func TestMigrateFromUpstream(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	c := f.prod.Client()
	const set = rss.DefaultUpstreamRetryQueueName
	q := queueOf("adopt")
	dl := time.Now().Add(time.Hour).Truncate(time.Second)
	r := func(id string) upstreamReq {
		return upstreamReq{id: id, queueID: q.ID, queue: q.Name, results: q.ResultName, token: newToken(t), deadline: dl, retries: 2}
	}
	dueM := retryUpstream(t, c, set, r("due"), -10*time.Second)
	laterM := retryUpstream(t, c, set, r("later"), time.Hour)
	other := r("other")
	other.queue, other.queueID = "someone-else", "someone-else"
	otherM := retryUpstream(t, c, set, other, -time.Second)
	laterScore := zscore(t, c, set, laterM)

	m, err := rss.NewMigrator(c, rss.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.DryRun = true
	before := snapshot(t, c)
	moved, left, err := m.FromUpstream(ctx, []transport.Queue{q})
	if err != nil || moved[q.Name] != 2 || left != 1 {
		t.Fatalf("dry run: %v left %d %v", moved, left, err)
	}
	if after := snapshot(t, c); after != before {
		t.Fatalf("the dry run wrote:\n%s\nwas:\n%s", after, before)
	}
	m.DryRun = false
	moved, left, err = m.FromUpstream(ctx, []transport.Queue{q})
	if err != nil || moved[q.Name] != 2 || left != 1 {
		t.Fatalf("migration: %v left %d %v", moved, left, err)
	}
	delayed := q.Name + ":delayed"
	wantScore := strconv.FormatInt(dl.Unix(), 10)
	if s := zscore(t, c, delayed, wantScore+"|"+laterM); int64(s) != int64(math.Round(laterScore*1000)) {
		t.Errorf("due time %v, want %v ms", s, laterScore*1000)
	}
	zscore(t, c, delayed, wantScore+"|"+dueM)
	if left := c.ZRange(ctx, set, 0, -1).Val(); len(left) != 1 || left[0] != otherM {
		t.Errorf("left in %s: %q", set, left)
	}
	before = snapshot(t, c)
	if moved, left, err := m.FromUpstream(ctx, []transport.Queue{q}); err != nil || len(moved) != 0 || left != 1 {
		t.Fatalf("second run: %v left %d %v", moved, left, err)
	}
	if after := snapshot(t, c); after != before {
		t.Fatalf("the second run wrote:\n%s\nwas:\n%s", after, before)
	}

	tp := f.transport(rss.Options{})
	t.Cleanup(func() { _ = tp.Close() })
	s := subscribe(t, tp, q, 5)
	defer s.close()
	got := s.next(5 * time.Second)
	if idOf(t, got) != "due" || got.Metadata.Get(rss.MetaScore) != wantScore || !sameUnstamped(t, got.Payload, dueM) {
		t.Fatalf("claimed %s (score %s), want the due retry at its deadline", got.Payload, got.Metadata.Get(rss.MetaScore))
	}
	s.none(300 * time.Millisecond)
}

// sameUnstamped reports whether an envelope is want with at most the
// stamps a dequeue adds (result_routing_resolved, and result_ttl_seconds,
// result_queue_name, request_queue_name and queue_id when they were
// empty): decoded, everything else is equal.
func sameUnstamped(t *testing.T, got []byte, want string) bool {
	t.Helper()
	var g, w map[string]any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("delivered %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gi, _ := g["internal"].(map[string]any)
	wi, _ := w["internal"].(map[string]any)
	for _, k := range []string{"result_routing_resolved", "result_ttl_seconds", "result_queue_name", "request_queue_name", "queue_id"} {
		if _, ok := wi[k]; !ok {
			delete(gi, k)
		}
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	return string(gb) == string(wb)
}

// TestMigrateClaims: both directions return expired claims (here an
// upstream replica's) to the queue at upstream's score; a rollback refuses
// while a sluice replica's claim is live but not for an upstream
// replica's, which it leaves to it; --force hands the sluice claim back.
func TestMigrateClaims(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	c := f.prod.Client()
	const q, results = "llm-d-async:requests:mclaims", "llm-d-async:results:mclaims"
	up := upProducer{c: c, queue: q, results: results}
	dl := time.Now().Add(time.Hour).Unix()
	for _, id := range []string{"live-up", "dead-up", "live-sluice"} {
		up.submit(t, id, dl, payloadFor(id))
	}
	members := map[string]string{}
	for _, z := range c.ZRange(ctx, q, 0, -1).Val() {
		var e upEnvelope
		_ = json.Unmarshal([]byte(z), &e)
		members[e.Data.ID] = z
	}
	alive := newUpReplica(t, c, q, time.Hour, nil)
	dead := newUpReplica(t, c, q, -time.Second, nil)                           // its lease is already over
	if len(alive.claimSome(ctx, 1)) != 1 || len(dead.claimSome(ctx, 1)) != 1 { // in enqueue order
		t.Fatal("the upstream replicas claimed nothing")
	}
	tp := f.transport(rss.Options{})
	t.Cleanup(func() { _ = tp.Close() })
	qq := queueOf(q)
	qq.ResultName = results
	s := subscribe(t, tp, qq, 1)
	defer s.close()
	msg := s.next(5 * time.Second)
	if idOf(t, msg) != "live-sluice" {
		t.Fatalf("sluice claimed %s", idOf(t, msg))
	}

	m, err := rss.NewMigrator(c, rss.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var live *rss.LiveLeasesError
	if _, err := m.ToUpstream(ctx, q); !errors.As(err, &live) || live.Count != 1 {
		t.Fatalf("rollback with a live sluice claim: %v, want a LiveLeasesError for 1", err)
	}
	m.DryRun = true
	if rep, err := m.ReturnClaims(ctx, q); err != nil || rep != (rss.ClaimsReport{Returned: 1, LiveSluice: 1, LiveUpstream: 1}) {
		t.Fatalf("dry run: %+v %v", rep, err)
	}
	if n := c.ZCard(ctx, q).Val(); n != 0 {
		t.Fatalf("the dry run moved %d", n)
	}
	m.DryRun = false
	if rep, err := m.ReturnClaims(ctx, q); err != nil || rep != (rss.ClaimsReport{Returned: 1, LiveSluice: 1, LiveUpstream: 1}) {
		t.Fatalf("return claims: %+v %v", rep, err)
	}
	if s := strconv.FormatFloat(zscore(t, c, q, members["dead-up"]), 'g', 17, 64); s != upQueueScore(members["dead-up"]) {
		t.Errorf("the dead replica's request is back at %s, want %s", s, upQueueScore(members["dead-up"]))
	}
	m.Force = true
	rep, err := m.ToUpstream(ctx, q)
	if err != nil || rep.Leased != 1 || rep.LiveLeases != 1 || rep.UpstreamClaims != 1 {
		t.Fatalf("forced rollback: %+v %v", rep, err)
	}
	zscore(t, c, q, members["live-sluice"])
	if o := c.HGet(ctx, q+":claim-owners", "live-up\x00"+mustToken(t, members["live-up"])).Val(); o != alive.owner {
		t.Errorf("the live upstream claim is owned by %q, want it left to %q", o, alive.owner)
	}
	s.answer(msg)
	if st := tp.Stats(); st.LateResults != 1 {
		t.Errorf("the handed-back request's result was not fenced: %+v", st)
	}
}

func mustToken(t *testing.T, member string) string {
	t.Helper()
	var e upEnvelope
	if err := json.Unmarshal([]byte(member), &e); err != nil {
		t.Fatal(err)
	}
	return e.Internal.RequestToken
}
