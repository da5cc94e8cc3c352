package redissortedset_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

func TestEndToEnd(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	q, res := rss.RequestQueueName("pool-a"), rss.ResultQueueName("pool-a", "")
	var reqs []*wire.Request
	for _, id := range ids("r", 500) {
		reqs = append(reqs, request(id, "job-1", time.Hour, nil))
	}
	if err := f.prod.EnqueueMany(context.Background(), q, reqs); err != nil {
		t.Fatal(err)
	}
	f.runApp(f.transport(rss.Options{}), q, res, 32)
	got := f.collect(res, len(reqs), 20*time.Second)
	for id, r := range got {
		if !r.OK() || r.StatusCode != 200 || r.Metadata["job_id"] != "job-1" {
			t.Fatalf("result %s: %+v", id, r)
		}
	}
	f.expectNoMore(res, 200*time.Millisecond)
	if d := f.depth(q); d != "waiting=0 inflight=0 delayed=0 dead=0" {
		t.Errorf("depth after the run: %s", d)
	}
}

func TestCancelQueuedJob(t *testing.T) {
	f := newFixture(t, simulator.Config{Latency: simulator.Fixed(100 * time.Millisecond)})
	ctx := context.Background()
	q, res := "cancel-queued", "cancel-queued:results"
	var reqs []*wire.Request
	for _, id := range ids("keep", 20) {
		reqs = append(reqs, request(id, "keep", time.Hour, nil))
	}
	for _, id := range ids("victim", 50) {
		reqs = append(reqs, request(id, "victim", 2*time.Hour, nil))
	}
	if err := f.prod.EnqueueMany(ctx, q, reqs); err != nil {
		t.Fatal(err)
	}
	moved, err := f.prod.CancelJob(ctx, "victim")
	if err != nil || moved != 50 {
		t.Fatalf("CancelJob moved %d (%v), want 50", moved, err)
	}
	f.runApp(f.transport(rss.Options{}), q, res, 2)
	got := f.collect(res, len(reqs), 20*time.Second)
	// The cancelled requests went to the front: they are answered before
	// the job that keeps running, whose deadlines are earlier.
	for id, r := range got {
		want := wire.CodeNone
		if r.Metadata["job_id"] == "victim" {
			want = wire.CodeCancelled
		}
		if r.ErrorCode != want {
			t.Fatalf("%s: %+v, want code %q", id, r, want)
		}
	}
	if n := f.prod.Client().Exists(ctx, q+":job:victim", "llm-d-async:jobq:victim").Val(); n != 0 {
		t.Fatalf("job index left behind (%d keys)", n)
	}
}

func TestCancelInFlight(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q, res := "cancel-inflight", "cancel-inflight:results"
	slow := map[string]string{"X-Sim-Latency-Ms": "20000"}
	var reqs []*wire.Request
	for _, id := range ids("job", 3) {
		reqs = append(reqs, request(id, "slow-job", time.Hour, slow))
	}
	reqs = append(reqs, request("single", "", time.Hour, slow))
	if err := f.prod.EnqueueMany(ctx, q, reqs); err != nil {
		t.Fatal(err)
	}
	f.runApp(f.transport(rss.Options{}), q, res, 8)
	f.waitInFlight(q, 4, 5*time.Second)
	time.Sleep(100 * time.Millisecond) // let the HTTP calls start
	if _, err := f.prod.CancelJob(ctx, "slow-job"); err != nil {
		t.Fatal(err)
	}
	if err := f.prod.CancelRequest(ctx, "single"); err != nil {
		t.Fatal(err)
	}
	// Without the abort these would take 20 s.
	got := f.collect(res, 4, 5*time.Second)
	for id, r := range got {
		if r.ErrorCode != wire.CodeCancelled {
			t.Fatalf("%s: %+v", id, r)
		}
	}
}

func TestUpstreamCancelKey(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q, res := "upstream", "upstream:results"
	dl := time.Now().Add(time.Hour).Unix()
	env := func(id, token string) string {
		return fmt.Sprintf(`{"request_kind":"redis","internal":{"retry_count":0,"request_token":%q},"data":{"id":%q,"deadline":%d,"payload":{"model":"m"}}}`, token, id, dl)
	}
	c := f.prod.Client()
	for _, m := range []string{env("u-cancelled", "tok1"), env("u-other-token", "tok2"), env("u-plain", "tok3")} {
		if err := c.ZAdd(ctx, q, redisZ(float64(dl), m)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c.Set(ctx, "request-cancel:u-cancelled", "tok1", time.Hour)
	c.Set(ctx, "request-cancel:u-other-token", "stale", time.Hour)
	f.runApp(f.transport(rss.Options{}), q, res, 4)
	got := f.collect(res, 3, 10*time.Second)
	if got["u-cancelled"].ErrorCode != wire.CodeCancelled || !got["u-other-token"].OK() || !got["u-plain"].OK() {
		t.Fatalf("results %+v %+v %+v", got["u-cancelled"], got["u-other-token"], got["u-plain"])
	}
}

// Upstream's producer cancels by writing request-cancel:<id>; nothing
// announces it. A request whose marker is written while its call runs is
// aborted by the in-flight poll (every second, as upstream's dispatcher
// since v0.10) and answered CANCELLED; a marker holding another token
// (an older enqueue of the id) aborts nothing.
func TestUpstreamCancelInFlight(t *testing.T) {
	f := newFixture(t, simulator.Config{Latency: simulator.Fixed(6 * time.Second)})
	ctx := context.Background()
	q, res := "upstream-inflight", "upstream-inflight:results"
	dl := time.Now().Add(time.Hour).Unix()
	c := f.prod.Client()
	for _, id := range []string{"u-1", "u-2"} {
		m := fmt.Sprintf(`{"request_kind":"redis","internal":{"retry_count":0,"request_token":"tok-%s"},"data":{"id":%q,"deadline":%d,"payload":{"model":"m"}}}`, id, id, dl)
		if err := c.ZAdd(ctx, q, redisZ(float64(dl), m)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	f.runApp(f.transport(rss.Options{}), q, res, 4)
	f.waitInFlight(q, 2, 5*time.Second)
	time.Sleep(100 * time.Millisecond) // the calls have started: the claim found no marker
	c.Set(ctx, "request-cancel:u-1", "tok-u-1", time.Hour)
	c.Set(ctx, "request-cancel:u-2", "an-older-token", time.Hour)
	start := time.Now()
	got := f.collect(res, 1, 4*time.Second) // without the poll: 6 s
	if r := got["u-1"]; r == nil || r.ErrorCode != wire.CodeCancelled {
		t.Fatalf("u-1: %+v", got)
	}
	t.Logf("aborted %v after the marker was written", time.Since(start).Round(time.Millisecond))
	f.expectNoMore(res, 1500*time.Millisecond) // u-2 is still in its call
}

// A queue without a result list of its own routes each result as upstream
// does: to the list the envelope names (internal.result_queue_name), else to
// the transport's.
func TestResultRouting(t *testing.T) {
	f := newFixture(t, simulator.Config{})
	ctx := context.Background()
	q, res, tenant := "routed", "routed:results", "llm-d-async:results:pool-a:tenant-7"
	dl := time.Now().Add(time.Hour).Unix()
	c := f.prod.Client()
	for _, m := range []string{
		fmt.Sprintf(`{"request_kind":"redis","internal":{"retry_count":0,"result_queue_name":%q},"data":{"id":"to-tenant","deadline":%d,"payload":{"model":"m"}}}`, tenant, dl),
		fmt.Sprintf(`{"request_kind":"redis","internal":{"retry_count":0},"data":{"id":"to-default","deadline":%d,"payload":{"model":"m"}}}`, dl),
	} {
		if err := c.ZAdd(ctx, q, redisZ(float64(dl), m)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	f.runApp(f.transport(rss.Options{}), q, res, 4)
	if got := f.collect(tenant, 1, 10*time.Second); got["to-tenant"] == nil || !got["to-tenant"].OK() {
		t.Fatalf("tenant list: %+v", got)
	}
	if got := f.collect(res, 1, 10*time.Second); got["to-default"] == nil || !got["to-default"].OK() {
		t.Fatalf("default list: %+v", got)
	}
	f.expectNoMore(res, 200*time.Millisecond)
	f.expectNoMore(tenant, 100*time.Millisecond)
}

func TestTwoReplicasSplitWork(t *testing.T) {
	f := newFixture(t, simulator.Config{Latency: simulator.Fixed(2 * time.Millisecond)})
	ctx := context.Background()
	q, res := "shared", "shared:results"
	var reqs []*wire.Request
	for _, id := range ids("s", 2000) {
		reqs = append(reqs, request(id, "", time.Hour, nil))
	}
	a, b := f.transport(rss.Options{}), f.transport(rss.Options{})
	f.runApp(a, q, res, 16)
	f.runApp(b, q, res, 16)
	if err := f.prod.EnqueueMany(ctx, q, reqs); err != nil {
		t.Fatal(err)
	}
	got := f.collect(res, len(reqs), 30*time.Second)
	for id, r := range got {
		if !r.OK() {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	f.expectNoMore(res, 200*time.Millisecond)
	ca, cb := a.Stats().Claimed, b.Stats().Claimed
	if ca == 0 || cb == 0 || ca+cb != int64(len(reqs)) {
		t.Fatalf("claims split %d/%d, want both > 0 and a sum of %d", ca, cb, len(reqs))
	}
	t.Logf("replica A claimed %d, replica B %d", ca, cb)
}

func TestAuthURL(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{Password: "s3cret"})
	ctx := context.Background()
	bad, err := producer.Dial("redis://:wrong@"+r.Addr+"/0", producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if err := bad.Enqueue(ctx, "auth", request("x", "", time.Hour, nil)); err == nil {
		t.Fatal("enqueue with a wrong password succeeded")
	}
	f := newFixture(t, simulator.Config{})
	p, err := producer.Dial(r.URL, producer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	f.redis, f.prod = r, p
	if err := p.Enqueue(ctx, "auth", request("a1", "", time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	tp, err := rss.Factory([]byte(`{"batch_size":10}`), transport.Env{RedisURL: r.URL})
	if err != nil {
		t.Fatal(err)
	}
	f.runApp(tp.(*rss.Transport), "auth", "auth:results", 4)
	if got := f.collect("auth:results", 1, 10*time.Second); !got["a1"].OK() {
		t.Fatalf("result %+v", got["a1"])
	}
}

func TestFactoryRejectsUnknownOptions(t *testing.T) {
	for _, tc := range []struct {
		name, opts string
		ok         bool
	}{
		{"empty", ``, true},
		{"legacy", `{"poll_interval_ms":1000,"batch_size":10}`, true},
		{"unknown", `{"bogus":1}`, false},
		{"heartbeat above lease", `{"lease_ms":1000,"heartbeat_ms":2000}`, false},
		{"flat retry name (upstream)", `{"retry_queue_name":"retry-sortedset"}`, true},
		{"tls without rediss", `{"tls_insecure_skip_verify":true}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp, err := rss.Factory([]byte(tc.opts), transport.Env{RedisURL: "redis://127.0.0.1:1/0"})
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
			if tp != nil {
				_ = tp.Close()
			}
		})
	}
	tp, err := rss.Factory([]byte(`{"tls_insecure_skip_verify":true}`), transport.Env{RedisURL: "rediss://u:p@127.0.0.1:1/0"})
	if err != nil {
		t.Fatalf("rediss with TLS options: %v", err)
	}
	_ = tp.Close()
}
