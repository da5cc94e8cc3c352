package redissortedset_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A test-only upstream llm-d-async replica: its producer's enqueue and its
// sorted-set dispatcher's claims, re-implemented from the facts of
// upstream's pkg/redis/claim.go, sortedset_impl.go and
// producer/redis_sortedset_producer.go (main at #491; see
// UPSTREAM-v0.10.md §1 and §3 in the project notes). The Lua below is
// written from the documented semantics, not copied, and the Go around it
// does what upstream's does: peek, claim each entry with its own script
// call, dispatch, ack with the owner-fenced ACKRESULT; a heartbeat renews
// its claims; a reclaimer returns expired claims (anyone's) to the queue.

// upstreamSubmit is upstream's submitRequestScript (standalone): a sequence
// per (queue, deadline), the cancellation and active keys, the member with
// the sequence spliced in, scored deadline + min(seq, 2^21-1)/2^21, and the
// payload key when the payload is kept apart.
//
//	KEYS: request-seq:<q>:<deadline>, request-cancel:<id>, request-active:<id>, <q>[, request-payload:<id>:<token>]
//	ARGV: token, activeTTLms, seqExpireAt, jsonBefore, jsonAfter, deadline[, payload, payloadTTLms]
var upstreamSubmit = redis.NewScript(`
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIREAT', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2])
local s = seq
if s > 2097151 then s = 2097151 end
local score = tonumber(ARGV[6]) + s / 2097152
redis.call('ZADD', KEYS[4], string.format('%.17g', score), ARGV[4] .. seq .. ARGV[5])
if KEYS[5] then redis.call('SET', KEYS[5], ARGV[7], 'PX', ARGV[8]) end
return seq
`)

// upstreamClaimScript is CLAIM: the ZREM of the exact member decides.
var upstreamClaimScript = redis.NewScript(`
if redis.call('ZREM', KEYS[1], ARGV[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
return 1
`)

// upstreamAckScript is ACKRESULT (single slot), fenced by the owner token.
var upstreamAckScript = redis.NewScript(`
local owner = redis.call('HGET', KEYS[2], ARGV[1])
if not owner or owner ~= ARGV[3] or ARGV[3] == '' then return 0 end
redis.call('LPUSH', KEYS[4], ARGV[2])
if tonumber(ARGV[4]) > 0 then redis.call('EXPIRE', KEYS[4], ARGV[4]) end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if KEYS[5] then redis.call('DEL', KEYS[5]) end
return 1
`)

// upstreamRenewScript is RENEWCLAIM.
var upstreamRenewScript = redis.NewScript(`
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[3] then
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
`)

// upstreamReclaimScript is RECLAIMIFEXPIRED.
var upstreamReclaimScript = redis.NewScript(`
local exp = redis.call('ZSCORE', KEYS[4], ARGV[1])
if not exp then return 0 end
if tonumber(exp) > tonumber(ARGV[3]) then return 0 end
local payload = redis.call('HGET', KEYS[2], ARGV[1])
if not payload then redis.call('ZREM', KEYS[4], ARGV[1]) return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], payload)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
`)

// upProducer is upstream's producer (RedisSortedSetProducer with an
// enqueue sequence, optionally WithPayloadKeys).
type upProducer struct {
	c           redis.UniversalClient
	queue       string
	results     string
	payloadKeys bool
	cluster     bool // mode cluster: enqueueCluster's writes
	// endpoint is data.endpoint (the batch-gateway writes its line's URL).
	endpoint string
}

// upInternal is upstream's api.InternalRouting after #463/#458, in its
// field order (the producer fills what it knows).
type upInternal struct {
	RetryCount            int    `json:"retry_count,omitempty"`
	QueueID               string `json:"queue_id,omitempty"`
	RequestToken          string `json:"request_token,omitempty"`
	RequestQueueName      string `json:"request_queue_name,omitempty"`
	ResultQueueName       string `json:"result_queue_name,omitempty"`
	ResultTTLSeconds      int64  `json:"result_ttl_seconds,omitempty"`
	ResultRoutingResolved bool   `json:"result_routing_resolved,omitempty"`
	EnqueueSeq            int64  `json:"enqueue_seq,omitempty"`
	PayloadRef            string `json:"payload_ref,omitempty"`
}

type upData struct {
	ID       string          `json:"id"`
	Created  int64           `json:"created"`
	Deadline int64           `json:"deadline"`
	Payload  json.RawMessage `json:"payload"`
	Endpoint string          `json:"endpoint,omitempty"`
}

type upEnvelope struct {
	Internal    upInternal `json:"internal"`
	RequestKind string     `json:"request_kind"`
	Data        upData     `json:"data"`
}

func randHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// upstreamEnqueueCluster is upstream's enqueueRequestScript (mode
// cluster): the sequence and the member only, both in the queue's slot
// (request-seq:{<q>}:<deadline>); the per-request keys are written apart
// before it (enqueueCluster's pipeline).
//
//	KEYS: request-seq:{<q>}:<deadline>, <q>
//	ARGV: seqExpireAt, jsonBefore, jsonAfter, deadline
var upstreamEnqueueCluster = redis.NewScript(`
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIREAT', KEYS[1], ARGV[1])
local s = seq
if s > 2097151 then s = 2097151 end
local score = tonumber(ARGV[4]) + s / 2097152
redis.call('ZADD', KEYS[2], string.format('%.17g', score), ARGV[2] .. seq .. ARGV[3])
return seq
`)

// submit enqueues id with deadline dl (whole seconds) and payload, as
// upstream's producer does, and returns the token.
func (p upProducer) submit(t testing.TB, id string, dl int64, payload string) string {
	t.Helper()
	token, err := p.submitErr(context.Background(), id, dl, payload)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// submitErr is submit returning its error; with p.cluster it writes as
// upstream's producer in cluster mode does (enqueueCluster).
func (p upProducer) submitErr(ctx context.Context, id string, dl int64, payload string) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := hex.EncodeToString(b)
	env := upEnvelope{
		Internal:    upInternal{RequestToken: token, RequestQueueName: p.queue, ResultQueueName: p.results, EnqueueSeq: -1},
		RequestKind: "plain",
		Data:        upData{ID: id, Created: time.Now().Unix(), Deadline: dl, Payload: json.RawMessage(payload), Endpoint: p.endpoint},
	}
	seqKey := fmt.Sprintf("request-seq:%s:%d", p.queue, dl)
	if p.cluster {
		seqKey = fmt.Sprintf("request-seq:{%s}:%d", p.queue, dl)
	}
	ks := []string{seqKey, "request-cancel:" + id, "request-active:" + id, p.queue}
	payloadKey := ""
	if p.payloadKeys {
		payloadKey = "request-payload:" + id + ":" + token
		env.Internal.PayloadRef = payloadKey
		env.Data.Payload = json.RawMessage("null")
		ks = append(ks, payloadKey)
	}
	jb, err := json.Marshal(env)
	if err != nil {
		return "", err
	}
	before, after, ok := strings.Cut(string(jb), `"enqueue_seq":-1`)
	if !ok {
		return "", fmt.Errorf("no sequence placeholder in %s", jb)
	}
	activeMS := max(time.Until(time.Unix(dl, 0)).Milliseconds(), 1)
	if p.cluster {
		_, err := p.c.Pipelined(ctx, func(pl redis.Pipeliner) error {
			pl.Del(ctx, "request-cancel:"+id)
			pl.Set(ctx, "request-active:"+id, token, time.Duration(activeMS)*time.Millisecond)
			if payloadKey != "" {
				pl.Set(ctx, payloadKey, payload, time.Duration(activeMS+600000)*time.Millisecond)
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("upstream enqueue of %s (cluster, its keys): %w", id, err)
		}
		if err := upstreamEnqueueCluster.Run(ctx, p.c, []string{seqKey, p.queue}, dl+3600, before+`"enqueue_seq":`, after, dl).Err(); err != nil {
			return "", fmt.Errorf("upstream enqueue of %s (cluster): %w", id, err)
		}
		return token, nil
	}
	args := []any{token, activeMS, dl + 3600, before + `"enqueue_seq":`, after, dl}
	if p.payloadKeys {
		args = append(args, payload, activeMS+600000)
	}
	if err := upstreamSubmit.Run(ctx, p.c, ks, args...).Err(); err != nil {
		return "", fmt.Errorf("upstream enqueue of %s: %w", id, err)
	}
	return token, nil
}

// upQueueScore is upstream's api.QueueScore of a member.
func upQueueScore(member string) string {
	var e upEnvelope
	if json.Unmarshal([]byte(member), &e) != nil {
		return "0"
	}
	seq := min(max(e.Internal.EnqueueSeq, 0), 2097151)
	return strconv.FormatFloat(float64(e.Data.Deadline)+float64(seq)/2097152, 'g', 17, 64)
}

// upReplica is one upstream dispatcher replica on one queue.
type upReplica struct {
	t        testing.TB
	c        redis.UniversalClient
	queue    string
	owner    string        // 16 hex digits, per process
	lease    time.Duration // claim_lease_ttl_seconds
	dispatch func(id string, payload json.RawMessage)

	mu      sync.Mutex
	handles map[string]string // claim id -> member
}

func newUpReplica(t testing.TB, c redis.UniversalClient, queue string, lease time.Duration, dispatch func(string, json.RawMessage)) *upReplica {
	return &upReplica{t: t, c: c, queue: queue, owner: randHex(t, 8), lease: lease, dispatch: dispatch, handles: map[string]string{}}
}

func (u *upReplica) keys() (claimed, owners, idx string) {
	return u.queue + ":claimed", u.queue + ":claim-owners", u.queue + ":claims-idx"
}

func claimIDOf(e upEnvelope) string {
	if e.Internal.RequestToken == "" {
		return e.Data.ID
	}
	return e.Data.ID + "\x00" + e.Internal.RequestToken
}

// claimSome peeks batch entries and claims them; it returns the claimed
// (claim id, envelope, member) without dispatching them.
func (u *upReplica) claimSome(ctx context.Context, batch int) []upClaim {
	zs, err := u.c.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: u.queue, ByScore: true, Start: "-inf", Stop: "+inf", Count: int64(batch)}).Result()
	if err != nil {
		return nil
	}
	claimed, owners, idx := u.keys()
	var out []upClaim
	for _, z := range zs {
		m, _ := z.Member.(string)
		var e upEnvelope
		if json.Unmarshal([]byte(m), &e) != nil || e.Data.ID == "" {
			u.c.ZRem(ctx, u.queue, m) // upstream drops what it cannot parse
			continue
		}
		ck := claimIDOf(e)
		exp := math.Min(float64(time.Now().Add(u.lease).UnixMilli())/1000, float64(e.Data.Deadline+300))
		n, err := upstreamClaimScript.Run(ctx, u.c, []string{u.queue, claimed, owners, idx}, ck, m, u.owner, exp).Int()
		if err != nil || n == 0 {
			continue // another consumer took it
		}
		u.mu.Lock()
		u.handles[ck] = m
		u.mu.Unlock()
		out = append(out, upClaim{ck: ck, env: e, member: m})
	}
	return out
}

type upClaim struct {
	ck     string
	env    upEnvelope
	member string
}

// tick is one dispatch round: claim, fetch payload keys, dispatch, ack.
func (u *upReplica) tick(ctx context.Context, batch int) int {
	cs := u.claimSome(ctx, batch)
	claimed, owners, idx := u.keys()
	for _, c := range cs {
		payload := c.env.Data.Payload
		if ref := c.env.Internal.PayloadRef; ref != "" {
			v, err := u.c.Get(ctx, ref).Result()
			if err != nil {
				u.t.Errorf("upstream replica: payload %s: %v", ref, err)
				continue
			}
			payload = json.RawMessage(v)
		}
		u.dispatch(c.env.Data.ID, payload)
		res, _ := json.Marshal(map[string]any{"id": c.env.Data.ID, "status_code": 200, "payload": `{"ok":true}`, "request_token": c.env.Internal.RequestToken})
		list := c.env.Internal.ResultQueueName
		ks := []string{claimed, owners, idx, list}
		if c.env.Internal.PayloadRef != "" {
			ks = append(ks, c.env.Internal.PayloadRef)
		}
		if err := upstreamAckScript.Run(ctx, u.c, ks, c.ck, string(res), u.owner, 0).Err(); err != nil {
			u.t.Errorf("upstream replica ack: %v", err)
		}
		u.mu.Lock()
		delete(u.handles, c.ck)
		u.mu.Unlock()
	}
	return len(cs)
}

// heartbeat renews every handle (lease/3 in upstream); an answer other
// than 1 drops the handle.
func (u *upReplica) heartbeat(ctx context.Context) {
	claimed, owners, idx := u.keys()
	u.mu.Lock()
	defer u.mu.Unlock()
	for ck, m := range u.handles {
		var e upEnvelope
		_ = json.Unmarshal([]byte(m), &e)
		exp := math.Min(float64(time.Now().Add(u.lease).UnixMilli())/1000, float64(e.Data.Deadline+300))
		n, err := upstreamRenewScript.Run(ctx, u.c, []string{claimed, idx, owners}, ck, exp, u.owner).Int()
		if err == nil && n != 1 {
			delete(u.handles, ck)
		}
	}
}

// reclaim returns expired claims of the queue, anyone's, with their stored
// member scored by QueueScore.
func (u *upReplica) reclaim(ctx context.Context) int {
	claimed, owners, idx := u.keys()
	now := float64(time.Now().UnixMilli()) / 1000
	cks, err := u.c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: idx, ByScore: true, Start: "-inf", Stop: strconv.FormatFloat(now, 'f', -1, 64), Count: 100}).Result()
	if err != nil {
		return 0
	}
	n := 0
	for _, ck := range cks {
		m, err := u.c.HGet(ctx, claimed, ck).Result()
		if err != nil {
			continue
		}
		r, err := upstreamReclaimScript.Run(ctx, u.c, []string{u.queue, claimed, owners, idx}, ck, upQueueScore(m), now).Int()
		if err == nil && r == 1 {
			n++
		}
	}
	return n
}

// run runs the replica's loops until stop is closed: a tick every poll, a
// heartbeat every lease/3, a reclaim every reclaim interval.
func (u *upReplica) run(stop <-chan struct{}, poll, reclaimEvery time.Duration, batch int) *sync.WaitGroup {
	var wg sync.WaitGroup
	ctx := context.Background()
	loop := func(every time.Duration, fn func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(every)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					fn()
				}
			}
		}()
	}
	loop(poll, func() { u.tick(ctx, batch) })
	loop(max(u.lease/3, 10*time.Millisecond), func() { u.heartbeat(ctx) })
	loop(reclaimEvery, func() { u.reclaim(ctx) })
	return &wg
}

// gateway counts the dispatches of each request: the payloads carry the
// request's id as "prompt". Sluice replicas reach it over HTTP; an upstream
// replica counts through dispatch.
type gateway struct {
	mu    sync.Mutex
	calls map[string]int
	order []string
	// started is when each call of order started.
	started []time.Time
	delay   time.Duration
	// spread, when set, makes each id's call last delay ± spread (a fixed
	// draw per id), so that calls end at different times.
	spread time.Duration
	// delays overrides the call's duration of an id.
	delays map[string]time.Duration
	// paths is the path of each id's last call.
	paths map[string]string
	// fail answers that many first calls of an id with 503.
	fail map[string]int
	srv  *httptest.Server
}

func newGateway(t *testing.T, delay time.Duration) *gateway {
	g := &gateway{calls: map[string]int{}, delay: delay, fail: map[string]int{}, delays: map[string]time.Duration{}, paths: map[string]string{}}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost { // a client's connection probe (OPTIONS *), not a dispatch
			return
		}
		body, _ := io.ReadAll(r.Body)
		var p struct {
			Prompt string `json:"prompt"`
		}
		_ = json.Unmarshal(body, &p)
		g.dispatch(p.Prompt, body)
		g.mu.Lock()
		g.paths[p.Prompt] = r.URL.Path
		g.mu.Unlock()
		if d := g.delayOf(p.Prompt); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done(): // the caller gave up (an aborted call)
			}
		}
		g.mu.Lock()
		failing := g.fail[p.Prompt] > 0
		if failing {
			g.fail[p.Prompt]--
		}
		g.mu.Unlock()
		if failing {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// delayOf is how long the call of id lasts.
func (g *gateway) delayOf(id string) time.Duration {
	g.mu.Lock()
	d, s := g.delay, g.spread
	o, ok := g.delays[id]
	g.mu.Unlock()
	if ok {
		return o
	}
	if s <= 0 {
		return d
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return d - s + time.Duration(h.Sum64()%uint64(2*s))
}

func (g *gateway) dispatch(id string, _ json.RawMessage) {
	g.mu.Lock()
	g.calls[id]++
	g.order = append(g.order, id)
	g.started = append(g.started, time.Now())
	g.mu.Unlock()
}

func (g *gateway) counts() (map[string]int, []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := make(map[string]int, len(g.calls))
	for k, v := range g.calls {
		c[k] = v
	}
	return c, append([]string(nil), g.order...)
}

// startedAfter returns the ids whose calls started after t, in order.
func (g *gateway) startedAfter(t time.Time) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for i, at := range g.started {
		if at.After(t) {
			out = append(out, g.order[i])
		}
	}
	return out
}

func payloadFor(id string) string { return `{"model":"m","prompt":"` + id + `"}` }

// rawResults reads every result in list (oldest first) without removing them.
func rawResults(t *testing.T, c redis.UniversalClient, list string) []map[string]any {
	t.Helper()
	vs, err := c.LRange(context.Background(), list, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]map[string]any, 0, len(vs))
	for i := len(vs) - 1; i >= 0; i-- {
		var m map[string]any
		if err := json.Unmarshal([]byte(vs[i]), &m); err != nil {
			t.Fatalf("result %q: %v", vs[i], err)
		}
		out = append(out, m)
	}
	return out
}

// waitResults waits until list holds n results.
func waitResults(t *testing.T, c redis.UniversalClient, list string, n int, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		got := c.LLen(context.Background(), list).Val()
		if got >= int64(n) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s holds %d results after %s, want %d", list, got, d, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkClaimsGone checks that no claim of queue is left.
func checkClaimsGone(t *testing.T, c redis.UniversalClient, queue string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range []string{queue + ":claimed", queue + ":claim-owners", queue + ":claims-idx"} {
		if n := c.Exists(ctx, k).Val(); n != 0 {
			t.Errorf("%s is left: %v", k, c.Type(ctx, k).Val())
		}
	}
}
