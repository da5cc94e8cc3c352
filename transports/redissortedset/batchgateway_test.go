package redissortedset_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// The newest batch-gateway's processor as a consumer of sluice (see
// BATCH-GATEWAY.md §1 and §3 in the project notes): each processor replica
// enqueues through upstream's producer with its own result list
// <base>:<hostname>, reads its results with upstream's durable result
// delivery (ReceiveResult: results claimed into <list>:result-* keys, acked
// once written, de-duplicated by id and request_token), and cancels by
// copying request-active:<id> to request-cancel:<id>. The receive and ack
// scripts are written from the documented semantics of upstream's
// producer/redis_result_delivery.go.

// bgReceive is ReceiveResult's script: requeue expired result claims, purge
// expired tombstones, then claim the oldest result that is neither
// tombstoned nor claimed (duplicates are dropped).
//
//	KEYS: list, result-claimed, result-claim-owners, result-claims-idx, result-ack-tombstones
//	ARGV: owner, lease ms
var bgReceive = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local exp = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 100)
for _, cid in ipairs(exp) do
  local p = redis.call('HGET', KEYS[2], cid)
  if p then redis.call('RPUSH', KEYS[1], p) end
  redis.call('HDEL', KEYS[2], cid)
  redis.call('HDEL', KEYS[3], cid)
  redis.call('ZREM', KEYS[4], cid)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local n = math.min(redis.call('LLEN', KEYS[1]), 100)
for i = 1, n do
  local e = redis.call('LINDEX', KEYS[1], -1)
  if not e then break end
  local ok, v = pcall(cjson.decode, e)
  if not ok or type(v) ~= 'table' or type(v.id) ~= 'string' or v.id == '' or (v.request_token ~= nil and type(v.request_token) ~= 'string') then
    redis.call('RPOP', KEYS[1])
    local cid = '\0unparsable-result\0' .. ARGV[1]
    redis.call('HSET', KEYS[2], cid, e)
    redis.call('HSET', KEYS[3], cid, ARGV[1])
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), cid)
    return {-1, e, cid}
  end
  local cid = v.id
  if v.request_token then cid = cid .. '\0' .. v.request_token end
  local tomb = redis.call('ZSCORE', KEYS[5], cid)
  redis.call('RPOP', KEYS[1])
  if not (tomb and tonumber(tomb) > now) and redis.call('HEXISTS', KEYS[2], cid) == 0 then
    redis.call('HSET', KEYS[2], cid, e)
    redis.call('HSET', KEYS[3], cid, ARGV[1])
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), cid)
    return {1, e, cid}
  end
end
return {0}
`)

// bgAck is the durable ack: owner-fenced and unexpired → tombstone (7 d).
var bgAck = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tomb = redis.call('ZSCORE', KEYS[4], ARGV[1])
if tomb and tonumber(tomb) > now then return 2 end
local exp = redis.call('ZSCORE', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] or not exp or tonumber(exp) <= now then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[4], now + 604800000, ARGV[1])
redis.call('PEXPIRE', KEYS[4], 604800000)
return 1
`)

// bgCancel is the processor's cancel (upstream's producer CancelRequests).
var bgCancel = redis.NewScript(`
local active = redis.call('GET', KEYS[1])
if not active then return 0 end
redis.call('SET', KEYS[2], active, 'EX', 604800)
return 1
`)

// bgProcessor is one processor replica: its producer and its durable reader.
type bgProcessor struct {
	c     redis.UniversalClient
	list  string
	owner string
	lease time.Duration
	up    upProducer
}

func (p *bgProcessor) resultKeys() []string {
	return []string{p.list, p.list + ":result-claimed", p.list + ":result-claim-owners", p.list + ":result-claims-idx", p.list + ":result-ack-tombstones"}
}

// receive claims one result (nil when none).
func (p *bgProcessor) receive(t *testing.T) (map[string]any, string) {
	t.Helper()
	raw, err := bgReceive.Run(context.Background(), p.c, p.resultKeys(), p.owner, p.lease.Milliseconds()).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := raw[0].(int64); st != 1 {
		if st == -1 {
			t.Fatalf("unparsable result %v", raw[1])
		}
		return nil, ""
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw[1].(string)), &m); err != nil {
		t.Fatal(err)
	}
	return m, raw[2].(string)
}

func (p *bgProcessor) ack(t *testing.T, cid string) int64 {
	t.Helper()
	ks := p.resultKeys()
	n, err := bgAck.Run(context.Background(), p.c, ks[1:], cid, p.owner).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (p *bgProcessor) cancel(t *testing.T, id string) {
	t.Helper()
	if err := bgCancel.Run(context.Background(), p.c, []string{"request-active:" + id, "request-cancel:" + id}).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestBatchGatewayConsumer(t *testing.T) {
	f, gw := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, base, perReplica = "llm-d-async:requests:bg", "llm-d-async:results:bg", 40
	procs := make([]*bgProcessor, 2)
	for i := range procs {
		list := fmt.Sprintf("%s:processor-%d", base, i)
		procs[i] = &bgProcessor{c: c, list: list, owner: randHex(t, 16), lease: 700 * time.Millisecond,
			up: upProducer{c: c, queue: q, results: list}}
	}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	listOf := map[string]int{}
	cancelled := map[string]bool{}
	for i := range perReplica {
		for r, p := range procs {
			id := fmt.Sprintf("bg-%d-%02d", r, i)
			tokens[id] = p.up.submit(t, id, dl, payloadFor(id))
			listOf[id] = r
			if i%10 == 3 {
				p.cancel(t, id)
				cancelled[id] = true
			}
		}
	}
	tp := f.transport(rss.Options{PollIntervalMS: 20})
	stop := f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: q, ResultTTLSeconds: 600}, IGWBaseURL: f.sim}}, base, 8)
	defer stop()
	// result_ttl_seconds: every push gives the list its expiry.
	waitResults(t, c, procs[0].list, 1, 10*time.Second)
	if ttl := c.TTL(ctx, procs[0].list).Val(); ttl <= 0 || ttl > 600*time.Second {
		t.Errorf("%s: ttl %s, want result_ttl_seconds 600", procs[0].list, ttl)
	}

	// Each processor reads only its own list; processor 1 dies once
	// holding three results, unacked: they come back after its lease.
	var held []string
	seen := readResults(t, procs, listOf, len(tokens), 20*time.Second, func(r int, id string, m map[string]any) bool {
		if r == 1 && len(held) < 3 {
			held = append(held, id) // the replica dies before acking
			return false
		}
		checkBGResult(t, m, tokens[id], cancelled[id])
		return true
	})
	if len(seen) != len(tokens) {
		t.Fatalf("the processors read %d of %d results", len(seen), len(tokens))
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s read %d times", id, n)
		}
	}
	calls, _ := gw.counts()
	for id := range tokens {
		want := 1
		if cancelled[id] {
			want = 0
		}
		if calls[id] != want {
			t.Errorf("%s dispatched %d times, want %d", id, calls[id], want)
		}
		if n := c.Exists(ctx, "request-active:"+id, "request-cancel:"+id).Val(); n != 0 {
			t.Errorf("%s: %d of upstream's request keys left after its result", id, n)
		}
	}
	for _, p := range procs {
		// The durable reader's keys are its own: after every ack nothing is
		// claimed, one tombstone per result, and no expiry but its own.
		ks := p.resultKeys()
		if n := c.Exists(ctx, ks[1], ks[2], ks[3]).Val(); n != 0 {
			t.Errorf("%s: %d claim keys left", p.list, n)
		}
		if n := c.ZCard(ctx, ks[4]).Val(); n != perReplica {
			t.Errorf("%s: %d tombstones, want %d", p.list, n, perReplica)
		}
	}
	if c.Exists(ctx, base).Val() != 0 {
		t.Errorf("results went to the default list %s", base)
	}
}

// readResults has each processor read its own list until n results were
// acked or d passed: each result is checked to be in the list of its
// processor (listOf), then handed to use, which says whether to ack it (a
// result not acked is held by a replica about to die). It returns how many
// times each id was acked.
func readResults(t *testing.T, procs []*bgProcessor, listOf map[string]int, n int, d time.Duration, use func(r int, id string, m map[string]any) bool) map[string]int {
	t.Helper()
	seen := map[string]int{}
	end := time.Now().Add(d)
	for len(seen) < n && time.Now().Before(end) {
		idle := true
		for r, p := range procs {
			m, cid := p.receive(t)
			if m == nil {
				continue
			}
			idle = false
			id, _ := m["id"].(string)
			if listOf[id] != r {
				t.Errorf("%s arrived in %s", id, p.list)
			}
			if !use(r, id, m) {
				continue
			}
			if got := p.ack(t, cid); got != 1 {
				t.Errorf("ack of %s: %d", id, got)
			}
			seen[id]++
		}
		if idle {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return seen
}

// checkBGResult checks a result as the processor classifies it.
func checkBGResult(t *testing.T, m map[string]any, token string, cancelled bool) {
	t.Helper()
	id := m["id"]
	if m["request_token"] != token {
		t.Errorf("%s: request_token %v, want %s", id, m["request_token"], token)
	}
	if _, ok := m["payload"].(string); !ok {
		t.Errorf("%s: payload %T, want a string", id, m["payload"])
	}
	if cancelled {
		if m["error_code"] != "CANCELLED" || m["status_code"] != nil {
			t.Errorf("%s: %v, want CANCELLED without status_code", id, m)
		}
		return
	}
	if m["status_code"] != float64(200) || m["error_code"] != nil {
		t.Errorf("%s: %v, want status_code 200", id, m)
	}
}

func TestPayloadKeys(t *testing.T) {
	f, gw := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results = "llm-d-async:requests:pk", "llm-d-async:results:pk"
	up := upProducer{c: c, queue: q, results: results, payloadKeys: true}
	dl := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	for i := range 10 {
		id := fmt.Sprintf("pk-up-%d", i)
		tokens[id] = up.submit(t, id, dl, payloadFor(id))
	}
	// sluice's producer writes payload keys too.
	sp := producer.New(c, producer.Config{Envelope: true, PayloadKeys: true, ResultQueueName: results})
	for i := range 5 {
		id := fmt.Sprintf("pk-sl-%d", i)
		r := request(id, "", time.Hour, nil)
		r.Payload = json.RawMessage(payloadFor(id))
		if err := sp.Enqueue(ctx, q, r); err != nil {
			t.Fatal(err)
		}
		tokens[id] = c.Get(ctx, "request-active:"+id).Val()
	}
	for id, tok := range tokens {
		if v := c.Get(ctx, "request-payload:"+id+":"+tok).Val(); v != payloadFor(id) {
			t.Fatalf("%s: payload key holds %q", id, v)
		}
	}
	for _, z := range c.ZRange(ctx, q, 0, -1).Val() {
		var e upEnvelope
		if err := json.Unmarshal([]byte(z), &e); err != nil || string(e.Data.Payload) != "null" || e.Internal.PayloadRef == "" {
			t.Fatalf("member %s: want payload null and a payload_ref (%v)", z, err)
		}
	}
	// One payload expired before it was claimed; one request is retried
	// (its retry waits without the payload, which is read again).
	gone := "pk-up-3"
	c.Del(ctx, "request-payload:"+gone+":"+tokens[gone])
	// An expired request whose payload key is gone too is answered
	// DEADLINE_EXCEEDED, as upstream does (it reads no payload for it).
	expired := "pk-expired"
	tokens[expired] = up.submit(t, expired, time.Now().Unix()-10, payloadFor(expired))
	c.Del(ctx, "request-payload:"+expired+":"+tokens[expired])
	gw.mu.Lock()
	gw.fail["pk-up-5"] = 1
	gw.mu.Unlock()

	tp := f.transport(rss.Options{PollIntervalMS: 20})
	stop := f.runApp(tp, q, results, 4)
	waitResults(t, c, results, len(tokens), 15*time.Second)
	stop()
	byID := checkAnsweredOnce(t, c, results, tokens)
	for id, r := range byID {
		if id == gone {
			if r["error_code"] != "PAYLOAD_UNAVAILABLE" || r["error_message"] != "request payload is missing" {
				t.Errorf("%s: %v, want PAYLOAD_UNAVAILABLE", id, r)
			}
			continue
		}
		if id == expired {
			if r["error_code"] != "DEADLINE_EXCEEDED" || r["error_message"] != "deadline exceeded" || r["status_code"] != nil {
				t.Errorf("%s: %v, want DEADLINE_EXCEEDED", id, r)
			}
			continue
		}
		if r["status_code"] != float64(200) {
			t.Errorf("%s: %v, want 200", id, r)
		}
	}
	calls, _ := gw.counts()
	for id := range tokens {
		want := 1
		switch id {
		case gone, expired:
			want = 0
		case "pk-up-5":
			want = 2
		}
		if calls[id] != want {
			t.Errorf("%s reached the gateway %d times with its payload, want %d", id, calls[id], want)
		}
		if n := c.Exists(ctx, "request-payload:"+id+":"+tokens[id]).Val(); n != 0 {
			t.Errorf("%s: payload key left after its result", id)
		}
	}
}
