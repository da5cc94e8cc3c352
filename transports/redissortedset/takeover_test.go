package redissortedset_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/transports/internal/upstream"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The state upstream llm-d-async leaves in Redis, written here with the
// bytes upstream writes (see docs/redis-sortedset.md, "Taking over from
// upstream", for the sources read):
//
//   - a request is the json.Marshal of api.InternalRequest: the tagged
//     envelope {"internal":{...},"request_kind":"redis","data":{...}}, the
//     fields in upstream's struct order, empty ones omitted;
//   - its producer enqueues with ZADD <queue> <deadline> <envelope>, and sets
//     request-active:<id> = <token> (PX = time to the deadline); a token is
//     16 random bytes in hex;
//   - it cancels by copying the active token to request-cancel:<id> (EX 7
//     days);
//   - its sorted-set retry worker writes a retry to one shared sorted set
//     (default "retry-sortedset"): member = the envelope (request_queue_name
//     stamped), score = float64(now Unix seconds) + backoff seconds.

// upstreamRouting is upstream's api.InternalRouting, in its field order.
type upstreamRouting struct {
	RetryCount       int    `json:"retry_count,omitempty"`
	QueueID          string `json:"queue_id,omitempty"`
	RequestToken     string `json:"request_token,omitempty"`
	RequestQueueName string `json:"request_queue_name,omitempty"`
	ResultQueueName  string `json:"result_queue_name,omitempty"`
}

// upstreamRedisRequest is upstream's api.RedisRequest (RequestMessage
// embedded, then the per-message queue names).
type upstreamRedisRequest struct {
	ID               string            `json:"id"`
	Created          int64             `json:"created"`
	Deadline         int64             `json:"deadline"`
	Payload          json.RawMessage   `json:"payload"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Headers          map[string]string `json:"headers,omitempty"`
	Endpoint         string            `json:"endpoint,omitempty"`
	RequestQueueName string            `json:"request_queue_name,omitempty"`
	ResultQueueName  string            `json:"result_queue_name,omitempty"`
}

// upstreamEnvelope is upstream's internalRequestWire.
type upstreamEnvelope struct {
	Internal    upstreamRouting      `json:"internal"`
	RequestKind string               `json:"request_kind"`
	Data        upstreamRedisRequest `json:"data"`
}

// upstreamReq describes one request as upstream's producer wrote it.
type upstreamReq struct {
	id, queueID, queue, results, token string
	deadline                           time.Time
	retries                            int
}

func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// member is the envelope upstream writes for r.
func (r upstreamReq) member(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(upstreamEnvelope{
		Internal:    upstreamRouting{RetryCount: r.retries, QueueID: r.queueID, RequestToken: r.token, RequestQueueName: r.queue, ResultQueueName: r.results},
		RequestKind: "redis",
		Data: upstreamRedisRequest{ID: r.id, Created: time.Now().Unix(), Deadline: r.deadline.Unix(),
			Payload: json.RawMessage(`{"model":"m","prompt":"hi"}`), Metadata: map[string]string{"job_id": "batch-1"},
			RequestQueueName: r.queue, ResultQueueName: r.results},
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// enqueueUpstream writes r as upstream's producer does: active token, then
// the envelope in the queue scored by its deadline.
func enqueueUpstream(t *testing.T, c redis.UniversalClient, r upstreamReq) {
	t.Helper()
	ctx := context.Background()
	if err := c.Set(ctx, upstream.ActiveKey(r.id), r.token, time.Until(r.deadline)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ZAdd(ctx, r.queue, redis.Z{Score: float64(r.deadline.Unix()), Member: r.member(t)}).Err(); err != nil {
		t.Fatal(err)
	}
}

// retryUpstream writes r to upstream's retry set, due in backoff (negative:
// already due), as its retry worker does (the request was enqueued, so its
// active key exists), and returns the member.
func retryUpstream(t *testing.T, c redis.UniversalClient, set string, r upstreamReq, backoff time.Duration) string {
	t.Helper()
	ctx := context.Background()
	if err := c.Set(ctx, upstream.ActiveKey(r.id), r.token, time.Until(r.deadline)).Err(); err != nil {
		t.Fatal(err)
	}
	score := float64(time.Now().Unix()) + backoff.Seconds()
	m := r.member(t)
	if err := c.ZAdd(ctx, set, redis.Z{Score: score, Member: m}).Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// cancelUpstream cancels id as upstream's producer does: the active token is
// copied to the cancel key.
func cancelUpstream(t *testing.T, c redis.UniversalClient, id string) {
	t.Helper()
	ctx := context.Background()
	tok, err := c.Get(ctx, upstream.ActiveKey(id)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, upstream.CancelKey(id), tok, 7*24*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestTakeOverFromUpstream replaces a running upstream processor: two sluice
// replicas start on the state it left — waiting envelopes, due and future
// entries in its shared retry set (more than one page of them), entries of a
// queue they do not serve, and cancellation keys — and every request is
// answered exactly once; cancelled ones CANCELLED; the cancellation keys of
// answered requests are cleaned when, and only when, they still hold the
// request's token.
func TestTakeOverFromUpstream(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	c := f.prod.Client()
	const retrySet = rss.DefaultUpstreamRetryQueueName
	q, res := rss.RequestQueueName("pool-a"), rss.ResultQueueName("pool-a", "")
	dl := time.Now().Add(time.Hour)
	req := func(id string) upstreamReq {
		return upstreamReq{id: id, queueID: "pool-a", queue: q, results: res, token: newToken(t), deadline: dl}
	}
	want := map[string]wire.ErrorCode{}

	// Waiting requests.
	for _, id := range []string{"w1", "w2", "w3", "c1", "c2", "c3"} {
		enqueueUpstream(t, c, req(id))
		want[id] = wire.CodeNone
	}
	cancelUpstream(t, c, "c1") // cancelled: CANCELLED, both keys cleaned
	want["c1"] = wire.CodeCancelled
	// c2's cancel key holds an older enqueue's token: c2 runs; the stale
	// cancel key stays. c3's active key holds a newer enqueue's token: it
	// stays too.
	if err := c.Set(ctx, upstream.CancelKey("c2"), "old-generation-token", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, upstream.ActiveKey("c3"), "newer-generation-token", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	// A flat request (sluice's own producers): no token, its keys untouched.
	if err := f.prod.Enqueue(ctx, q, request("f1", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, upstream.ActiveKey("f1"), "not-ours", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	want["f1"] = wire.CodeNone

	// Upstream's retries: 300 due (more than one page of the mover), one
	// due later, one that names its queue only by id, one cancelled.
	for i := range 300 {
		r := req(fmt.Sprintf("r%03d", i))
		r.retries = 1
		retryUpstream(t, c, retrySet, r, -5*time.Second)
		want[r.id] = wire.CodeNone
	}
	later := req("r-later")
	retryUpstream(t, c, retrySet, later, 2*time.Second)
	want["r-later"] = wire.CodeNone
	byID := req("r-byid")
	byID.queue, byID.queueID = "", q // runApp's queue: its id defaults to its name
	retryUpstream(t, c, retrySet, byID, -time.Second)
	want["r-byid"] = wire.CodeNone
	rc := req("r-cancelled")
	retryUpstream(t, c, retrySet, rc, -time.Second)
	cancelUpstream(t, c, "r-cancelled")
	want["r-cancelled"] = wire.CodeCancelled
	// Not ours: another deployment's queue, and an entry that is no envelope.
	foreign := req("x1")
	foreign.queue, foreign.queueID = "other-deployment-queue", "other"
	foreignMember := retryUpstream(t, c, retrySet, foreign, -time.Second)
	if err := c.ZAdd(ctx, retrySet, redis.Z{Score: 1, Member: "not an envelope"}).Err(); err != nil {
		t.Fatal(err)
	}

	// Two replicas take over at once.
	a, b := f.transport(rss.Options{}), f.transport(rss.Options{})
	f.runApp(a, q, res, 32)
	f.runApp(b, q, res, 32)
	got := f.collect(res, len(want), 30*time.Second)
	for id, code := range want {
		r, ok := got[id]
		switch {
		case !ok:
			t.Errorf("%s: no result", id)
		case r.ErrorCode != code:
			t.Errorf("%s: %+v, want code %q", id, r, code)
		case code == wire.CodeNone && r.StatusCode != 200:
			t.Errorf("%s: %+v", id, r)
		}
	}
	f.expectNoMore(res, 1500*time.Millisecond)

	left, err := c.ZRange(ctx, retrySet, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || !slices.Contains(left, "not an envelope") || !slices.Contains(left, foreignMember) {
		t.Errorf("left in %s: %q, want the foreign entry and the junk", retrySet, left)
	}
	if n := a.Stats().AdoptedRetries + b.Stats().AdoptedRetries; n != 303 {
		t.Errorf("adopted %d retries, want 303", n)
	}
	for key, wantVal := range map[string]string{
		upstream.ActiveKey("w1"):          "",
		upstream.ActiveKey("c1"):          "",
		upstream.CancelKey("c1"):          "",
		upstream.ActiveKey("c2"):          "",
		upstream.CancelKey("c2"):          "old-generation-token",
		upstream.ActiveKey("c3"):          "newer-generation-token",
		upstream.ActiveKey("f1"):          "not-ours",
		upstream.ActiveKey("r000"):        "",
		upstream.ActiveKey("r-cancelled"): "",
		upstream.CancelKey("r-cancelled"): "",
		upstream.ActiveKey("x1"):          foreign.token,
	} {
		v, err := c.Get(ctx, key).Result()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		if v != wantVal {
			t.Errorf("%s = %q, want %q", key, v, wantVal)
		}
	}
	if d := f.depth(q); d != "waiting=0 inflight=0 delayed=0 dead=0" {
		t.Errorf("depth after the run: %s", d)
	}
}
