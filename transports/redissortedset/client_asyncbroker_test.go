package redissortedset_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The client suite of llm-d-router's coordinator step async-broker
// (CLIENTS.md §1): it enqueues through llm-d-async's Go producer v0.9.0 an
// api.RedisRequest (upstreamEnvelope, takeover_test.go) whose id is <tenant>:<client id>, whose result queue is
// a mailbox per request, results:req:<tenant>:<id>, and whose metadata
// names the tenant; it reads the mailbox without consuming it, wakes on the
// mailbox's keyspace notification (the lpush of the result), takes "still
// pending" from EXISTS request-active:<id>, cancels by copying
// request-active to request-cancel, and revives a cancelled copy still
// queued by deleting request-cancel while it equals request-active. The
// deployment follows its rules: the queue sets result_ttl_seconds and no
// result_queue_name.

// brokerRevive is the broker's un-cancel: request-cancel:<id> is deleted
// only while it holds the token of request-active:<id>.
//
//	KEYS: request-active:<id>, request-cancel:<id>
var brokerRevive = redis.NewScript(`
local active = redis.call('GET', KEYS[1])
if active and redis.call('GET', KEYS[2]) == active then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
`)

// broker is the async-broker's side of one Redis.
type broker struct {
	c     redis.UniversalClient
	queue string
}

// mailbox is the result queue of request id.
func mailbox(id string) string { return "results:req:" + id }

// submit enqueues tenant's request cid, due in timeout, for endpoint, as
// the producer v0.9 does (request-active:<id> set to a fresh token until
// the deadline, the envelope scored by its deadline; see takeover_test.go),
// and returns its id, token and deadline.
func (b broker) submit(t testing.TB, tenant, cid, endpoint string, timeout time.Duration) (string, string, time.Time) {
	t.Helper()
	id := tenant + ":" + cid
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	token := hex.EncodeToString(raw)
	dl := time.Unix(time.Now().Add(timeout).Unix(), 0)
	jb, err := json.Marshal(upstreamEnvelope{
		Internal:    upstreamRouting{RequestToken: token, RequestQueueName: b.queue, ResultQueueName: mailbox(id)},
		RequestKind: "redis",
		Data: upstreamRedisRequest{ID: id, Created: time.Now().Unix(), Deadline: dl.Unix(), Payload: json.RawMessage(payloadFor(id)),
			Metadata: map[string]string{"userid": tenant}, Headers: map[string]string{"x-llm-d-slo-ttft-ms": "500"},
			Endpoint: endpoint, RequestQueueName: b.queue, ResultQueueName: mailbox(id)},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := b.c.Set(ctx, "request-active:"+id, token, time.Until(dl)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.c.ZAdd(ctx, b.queue, redis.Z{Score: float64(dl.Unix()), Member: string(jb)}).Err(); err != nil {
		t.Fatal(err)
	}
	return id, token, dl
}

// cancel is the broker's DELETE /v1/requests/{id}: request-active copied to
// request-cancel.
func (b broker) cancel(t testing.TB, id string) {
	t.Helper()
	if err := bgCancel.Run(context.Background(), b.c, []string{"request-active:" + id, "request-cancel:" + id}).Err(); err != nil {
		t.Fatal(err)
	}
}

// revive is the broker's reattachRetry of a copy still queued; it reports
// whether the cancel marker was deleted.
func (b broker) revive(t testing.TB, id string) bool {
	t.Helper()
	n, err := brokerRevive.Run(context.Background(), b.c, []string{"request-active:" + id, "request-cancel:" + id}).Int()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// pendingChecker polls, as the broker's fetch does, that every request it
// watches is pending (request-active:<id> exists) or answered (its mailbox
// holds the result): a moment with neither would answer the client
// "unknown". Both are read in one MULTI, so they are one moment. Once a
// request's deadline passed it is not checked: the producer gives
// request-active:<id> the deadline as its expiry.
type pendingChecker struct {
	c       redis.UniversalClient
	mu      sync.Mutex
	watched []string
	due     map[string]time.Time
	bad     map[string]int
	polls   int
	stop    chan struct{}
	done    chan struct{}
}

func newPendingChecker(c redis.UniversalClient) *pendingChecker {
	p := &pendingChecker{c: c, bad: map[string]int{}, due: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

// watch adds id (enqueued: its request-active key is written), due at dl.
func (p *pendingChecker) watch(id string, dl time.Time) {
	p.mu.Lock()
	p.watched = append(p.watched, id)
	p.due[id] = dl
	p.mu.Unlock()
}

func (p *pendingChecker) run() {
	defer close(p.done)
	ctx := context.Background()
	for {
		select {
		case <-p.stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		start := time.Now()
		p.mu.Lock()
		ids := make([]string, 0, len(p.watched))
		for _, id := range p.watched {
			if start.Add(100 * time.Millisecond).Before(p.due[id]) { // a poll takes well under that
				ids = append(ids, id)
			}
		}
		p.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		active := make([]*redis.IntCmd, len(ids))
		boxed := make([]*redis.IntCmd, len(ids))
		_, err := p.c.TxPipelined(ctx, func(pl redis.Pipeliner) error {
			for i, id := range ids {
				active[i] = pl.Exists(ctx, "request-active:"+id)
				boxed[i] = pl.LLen(ctx, mailbox(id))
			}
			return nil
		})
		if err != nil {
			continue
		}
		p.mu.Lock()
		p.polls++
		for i, id := range ids {
			if active[i].Val() == 0 && boxed[i].Val() == 0 {
				p.bad[id]++
			}
		}
		p.mu.Unlock()
	}
}

// close stops the checker and returns the ids seen neither pending nor
// answered, and how many polls ran.
func (p *pendingChecker) close() (map[string]int, int) {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bad, p.polls
}

// keyspaceEvents records the keyspace notifications of the mailboxes.
type keyspaceEvents struct {
	mu     sync.Mutex
	events map[string][]string
}

func listenMailboxes(t *testing.T, c redis.UniversalClient) *keyspaceEvents {
	t.Helper()
	ctx := context.Background()
	if err := c.ConfigSet(ctx, "notify-keyspace-events", "Kl").Err(); err != nil {
		t.Fatal(err)
	}
	sub := c.PSubscribe(ctx, "__keyspace@0__:results:req:*")
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	k := &keyspaceEvents{events: map[string][]string{}}
	ch := sub.Channel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			key := strings.TrimPrefix(m.Channel, "__keyspace@0__:")
			k.mu.Lock()
			k.events[key] = append(k.events[key], m.Payload)
			k.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = sub.Close(); <-done })
	return k
}

func (k *keyspaceEvents) of(key string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.events[key]...)
}

// brokerWant is what the broker expects of one request.
type brokerWant int

const (
	wantAnswered brokerWant = iota
	wantCancelled
	wantEither
	wantDeadline
)

func TestClientAsyncBroker(t *testing.T) {
	f, gw := cutoverFixture(t, 20*time.Millisecond)
	c := f.prod.Client()
	ctx := context.Background()
	const ttl = 600
	b := broker{c: c, queue: "async:m:acme"}
	events := listenMailboxes(t, c)
	checker := newPendingChecker(c)
	want := map[string]brokerWant{}
	tokens := map[string]string{}
	endpoint := map[string]string{}
	var mu sync.Mutex
	add := func(id, token string, dl time.Time, ep string, w brokerWant) {
		mu.Lock()
		want[id], tokens[id], endpoint[id] = w, token, ep
		mu.Unlock()
		checker.watch(id, dl)
	}
	// Queued before sluice starts: answered, cancelled, and cancelled then
	// revived before sluice decides.
	for i := range 30 {
		ep := "/v1/chat/completions"
		if i%3 == 0 {
			ep = "/v1/completions"
		}
		tenant := []string{"acme", "globex"}[i%2]
		id, tok, dl := b.submit(t, tenant, fmt.Sprintf("req-%02d", i), ep, time.Hour)
		add(id, tok, dl, ep, wantAnswered)
	}
	for i := range 6 {
		id, tok, dl := b.submit(t, "acme", fmt.Sprintf("drop-%02d", i), "/v1/chat/completions", time.Hour)
		b.cancel(t, id)
		add(id, tok, dl, "", wantCancelled)
	}
	for i := range 6 {
		id, tok, dl := b.submit(t, "globex", fmt.Sprintf("revive-%02d", i), "/v1/chat/completions", time.Hour)
		b.cancel(t, id)
		if !b.revive(t, id) {
			t.Fatalf("%s: the revive found no cancel marker to delete", id)
		}
		add(id, tok, dl, "/v1/chat/completions", wantAnswered)
	}
	// A deadline that passes during the call, and a request timeout that
	// ends every call until the deadline passes: DEADLINE_EXCEEDED both.
	gw.mu.Lock()
	gw.delays["acme:slow-deadline"] = 30 * time.Second
	gw.delays["acme:slow-timeout"] = 30 * time.Second
	gw.mu.Unlock()
	f.tune = func(cfg *config.Config) { cfg.RequestTimeout = config.Duration(1500 * time.Millisecond) }
	tp := f.transport(rss.Options{PollIntervalMS: 20})
	f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: b.queue, ResultTTLSeconds: ttl}, IGWBaseURL: f.sim}}, "async:results", 8)
	id, tok, dl := b.submit(t, "acme", "slow-deadline", "/v1/chat/completions", 2*time.Second)
	add(id, tok, dl, "/v1/chat/completions", wantDeadline)
	id, tok, dl = b.submit(t, "acme", "slow-timeout", "/v1/chat/completions", 4*time.Second)
	add(id, tok, dl, "/v1/chat/completions", wantDeadline)
	// Cancels racing the claim: submitted and cancelled at once while
	// sluice runs; one result each, either kind.
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, tok, dl := b.submit(t, "globex", fmt.Sprintf("race-%02d", i), "/v1/chat/completions", time.Hour)
			add(id, tok, dl, "/v1/chat/completions", wantEither)
			time.Sleep(time.Duration(i%4) * time.Millisecond)
			b.cancel(t, id)
		}()
	}
	wg.Wait()

	end := time.Now().Add(20 * time.Second)
	for _, id := range sortedKeys(want) {
		for c.LLen(ctx, mailbox(id)).Val() == 0 {
			if time.Now().After(end) {
				t.Fatalf("%s: no result in %s (queue %s)", id, mailbox(id), f.depth(b.queue))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(300 * time.Millisecond) // a second result would be pushed by now
	bad, polls := checker.close()
	calls, _ := gw.counts()
	kinds := map[string]int{}
	for _, id := range sortedKeys(want) {
		box := mailbox(id)
		vs := c.LRange(ctx, box, 0, -1).Val()
		if len(vs) != 1 {
			t.Errorf("%s: %d results, want 1", box, len(vs))
			continue
		}
		var r map[string]any
		if err := json.Unmarshal([]byte(vs[0]), &r); err != nil {
			t.Fatalf("%s: %v", box, err)
		}
		if r["id"] != id || r["request_token"] != tokens[id] {
			t.Errorf("%s: id %v token %v, want %s %s", box, r["id"], r["request_token"], id, tokens[id])
		}
		if ttl := c.TTL(ctx, box).Val(); ttl <= 0 || ttl > 600*time.Second {
			t.Errorf("%s: TTL %s, want result_ttl_seconds 600", box, ttl)
		}
		if ev := events.of(box); !slices.Contains(ev, "lpush") {
			t.Errorf("%s: keyspace events %v, want the lpush", box, ev)
		}
		if n := c.Exists(ctx, "request-active:"+id, "request-cancel:"+id).Val(); n != 0 {
			t.Errorf("%s: %d of its request keys left after the result", id, n)
		}
		code, _ := r["error_code"].(string)
		_, hasStatus := r["status_code"]
		switch w := want[id]; {
		case w == wantAnswered || (w == wantEither && code == ""):
			if r["status_code"] != float64(200) || code != "" {
				t.Errorf("%s: %v, want the gateway's 200", id, r)
			}
			if calls[id] != 1 {
				t.Errorf("%s: %d gateway calls, want 1", id, calls[id])
			}
			gw.mu.Lock()
			path := gw.paths[id]
			gw.mu.Unlock()
			if path != endpoint[id] {
				t.Errorf("%s: called %s, want its endpoint %s", id, path, endpoint[id])
			}
			kinds["answered"]++
		case w == wantCancelled || w == wantEither:
			if code != "CANCELLED" || hasStatus {
				t.Errorf("%s: %v, want CANCELLED without status_code", id, r)
			}
			if w == wantCancelled && calls[id] != 0 {
				t.Errorf("%s: cancelled while queued, yet %d gateway calls", id, calls[id])
			}
			kinds["cancelled"]++
		case w == wantDeadline:
			if code != "DEADLINE_EXCEEDED" || hasStatus {
				t.Errorf("%s: %v, want DEADLINE_EXCEEDED without status_code", id, r)
			}
			kinds["deadline"]++
		}
	}
	for id, n := range bad {
		t.Errorf("%s: seen %d times with neither request-active nor a result", id, n)
	}
	if polls < 10 {
		t.Errorf("the pending checker polled %d times", polls)
	}
	if n := c.Exists(ctx, "async:results").Val(); n != 0 {
		t.Errorf("results went to the deployment's default list")
	}
	t.Logf("%d requests: %v; pending checker: %d polls", len(want), kinds, polls)
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
