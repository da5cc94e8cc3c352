// Package keys is the Redis key layout and the Lua scripts shared by the
// sorted-set transport and its producer library. Keeping them in one place
// is what lets a producer and a dispatcher built from different versions of
// this module agree on where everything lives.
//
// Per request queue Q (a sorted set, score = deadline in Unix seconds):
//
//	Q                 waiting requests (member = message bytes)
//	Q:claimed         claims in flight: claim id -> message (upstream's layout, below)
//	Q:claim-owners    claim id -> owner token
//	Q:claims-idx      claim id -> lease expiry (Unix s)
//	Q:settling        claim id -> a result being written across hash slots (cluster; see SettlePrepare)
//	Q:redeliveries    message -> leases lost so far (only for reclaimed messages)
//	Q:leases, Q:leased  the lease layout of earlier sluice versions (reclaimed, never written)
//	Q:delayed         retries: "<score>|<message>" -> due time (Unix ms); name configurable
//	Q:dead            dead-lettered messages (list)
//	Q:seq             enqueue sequence (FIFO among equal deadlines)
//	Q:job:<job>       waiting messages of a job enqueued by the producer (set)
//	Q:notify          pub/sub channel: new work was enqueued
//	Q:stats           counters (late_results, late_requeues, reclaimed, ...)
//	Q:call:<id>       mark of one enqueue call (10 minutes), so a retried call adds nothing
//
// Global, under the prefix P (default llm-d-async):
//
//	P:requests:<pool>         request queue of a pool (naming convention)
//	P:results:<pool>:<tenant> result list of a pool and tenant
//	P:queues                  set of the request queues in use (for `sluice queues`)
//	P:cancelled               cancellations "job:<id>" / "req:<id>" -> expiry (Unix ms) (transports/internal/cancelset)
//	P:cancel-epoch            incremented by every cancellation
//	P:cancel                  pub/sub channel of cancellations
//	P:jobq:<job>              request queues holding waiting messages of a job
//	R:pending                 result leases of the durable result reader (R = result list)
//	{R}:sluice-pushed         owner tokens whose result a cross-slot settle pushed to R -> expiry (ms)
//
// Upstream's keys, read and cleaned when sluice takes over from it (no prefix):
//
//	request-active:<id>       request token of the id's latest enqueue (upstream's producer)
//	request-cancel:<id>       that token, when the request was cancelled
//	retry-sortedset           upstream's retry set, shared by its queues: envelope -> due time
//	                          (Unix s); the name is a flat retry_queue_name
package keys

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/redisclient"
)

// DefaultPrefix is the key prefix of the batch processor convention.
const DefaultPrefix = "llm-d-async"

// DefaultTenant is the tenant of ResultQueue when none is given.
const DefaultTenant = "$batch"

// QueuePlaceholder is replaced by the request queue's name in a delay-set
// name template.
const QueuePlaceholder = "{queue}"

// Names derives key names from a prefix.
//
// With Cluster set (a Redis Cluster), every key a script touches must hash
// to one slot, so names carry hash tags: a request queue's companion keys
// are built on redisclient.Tagged(queue) ("{Q}:claimed" for a queue Q without
// a tag of its own, which hashes like Q itself, so the queue's name is
// unchanged), the pool in the conventional queue and result names is tagged
// (P:requests:{pool}, P:results:{pool}:<tenant>: a pool's queue and result
// lists share a slot, and pools spread over the nodes), and the global keys
// share the prefix's slot ({P}:queues, {P}:cancelled, ...).
type Names struct {
	// Prefix is the global key prefix (DefaultPrefix when empty).
	Prefix string
	// DelayedTemplate names a queue's delay set; QueuePlaceholder stands for
	// the queue (default "{queue}:delayed").
	DelayedTemplate string
	// Cluster selects the hash-tagged layout of a Redis Cluster.
	Cluster bool
}

func (n Names) prefix() string {
	if n.Prefix == "" {
		return DefaultPrefix
	}
	return n.Prefix
}

// global is the name of a prefix-wide key: P:<suffix>, or {P}:<suffix> in a
// cluster (one slot for all of them).
func (n Names) global(suffix string) string {
	if n.Cluster {
		return tagged(n.prefix()) + ":" + suffix
	}
	return n.prefix() + ":" + suffix
}

// pool is the pool's part of a conventional name ({pool} in a cluster).
func (n Names) pool(pool string) string {
	if n.Cluster {
		return "{" + pool + "}"
	}
	return pool
}

// RequestQueue is the request queue of pool: P:requests:<pool>
// (P:requests:{pool} in a cluster).
func (n Names) RequestQueue(pool string) string { return n.prefix() + ":requests:" + n.pool(pool) }

// ResultQueue is the result list of pool and tenant: P:results:<pool>:<tenant>
// (tenant DefaultTenant when empty; P:results:{pool}:<tenant> in a cluster).
func (n Names) ResultQueue(pool, tenant string) string {
	if tenant == "" {
		tenant = DefaultTenant
	}
	return n.prefix() + ":results:" + n.pool(pool) + ":" + tenant
}

// Registry is the set of request queues in use.
func (n Names) Registry() string { return n.global("queues") }

// Submission is the record of an idempotent submit under key (see
// SubmitIdempotent): a hash of the first submission's identity, token and
// routes, kept for the producer's retention.
func (n Names) Submission(key string) string { return n.global("submission:" + key) }

// Cancelled is the sorted set of cancellations.
func (n Names) Cancelled() string { return n.global("cancelled") }

// CancelEpoch is the counter bumped by every change of the cancel set.
func (n Names) CancelEpoch() string { return n.global("cancel-epoch") }

// CancelChannel is the pub/sub channel of cancellations.
func (n Names) CancelChannel() string { return n.global("cancel") }

// JobQueues is the set of request queues holding waiting messages of job.
func (n Names) JobQueues(job string) string { return n.global("jobq:" + job) }

// Queue returns the keys of request queue name.
func (n Names) Queue(name string) Queue {
	tpl := n.DelayedTemplate
	if tpl == "" {
		tpl = QueuePlaceholder + ":delayed"
	}
	base := name
	if n.Cluster {
		base = tagged(name)
	}
	return Queue{
		Name:         name,
		Claimed:      base + ":claimed",
		Owners:       base + ":claim-owners",
		ClaimsIdx:    base + ":claims-idx",
		Settling:     base + ":settling",
		ClaimCalls:   base + ":claim-call:",
		Leases:       base + ":leases",
		Leased:       base + ":leased",
		Redeliveries: base + ":redeliveries",
		Delayed:      strings.ReplaceAll(tpl, QueuePlaceholder, base),
		Dead:         base + ":dead",
		Seq:          base + ":seq",
		JobPrefix:    base + ":job:",
		Notify:       base + ":notify",
		Stats:        base + ":stats",
		CallMarks:    base + ":call:",
	}
}

// Pending is the lease set of the durable result reader of result list r.
func (n Names) Pending(r string) string {
	if n.Cluster {
		return tagged(r) + ":pending"
	}
	return r + ":pending"
}

// CheckSlots reports, in a cluster, a request queue whose own keys would
// not share one hash slot (a script touching them would fail with
// CROSSSLOT), naming the fix. It accepts anything on a single node. A
// result list in another slot is not an error: see CrossSlot.
func (n Names) CheckSlots(queue string) error {
	if !n.Cluster {
		return nil
	}
	if _, err := redisclient.Tagged(queue); err != nil {
		return fmt.Errorf("queue %s: %w", queue, err)
	}
	k := n.Queue(queue)
	want := redisclient.Slot(queue)
	for _, key := range []string{k.Claimed, k.ClaimsIdx, k.Delayed, k.Dead} {
		if redisclient.Slot(key) != want {
			return fmt.Errorf("queue %s: its key %s hashes to slot %d, the queue to %d: in cluster mode retry_queue_name must put {queue} before any brace of its own", queue, key, redisclient.Slot(key), want)
		}
	}
	return nil
}

// CrossSlot reports whether, in a cluster, resultList is in another hash
// slot than request queue queue, so that a result cannot be written in the
// same script as the claim it settles is dropped: the transport then
// settles in three steps (SettlePrepare, PushOnce, SettleCommit). Upstream's
// own names (P:requests:<pool>, P:results:<pool>:<tenant>, no hash tag) are
// such a pair; one hash tag on both (P:requests:{pool},
// P:results:{pool}:<tenant>) keeps the one-script settle.
func (n Names) CrossSlot(queue, resultList string) bool {
	return n.Cluster && resultList != "" && redisclient.Slot(resultList) != redisclient.Slot(queue)
}

// CrossSlotHint is the advice given with a cross-slot pair (the names that
// keep the one-script settle).
func (n Names) CrossSlotHint() string {
	return fmt.Sprintf("give the queue and its result list one hash tag (e.g. queue %s, results %s) to keep the one-script settle",
		Names{Prefix: n.Prefix, Cluster: true}.RequestQueue("<pool>"), Names{Prefix: n.Prefix, Cluster: true}.ResultQueue("<pool>", "<tenant>"))
}

// Pushed is the set of owner tokens whose result a cross-slot settle has
// pushed to result list r (see PushOnce): in r's hash slot, named so as not
// to meet a durable result consumer's r:result-* keys.
func Pushed(r string) string { return tagged(r) + ":sluice-pushed" }

// tagged is redisclient.Tagged, falling back to braces around the key for
// a name it refuses (CheckSlots reports such a name).
func tagged(key string) string {
	t, err := redisclient.Tagged(key)
	if err != nil {
		return "{" + key + "}"
	}
	return t
}

// Queue holds the key names of one request queue.
type Queue struct {
	Name, Redeliveries, Delayed, Dead, Seq, JobPrefix, Notify, Stats string
	// Claimed, Owners and ClaimsIdx are upstream's claim keys (see Claim).
	Claimed, Owners, ClaimsIdx string
	// Settling holds the results being written to a result list in another
	// hash slot, by claim id (see SettlePrepare).
	Settling string
	// ClaimCalls prefixes the record of one claim call (see Claim).
	ClaimCalls string
	// Leases and Leased are the lease keys of earlier sluice versions,
	// only reclaimed (LegacyRelease) and migrated.
	Leases, Leased string
	// CallMarks prefixes the marks that make an enqueue call run once.
	CallMarks string
}

// MemberTag opens a message written by the producer: {"_sluice":"<seq>/<job>",
// followed by the flat request's members. The tag makes members with equal
// deadlines sort in enqueue order and names the job index to clean up at
// claim. Decoders ignore it as an unknown field.
const MemberTag = `{"_sluice":"`

// SeqWidth is the zero-padded width of the sequence in MemberTag.
const SeqWidth = 20

// Scripts. Every script reads the clock with TIME, so leases and due times
// follow one clock (Redis') whatever the replicas' clocks say.

// Claims are upstream llm-d-async's (v0.9.1 and later, "durable dequeue"),
// so that sluice and upstream replicas serving one queue see each other's
// work in flight and take over each other's expired claims:
//
//	Q:claimed       claim id -> the member as it was in Q, byte for byte
//	Q:claim-owners  claim id -> owner token (the fence of every write)
//	Q:claims-idx    claim id -> lease expiry, Unix seconds (float)
//
// The claim id of an envelope is data.id + "\0" + internal.request_token
// (data.id alone without a token), as upstream computes it, so that a later
// claim of the same request (upstream re-claims a retried request under the
// same id) takes the claim over instead of running beside it. A flat
// request, which upstream cannot read, is claimed under its owner token.
// sluice's owner tokens are "<replica>:<claim call>:<i>", unique per claim;
// upstream's are 16 hex digits per process: the colon tells them apart.
// A lease lasts min(now + lease, deadline + 5 min), as upstream bounds it.
// A lease of WholeSecondLeaseMS or more (the default lease_ms is 15 s) is
// written rounded up to a whole second, by the claim and by every renewal
// (Extend), unless that would pass the deadline bound: a small sorted set
// such as Q:claims-idx is stored as a listpack, which keeps a fractional score as text and parses every stored
// score again at each insert (the claim's ZADD was a fifth of the Redis
// time of a busy queue); whole seconds are stored as integers. Up to a
// second more (a tenth at most) only delays the reclaim of a dead
// replica's requests by as much (every reader compares the expiry with
// its clock); a shorter lease keeps its milliseconds.

// WholeSecondLeaseMS is the shortest lease the claim writes in whole
// seconds (see Claim).
const WholeSecondLeaseMS = 10000

// ClaimGraceSeconds bounds a lease to the request's deadline plus this
// (upstream's reclaimGraceAfterDeadline).
const ClaimGraceSeconds = 300

// Claim promotes due retries, then claims up to n waiting requests.
//
// The owner-token prefix must be new for every claim. A claim whose reply
// was lost (the connection or the server died after the script ran) and
// that the client sends again with the same arguments finds the record of
// the first run (KEYS[7], a list kept 10 s, longer than the client's
// retries take) and returns the claims of that run it still owns instead
// of claiming more. The next claim of the loop deletes the record (ARGV[5]:
// the previous call's record, "" for none), so a busy queue keeps one.
//
// On a single node (the cancel-epoch key is given) the claim also reads
// upstream's cancel marker of every envelope that carries a request token,
// request-cancel:<data.id>, and answers whether it holds that token, so the
// dispatcher need not read it again right after the claim (upstream reads
// it at its dequeue). A replayed claim answers "not read".
//
//	KEYS: queue, claimed, owners, idx, redeliveries, delayed, call record[, cancel-epoch]
//	ARGV: n, lease ms, owner-token prefix, job index prefix, previous call record
//
// Without the cancel-epoch key (a cluster, where it lives in another slot)
// the epoch returned is "0" and the caller reads it on its own.
//
//	returns: {next delayed due ms or -1, cancel epoch, now ms,
//	          owner token, score, deliveries, message, claim id,
//	          lease cap ms (deadline + 5 min; 0 for none),
//	          upstream cancel marker (CancelUnread, CancelClear, CancelSet), ...}
var Claim = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = '0'
if #KEYS >= 8 then epoch = redis.call('GET', KEYS[8]) or '0' end
local out = {-1, epoch, now}
if ARGV[5] and ARGV[5] ~= '' and ARGV[5] ~= KEYS[7] then redis.call('DEL', ARGV[5]) end
local prev = redis.call('LRANGE', KEYS[7], 0, -1)
if #prev > 0 then
  for i = 1, #prev do
    local rec = prev[i]
    local a = string.find(rec, '|', 1, true)
    local b = string.find(rec, '|', a + 1, true)
    local c = string.find(rec, '|', b + 1, true)
    local ck = string.sub(rec, c + 1)
    local tok = ARGV[3] .. string.format('%d', i)
    if redis.call('HGET', KEYS[3], ck) == tok then
      out[#out + 1] = tok
      out[#out + 1] = string.sub(rec, 1, a - 1)
      out[#out + 1] = tonumber(string.sub(rec, a + 1, b - 1))
      out[#out + 1] = redis.call('HGET', KEYS[2], ck)
      out[#out + 1] = ck
      out[#out + 1] = tonumber(string.sub(rec, b + 1, c - 1))
      out[#out + 1] = 0
    end
  end
else
  local due = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 512)
  if #due > 0 then
    local add = {}
    for i = 1, #due do
      local rec = due[i]
      local p = string.find(rec, '|', 1, true)
      add[#add + 1] = string.sub(rec, 1, p - 1)
      add[#add + 1] = string.sub(rec, p + 1)
    end
    redis.call('ZADD', KEYS[1], unpack(add))
    redis.call('ZREM', KEYS[6], unpack(due))
  end
  local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
  if #popped > 0 then
    local lease = now + tonumber(ARGV[2])
    local whole = tonumber(ARGV[2]) >= ` + strconv.Itoa(WholeSecondLeaseMS) + `
    local redel = redis.call('EXISTS', KEYS[5]) == 1
    local mark, hc, ho, zi = {}, {}, {}, {}
    local ckeys, ctoks, cpos = {}, {}, {}
    -- Whole numbers within 64 bits become strings through '%d' (where Lua's
    -- %d is 64-bit), and repeated ones are formatted once: Lua's own
    -- number-to-string ('%.14g') and the server's for a number handed to a
    -- command ('%.17g') go through the C library's exact float printing, a
    -- few thousand instructions each. The tables are filled by index, not
    -- t[#t + 1] (a length lookup per append, ~150 instructions); request
    -- k's reply fields are out[o + 1 .. o + 7].
    local wide = string.format('%d', 2 ^ 40) == '1099511627776'
    local capN, capS, scN, scS = 0, '0', nil, nil
    local nc = 0
    for i = 1, #popped, 2 do
      local m, s = popped[i], popped[i + 1]
      local k = (i + 1) / 2
      local o = 3 + (k - 1) * ` + strconv.Itoa(ClaimReplyFields) + `
      local tok = ARGV[3] .. string.format('%d', k)
      local d = 1
      if redel then
        local p = redis.call('HGET', KEYS[5], m)
        if p then d = tonumber(p) + 1 end
      end
      local ck, exp, cap, cm = tok, lease, 0, 0
      if string.find(m, '"request_token"', 1, true) or string.find(m, '"request_kind"', 1, true) then
        local ok, v = pcall(cjson.decode, m)
        if ok and type(v) == 'table' and type(v.data) == 'table' and type(v.data.id) == 'string' and v.data.id ~= '' then
          ck = v.data.id
          local rt = nil
          if type(v.internal) == 'table' then rt = v.internal.request_token end
          if type(rt) == 'string' and rt ~= '' then
            ck = ck .. '\0' .. rt
            if #KEYS >= 8 then
              cm = 1
              nc = nc + 1
              ckeys[nc] = '` + CancelPrefix + `' .. v.data.id
              ctoks[nc] = rt
              cpos[nc] = o + 7
            end
          end
          local dl = tonumber(v.data.deadline)
          if dl and dl > 0 then
            cap = math.floor((dl + 300) * 1000)
            if cap < exp then exp = cap end
          end
        end
      end
      if string.sub(m, 1, 12) == '{"_sluice":"' then
        local job = string.match(m, '^{"_sluice":"%d+/([^"]+)"')
        if job then redis.call('SREM', ARGV[4] .. job, m) end
      end
      hc[2 * k - 1], hc[2 * k] = ck, m
      ho[2 * k - 1], ho[2 * k] = ck, tok
      local sc = exp / 1000
      if whole then
        sc = math.ceil(sc)
        if cap > 0 and sc * 1000 > cap then sc = cap / 1000 end
      end
      if sc ~= scN then
        scN, scS = sc, sc
        if wide and sc == math.floor(sc) and math.abs(sc) < 2 ^ 63 then scS = string.format('%d', sc) end
      end
      if cap ~= capN then
        capN, capS = cap, tostring(cap)
        if wide and math.abs(cap) < 2 ^ 63 then capS = string.format('%d', cap) end
      end
      zi[2 * k - 1], zi[2 * k] = scS, ck
      local ds = '1'
      if d ~= 1 then ds = string.format('%d', d) end
      mark[k] = s .. '|' .. ds .. '|' .. capS .. '|' .. ck
      out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = tok, s, d, m, ck, cap, cm
    end
    if nc > 0 then
      local vals = redis.call('MGET', unpack(ckeys))
      for j = 1, nc do
        if vals[j] == ctoks[j] then out[cpos[j]] = 2 end
      end
    end
    redis.call('HSET', KEYS[2], unpack(hc))
    redis.call('HSET', KEYS[3], unpack(ho))
    redis.call('ZADD', KEYS[4], unpack(zi))
    redis.call('RPUSH', KEYS[7], unpack(mark))
    redis.call('PEXPIRE', KEYS[7], 10000)
  end
end
local nxt = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
if nxt[2] then out[1] = nxt[2] end
return out
`)

// ClaimReplyFields is the number of reply elements per claimed request.
const ClaimReplyFields = 7

// The claim's answer about upstream's cancel marker of a request.
const (
	// CancelUnread: not read (no request token, a cluster, a replayed claim).
	CancelUnread = 0
	// CancelClear: request-cancel:<id> did not hold the request's token.
	CancelClear = 1
	// CancelSet: request-cancel:<id> held the request's token: cancelled.
	CancelSet = 2
)

// Settle is the fenced acknowledgement of many claims at once. Each item is
// (mode, owner token, claim id, result, dead, request id, request token,
// payload key, result ttl s): mode "r" writes result to the result list,
// "d" pushes dead to the dead-letter list, "b" does both with the claimed
// message as dead; all drop the claim. An item whose owner token no longer
// owns its claim (the lease expired and another replica, sluice or
// upstream, reclaimed it) writes nothing and is counted as late. When a
// result is written:
//   - with a request token, upstream's cancellation keys
//     request-active:<id> and request-cancel:<id> are deleted if they still
//     hold that token (a newer enqueue of the same id keeps its keys);
//   - a payload key (upstream's request-payload:<id>:<token>) is deleted;
//   - a ttl above 0 sets the result list's expiry (EXPIRE on every push, as
//     upstream's result_ttl_seconds).
//
// Request id, token and payload key are "" in a cluster (other slots).
// The script reads every owner in one HMGET and drops the claims, reads
// the markers and deletes what it writes off in one call per key kind, not
// one per item (each call from Lua costs about a microsecond of the
// server's time); an item repeated in one call is settled once, the
// repeat counted late. Lua's unpack bounds a call to about 4,000 items
// (the transport sends at most 256).
// A result or dead-letter list key holding another type fails the whole
// call before anything is written (a script is not rolled back: were the
// claims dropped first, a failing LPUSH would lose their requests).
//
//	KEYS: claimed, owners, idx, result list, dead list, stats, redeliveries
//	returns: {status per item: 1 done, 0 late}
var Settle = redis.NewScript(settleSrc)

const settleSrc = `
for _, k in ipairs({KEYS[4], KEYS[5]}) do
  local t = redis.call('TYPE', k).ok
  if t ~= 'none' and t ~= 'list' then
    return redis.error_reply('WRONGTYPE ' .. k .. ' holds a ' .. t .. ', not a list: nothing settled')
  end
end
local n = #ARGV / 9
if n == 0 then return {} end
local redel = redis.call('EXISTS', KEYS[7]) == 1
local cks = {}
for j = 1, n do cks[j] = ARGV[(j - 1) * 9 + 3] end
local owners = redis.call('HMGET', KEYS[2], unpack(cks))
local out, live, seen, late, nl = {}, {}, {}, 0, 0
local needRec = {}
for j = 1, n do
  local i = (j - 1) * 9 + 1
  local tok, ck = ARGV[i + 1], cks[j]
  if tok ~= '' and owners[j] == tok and not seen[ck] then
    seen[ck] = true
    nl = nl + 1
    live[nl] = j
    if redel or ARGV[i] == 'b' then needRec[#needRec + 1] = ck end
    out[j] = 1
  else
    late = late + 1
    out[j] = 0
  end
end
if nl > 0 then
  local rec = {}
  if #needRec > 0 then
    local got = redis.call('HMGET', KEYS[1], unpack(needRec))
    for k = 1, #needRec do rec[needRec[k]] = got[k] end
  end
  -- the per-item tables are filled by counters, not t[#t + 1] (a length
  -- lookup per append, ~150 instructions in Redis' Lua)
  local gone, redels, results, dead, marks, markTok, payloads, ttl = {}, {}, {}, {}, {}, {}, {}, 0
  local nr, nm = 0, 0
  for g = 1, nl do
    local j = live[g]
    local i = (j - 1) * 9 + 1
    local mode, ck = ARGV[i], cks[j]
    local r = rec[ck]
    gone[g] = ck
    if redel and r then redels[#redels + 1] = r end
    if mode == 'd' then
      dead[#dead + 1] = ARGV[i + 4]
    else
      nr = nr + 1
      results[nr] = ARGV[i + 3]
      if mode == 'b' and r then dead[#dead + 1] = r end
      local rt = ARGV[i + 6]
      if rt ~= '' then
        marks[nm + 1], marks[nm + 2] = '` + ActivePrefix + `' .. ARGV[i + 5], '` + CancelPrefix + `' .. ARGV[i + 5]
        markTok[nm + 1], markTok[nm + 2] = rt, rt
        nm = nm + 2
      end
      if ARGV[i + 7] ~= '' then payloads[#payloads + 1] = ARGV[i + 7] end
      local t = tonumber(ARGV[i + 8]) or 0
      if t > 0 then ttl = t end
    end
  end
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
  redis.call('ZREM', KEYS[3], unpack(gone))
  if #redels > 0 then redis.call('HDEL', KEYS[7], unpack(redels)) end
  if #dead > 0 then redis.call('LPUSH', KEYS[5], unpack(dead)) end
  if nm > 0 then
    -- MGET answers nil for a key of another type, as the GET it replaces
    -- was called to fail softly there
    local vals, del, nd = redis.call('MGET', unpack(marks)), {}, 0
    for k = 1, nm do
      if vals[k] == markTok[k] then
        nd = nd + 1
        del[nd] = marks[k]
      end
    end
    if nd > 0 then redis.call('DEL', unpack(del)) end
  end
  if #payloads > 0 then redis.call('DEL', unpack(payloads)) end
  if nr > 0 then
    redis.call('LPUSH', KEYS[4], unpack(results))
    if ttl > 0 then redis.call('EXPIRE', KEYS[4], ttl) end
  end
end
if late > 0 then redis.call('HINCRBY', KEYS[6], 'late_results', late) end
return out
`

// SettleArgs is the number of ARGV entries per Settle item.
const SettleArgs = 9

// Upstream's per-request keys (no prefix): its producer sets
// ActivePrefix+<id> to the request token at enqueue and cancels by copying
// that token to CancelPrefix+<id>; with payload keys it stores the payload
// at PayloadPrefix+<id>:<token>.
const (
	ActivePrefix  = "request-active:"
	CancelPrefix  = "request-cancel:"
	PayloadPrefix = "request-payload:"
	SeqPrefix     = "request-seq:"
)

// PayloadKey is upstream's payload key of a request: request-payload:<id>:<token>.
func PayloadKey(id, token string) string { return PayloadPrefix + id + ":" + token }

// Move moves members of one sorted set to others, each only if it is still
// there: the ZREM decides, so a member moved concurrently by another mover
// (another replica, upstream's own retry mover) is moved once. Each item is a
// quadruple (member, destination, score, destination member; "" keeps the
// member).
//
//	KEYS: source sorted set
//	returns: {status per item: 1 moved, 0 gone}
var Move = redis.NewScript(`
local out = {}
for i = 1, #ARGV, 4 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    local m = ARGV[i + 3]
    if m == '' then m = ARGV[i] end
    redis.call('ZADD', ARGV[i + 1], ARGV[i + 2], m)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
`)

// Requeue swaps a claim for an entry of the delay set, fenced by its owner
// token: the claim is dropped and the message waits in the delay set
// ("<score>|<message>" -> due ms), in one step, so a crash neither loses the
// retry nor leaves a claim behind to be reclaimed beside it (upstream keeps
// the claim while the retry waits and documents the duplicate). A claim
// whose result is being written across hash slots (a settling record of
// this owner, KEYS[7]) is left as it is: its result may already be in the
// result list, and the reclaimer finishes that write.
//
//	KEYS: claimed, owners, idx, delayed, stats, redeliveries[, settling]
//	ARGV: owner token, claim id, delay ms, score, message
//	returns: 1, 0 when the claim was lost, 2 when its result is being written
var Requeue = redis.NewScript(`
if ARGV[1] == '' or redis.call('HGET', KEYS[2], ARGV[2]) ~= ARGV[1] then
  redis.call('HINCRBY', KEYS[5], 'late_requeues', 1)
  return 0
end
if KEYS[7] then
  local r = redis.call('HGET', KEYS[7], ARGV[2])
  if r and string.sub(r, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then return 2 end
end
local rec = redis.call('HGET', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
if rec then redis.call('HDEL', KEYS[6], rec) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), ARGV[4] .. '|' .. ARGV[5])
return 1
`)

// Release hands claimed messages back to their queue at the given score
// (upstream's RELEASE: a nack or a shutdown; the delivery does not count),
// each only while its owner token still owns the claim. Items are triples
// (owner token, claim id, score). A claim whose result is being written
// across hash slots (a settling record of the same owner in KEYS[5]) is not
// handed back, since the result may already be written: its lease expires
// and the reclaimer finishes the write (see SettlePrepare).
//
//	KEYS: claimed, owners, idx, queue[, settling]
//	returns: number of messages handed back
var Release = redis.NewScript(`
local n = 0
for i = 1, #ARGV, 3 do
  local tok, ck = ARGV[i], ARGV[i + 1]
  local busy = false
  if KEYS[5] and tok ~= '' then
    local r = redis.call('HGET', KEYS[5], ck)
    busy = r and string.sub(r, 1, #tok + 1) == tok .. '|'
  end
  if not busy and tok ~= '' and redis.call('HGET', KEYS[2], ck) == tok then
    local m = redis.call('HGET', KEYS[1], ck)
    redis.call('HDEL', KEYS[1], ck)
    redis.call('HDEL', KEYS[2], ck)
    redis.call('ZREM', KEYS[3], ck)
    if m then
      redis.call('ZADD', KEYS[4], ARGV[i + 2], m)
      n = n + 1
    end
  end
end
return n
`)

// Reclaim returns expired claims, whoever owned them, to the queue with
// the stored member, byte for byte (upstream's RECLAIMIFEXPIRED, for many
// claims in one call); the delivery counts (Q:redeliveries). Items are
// pairs (claim id, score): the caller computes each score from the stored
// member with upstream's formula. A claim whose lease is not (or no
// longer) expired, by Redis' clock, is left alone; an index entry without
// a claim (a ghost) is dropped.
//
// An expired claim with a settling record of its owner (KEYS[7]: its
// result was being written to a list in another hash slot when its owner
// died) is not returned to the queue: its lease is renewed by the lease
// the record names, and the claim id and record are returned for the
// caller to finish the write (PushOnce, then SettleCommit). A settling
// record of another owner (the claim was taken over since) is dropped and
// the claim reclaimed as any other.
//
//	KEYS: queue, claimed, owners, idx, redeliveries, stats[, settling]
//	returns: {number of messages returned, claim id, record, ...}
var Reclaim = redis.NewScript(reclaimSrc)

// Now reads Redis' clock, in Unix ms, on the node that holds KEYS[1] (on a
// cluster each master has its own clock): what a caller that selects
// expired claims by their index compares with, since the index is scored
// by that clock.
//
//	KEYS: any key of the queue (for the routing)
var Now = redis.NewScript(`
local t = redis.call('TIME')
return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`)

const reclaimSrc = `
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local n = 0
local out = {0}
for i = 1, #ARGV, 2 do
  local ck = ARGV[i]
  local exp = redis.call('ZSCORE', KEYS[4], ck)
  if exp and tonumber(exp) <= now then
    local rec = false
    if KEYS[7] then rec = redis.call('HGET', KEYS[7], ck) end
    if rec then
      local tok, lease = string.match(rec, '^([^|]*)|(%d+)|')
      if tok and tok ~= '' and redis.call('HGET', KEYS[3], ck) == tok then
        redis.call('ZADD', KEYS[4], now + tonumber(lease) / 1000, ck)
        out[#out + 1] = ck
        out[#out + 1] = rec
      else
        redis.call('HDEL', KEYS[7], ck)
        rec = false
      end
    end
    if not rec then
      local m = redis.call('HGET', KEYS[2], ck)
      redis.call('ZREM', KEYS[4], ck)
      if m then
        redis.call('ZADD', KEYS[1], ARGV[i + 1], m)
        redis.call('HDEL', KEYS[2], ck)
        redis.call('HDEL', KEYS[3], ck)
        redis.call('HINCRBY', KEYS[5], m, 1)
        n = n + 1
      end
    end
  end
end
if n > 0 then redis.call('HINCRBY', KEYS[6], 'reclaimed', n) end
out[1] = n
return out
`

// The settle of a claim whose result list is in another hash slot (a
// cluster with upstream's names; see the transport's xslot.go for the
// steps and what a crash between them leaves). A settling record is
// "<owner token>|<lease ms>|<window ms>|<rest>", where the rest is the
// transport's encoding of the result, its list and its mode.

// SettlePrepare is step 1 of a cross-slot settle, in the claim's slot:
// for each item whose owner token still owns its claim, the settling
// record is written beside the claim and the lease renewed by the record's
// lease ms (so that the reclaimer does not take the claim while the
// result is written); an item that lost its claim is counted as late.
//
//	KEYS: owners, idx, settling, stats
//	ARGV: triples (owner token, claim id, record without the owner token)
//	returns: {status per item: 1 prepared, 0 late}
var SettlePrepare = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local out, late = {}, 0
for i = 1, #ARGV, 3 do
  local tok, ck, rec = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local lease = tonumber(string.match(rec, '^(%d+)|'))
  if lease and tok ~= '' and redis.call('HGET', KEYS[1], ck) == tok then
    redis.call('HSET', KEYS[3], ck, tok .. '|' .. rec)
    redis.call('ZADD', KEYS[2], now + lease / 1000, ck)
    out[#out + 1] = 1
  else
    late = late + 1
    out[#out + 1] = 0
  end
end
if late > 0 then redis.call('HINCRBY', KEYS[4], 'late_results', late) end
return out
`)

// PushOnce is step 2 of a cross-slot settle, in the result list's slot:
// each result is pushed unless its marker (the owner token of the claim it
// settles) is in the pushed set, which then holds the marker for the
// item's window ms. So a step 2 run again (a retry after a lost reply, or
// the reclaimer finishing a settle whose owner died after step 2) pushes
// nothing within the window. A result list holding another type fails the
// call before anything is written.
//
//	KEYS: result list, pushed set (Pushed of the list)
//	ARGV: quadruples (marker, result, result list ttl s, window ms)
//	returns: {status per item: 1 pushed, 0 already pushed}
var PushOnce = redis.NewScript(`
local ty = redis.call('TYPE', KEYS[1]).ok
if ty ~= 'none' and ty ~= 'list' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. ty .. ', not a list: nothing pushed')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local out, res, add, ttl, win = {}, {}, {}, 0, 0
for i = 1, #ARGV, 4 do
  if redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    out[#out + 1] = 0
  else
    local w = tonumber(ARGV[i + 3])
    if w > win then win = w end
    add[#add + 1] = now + w
    add[#add + 1] = ARGV[i]
    res[#res + 1] = ARGV[i + 1]
    local tt = tonumber(ARGV[i + 2]) or 0
    if tt > 0 then ttl = tt end
    out[#out + 1] = 1
  end
end
if #res > 0 then
  redis.call('ZADD', KEYS[2], unpack(add))
  if redis.call('PTTL', KEYS[2]) < win then redis.call('PEXPIRE', KEYS[2], win) end
  redis.call('LPUSH', KEYS[1], unpack(res))
  if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
end
return out
`)

// SettleCommit is step 3 of a cross-slot settle, in the claim's slot, and
// the whole settle of a dead letter there: each item's settling record of
// its owner is dropped, and, while its owner token still owns the claim,
// the claim is dropped; mode "d" pushes dead to the dead-letter list, "b"
// pushes the claimed message there, "r" nothing more. A dead-letter list
// holding another type fails the call before anything is written.
//
//	KEYS: claimed, owners, idx, settling, dead list, stats, redeliveries
//	ARGV: quadruples (mode, owner token, claim id, dead)
//	returns: {status per item: 1 claim dropped, 0 claim lost}
var SettleCommit = redis.NewScript(`
local ty = redis.call('TYPE', KEYS[5]).ok
if ty ~= 'none' and ty ~= 'list' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[5] .. ' holds a ' .. ty .. ', not a list: nothing settled')
end
local redel = redis.call('EXISTS', KEYS[7]) == 1
local out, late = {}, 0
for i = 1, #ARGV, 4 do
  local mode, tok, ck = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local r = redis.call('HGET', KEYS[4], ck)
  if r and tok ~= '' and string.sub(r, 1, #tok + 1) == tok .. '|' then redis.call('HDEL', KEYS[4], ck) end
  if tok ~= '' and redis.call('HGET', KEYS[2], ck) == tok then
    local rec
    if redel or mode == 'b' then rec = redis.call('HGET', KEYS[1], ck) end
    redis.call('HDEL', KEYS[1], ck)
    redis.call('HDEL', KEYS[2], ck)
    redis.call('ZREM', KEYS[3], ck)
    if redel and rec then redis.call('HDEL', KEYS[7], rec) end
    if mode == 'd' then
      redis.call('LPUSH', KEYS[5], ARGV[i + 3])
    elseif mode == 'b' and rec then
      redis.call('LPUSH', KEYS[5], rec)
    end
    out[#out + 1] = 1
  else
    if mode == 'd' then late = late + 1 end
    out[#out + 1] = 0
  end
end
if late > 0 then redis.call('HINCRBY', KEYS[6], 'late_results', late) end
return out
`)

// Extend renews the claims this replica still owns: items are triples
// (owner token, claim id, cap ms or 0) and each lease becomes
// min(now + lease, cap), as upstream's heartbeat bounds it, rounded up to
// a whole second as the claim writes it (see Claim). The owners are read
// in one HMGET and the leases written in one ZADD (about 4,000 items at
// most per call: Lua's unpack).
//
//	KEYS: owners, idx
//	ARGV: lease ms, triples...
//	returns: the owner tokens whose claim was lost (taken over or gone)
var Extend = redis.NewScript(extendSrc)

var extendSrc = `
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local whole = tonumber(ARGV[1]) >= ` + strconv.Itoa(WholeSecondLeaseMS) + `
local lost = {}
local n = (#ARGV - 1) / 3
if n < 1 then return lost end
local cks = {}
for j = 1, n do cks[j] = ARGV[(j - 1) * 3 + 3] end
local owners = redis.call('HMGET', KEYS[1], unpack(cks))
local zi = {}
for j = 1, n do
  local i = (j - 1) * 3 + 2
  if owners[j] == ARGV[i] then
    local e = exp
    local cap = tonumber(ARGV[i + 2])
    if cap and cap > 0 and cap < e then e = cap end
    local sc = e / 1000
    if whole then
      sc = math.ceil(sc)
      if cap and cap > 0 and sc * 1000 > cap then sc = cap / 1000 end
    end
    zi[#zi + 1] = sc
    zi[#zi + 1] = cks[j]
  else
    lost[#lost + 1] = ARGV[i]
  end
end
if #zi > 0 then redis.call('ZADD', KEYS[2], unpack(zi)) end
return lost
`

// LegacyRelease returns the expired leases of the layout sluice used before
// it adopted upstream's claims (Q:leases: token -> expiry ms; Q:leased:
// token -> "<score>|<deliveries>|<message>") to their queue, up to ARGV[1]
// of them, so that requests in flight on a replica of an earlier version
// that died during an upgrade come back. The delivery counts. With ARGV[2]
// "all" live leases are returned too (`sluice migrate --force`).
//
//	KEYS: leases, leased, queue, redeliveries, stats
//	ARGV: limit[, "all"]
//	returns: number of messages handed back
var LegacyRelease = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local toks
if ARGV[2] == 'all' then
  toks = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
else
  toks = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
end
local n = 0
for i = 1, #toks do
  local tok = toks[i]
  if redis.call('ZREM', KEYS[1], tok) == 1 then
    local rec = redis.call('HGET', KEYS[2], tok)
    redis.call('HDEL', KEYS[2], tok)
    if rec then
      local p1 = string.find(rec, '|', 1, true)
      local p2 = string.find(rec, '|', p1 + 1, true)
      local m = string.sub(rec, p2 + 1)
      redis.call('ZADD', KEYS[3], string.sub(rec, 1, p1 - 1), m)
      redis.call('HSET', KEYS[4], m, tonumber(string.sub(rec, p1 + 1, p2 - 1)))
      n = n + 1
    end
  end
end
if n > 0 then redis.call('HINCRBY', KEYS[5], 'reclaimed', n) end
return n
`)

// Enqueue adds requests to a queue in enqueue order. Each request is a
// triple (score, job, body) where body is the flat request's JSON without
// its opening brace; the member becomes MemberTag<seq>/<job>",<body>.
// Requests with a job are indexed for cancellation until ttl after their
// deadline: in the queue's job index (ARGV[1]..job), and, when ARGV[2] is
// not empty, in the prefix-wide set of the job's queues (ARGV[2]..job). A
// cluster passes "" there and writes that set with JobQueue instead, since
// it lives in another hash slot.
//
// KEYS[3] marks the call: a call the client sends again after losing the
// reply (the script ran, the connection died) finds its mark and adds
// nothing, so a request is never enqueued twice by a retry. The mark lives
// ten minutes.
//
//	KEYS: queue, seq, call mark (unique per call)
//	ARGV: job index prefix, jobq prefix or "", index ttl ms after deadline, now ms, triples...
//	returns: the last sequence number
var Enqueue = redis.NewScript(enqueueSrc)

const enqueueSrc = `
local n = (#ARGV - 4) / 3
if n < 1 then return 0 end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', 600000) then
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
local last = redis.call('INCRBY', KEYS[2], n)
local first = last - n + 1
local add = {}
local jobs = {}
for k = 0, n - 1 do
  local s, job, body = ARGV[5 + 3 * k], ARGV[6 + 3 * k], ARGV[7 + 3 * k]
  local m = '{"_sluice":"' .. string.format('%020d', first + k) .. '/' .. job .. '",' .. body
  add[#add + 1] = s
  add[#add + 1] = m
  if job ~= '' then
    redis.call('SADD', ARGV[1] .. job, m)
    local ttl = math.floor(tonumber(s) * 1000 - tonumber(ARGV[4]) + tonumber(ARGV[3]))
    if not jobs[job] or jobs[job] < ttl then jobs[job] = ttl end
  end
end
redis.call('ZADD', KEYS[1], unpack(add))
for job, ttl in pairs(jobs) do
  if ttl < 1000 then ttl = 1000 end
  local ks = {ARGV[1] .. job}
  if ARGV[2] ~= '' then
    ks[2] = ARGV[2] .. job
    redis.call('SADD', ks[2], KEYS[1])
  end
  for _, k in ipairs(ks) do
    local cur = redis.call('PTTL', k)
    if cur < ttl then redis.call('PEXPIRE', k, ttl) end
  end
end
return last
`

// SubmitIdempotent is Enqueue of one request under an idempotency record:
// when the record exists it returns it and enqueues nothing; otherwise it
// enqueues (Enqueue's steps, with its call mark) and writes the record, in
// the same step, so that no crash can leave the request queued without its
// record or the record without its request.
//
//	KEYS: record, queue, seq, call mark
//	ARGV: identity, token, request route, result route, retention ms,
//	      submitted ms, then Enqueue's ARGV (one triple)
//	returns: {1 if enqueued now, 0 if the record existed, identity, token,
//	          request route, result route, submitted ms}
var SubmitIdempotent = redis.NewScript(`
local function enqueue(KEYS, ARGV)
` + enqueueSrc + `
end
local rec = redis.call('HMGET', KEYS[1], 'identity', 'token', 'request_route', 'result_route', 'submitted')
if rec[1] then return {0, rec[1], rec[2], rec[3], rec[4], rec[5]} end
local ea = {}
for i = 7, #ARGV do ea[i - 6] = ARGV[i] end
enqueue({KEYS[2], KEYS[3], KEYS[4]}, ea)
redis.call('HSET', KEYS[1], 'identity', ARGV[1], 'token', ARGV[2], 'request_route', ARGV[3], 'result_route', ARGV[4], 'submitted', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6]}
`)

// SubmitEnvelopes enqueues requests as upstream's producer does (its
// submitRequestScript, main at #463/#458), for many requests in one call:
// per request, the enqueue sequence of its (queue, deadline) is
// incremented (and expires an hour after the deadline), request-cancel:<id>
// is deleted, request-active:<id> set to the token until the deadline, the
// member written with the sequence spliced between its two halves and
// scored deadline + min(seq, 2^21-1)/2^21 (%.17g), and, with payload keys,
// the payload stored apart until 10 minutes after the deadline. Each
// request is 12 ARGV entries: seq key, cancel key, active key, token,
// active ttl ms, seq expire-at (Unix s), member before the sequence, member
// after it, deadline (Unix s), payload key or "", payload, payload ttl ms.
//
//	KEYS: queue
//	returns: the last sequence number
var SubmitEnvelopes = redis.NewScript(`
local last = 0
for i = 1, #ARGV, 12 do
  local seq = redis.call('INCR', ARGV[i])
  redis.call('EXPIREAT', ARGV[i], ARGV[i + 5])
  redis.call('DEL', ARGV[i + 1])
  redis.call('SET', ARGV[i + 2], ARGV[i + 3], 'PX', ARGV[i + 4])
  local s = seq
  if s > 2097151 then s = 2097151 end
  local score = tonumber(ARGV[i + 8]) + s / 2097152
  redis.call('ZADD', KEYS[1], string.format('%.17g', score), ARGV[i + 6] .. seq .. ARGV[i + 7])
  if ARGV[i + 9] ~= '' then redis.call('SET', ARGV[i + 9], ARGV[i + 10], 'PX', ARGV[i + 11]) end
  last = seq
end
return last
`)

// SubmitArgs is the number of ARGV entries per SubmitEnvelopes request.
const SubmitArgs = 12

// JobQueue records that queue holds waiting messages of a job, in a
// cluster (see Enqueue): the job's set of queues gains queue and lives at
// least ttl ms.
//
//	KEYS: jobq key of the job
//	ARGV: queue, ttl ms
var JobQueue = redis.NewScript(`
redis.call('SADD', KEYS[1], ARGV[1])
local ttl = math.max(tonumber(ARGV[2]), 1000)
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
`)

// Cancel records a cancellation, announces it, and for a job moves its
// waiting requests to the front of their queues (score 0), so that they are
// answered CANCELLED at once instead of when their deadline comes up. The
// epoch moves only when the set gained or forgot an entry: a cancellation
// sent again (the OpenAI front repeats an abandoned call's every second)
// extends its entry, which the replicas' copies already hold, so they do
// not reload the set for it; its announcement still aborts the request
// where it is now in flight.
// In a cluster the queues are in other hash slots: the caller passes no
// jobq key, reads the job's queues itself and runs CancelFront on each.
//
//	KEYS: cancelled, cancel-epoch
//	ARGV: entry ("job:<id>" or "req:<id>"), ttl ms, channel, jobq key ("" for a request), ":job:<id>"
//	returns: number of waiting requests moved to the front
var Cancel = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local forgot = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if added > 0 or forgot > 0 then redis.call('INCR', KEYS[2]) end
local moved = 0
if ARGV[4] ~= '' then
  local qs = redis.call('SMEMBERS', ARGV[4])
  for _, q in ipairs(qs) do
    local idx = q .. ARGV[5]
    local ms = redis.call('SMEMBERS', idx)
    for _, m in ipairs(ms) do
      if redis.call('ZADD', q, 'XX', 'CH', 0, m) == 1 then moved = moved + 1 end
    end
    redis.call('DEL', idx)
    if #ms > 0 then redis.call('PUBLISH', q .. ':notify', '1') end
  end
  redis.call('DEL', ARGV[4])
end
redis.call('PUBLISH', ARGV[3], ARGV[1])
return moved
`)

// CancelFront moves the waiting requests of a cancelled job in one queue to
// its front (score 0) and wakes the queue (a cluster's half of Cancel).
//
//	KEYS: queue, the queue's job index of the job
//	ARGV: the queue's notify channel
//	returns: number of requests moved
var CancelFront = redis.NewScript(`
local moved = 0
local ms = redis.call('SMEMBERS', KEYS[2])
for _, m in ipairs(ms) do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', 0, m) == 1 then moved = moved + 1 end
end
redis.call('DEL', KEYS[2])
if #ms > 0 then redis.call('PUBLISH', ARGV[1], '1') end
return moved
`)

// ReopenResults hands a reopened reader of a result list every result
// still leased there and not acked, whatever its lease, leased afresh to
// it (a consumer restarted on its route takes over what its earlier
// incarnation held, at once instead of when those leases expire).
//
//	KEYS: pending
//	ARGV: lease ms
//	returns: the results
var ReopenResults = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = redis.call('ZRANGE', KEYS[1], 0, -1)
if #out > 0 then
  local add, exp = {}, now + tonumber(ARGV[1])
  for i = 1, #out do
    add[2 * i - 1] = exp
    add[2 * i] = out[i]
  end
  redis.call('ZADD', KEYS[1], unpack(add))
end
return out
`)

// LeaseResults leases up to n results of a result list for a reader: first
// results whose earlier lease expired, then new ones (RPOP: oldest first).
//
//	KEYS: result list, pending
//	ARGV: n, lease ms
//	returns: the leased results
var LeaseResults = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local exp = now + tonumber(ARGV[2])
local out = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, n)
if #out < n then
  local fresh = redis.call('RPOP', KEYS[1], n - #out)
  if fresh then
    for i = 1, #fresh do out[#out + 1] = fresh[i] end
  end
end
if #out > 0 then
  local add = {}
  for i = 1, #out do
    add[#add + 1] = exp
    add[#add + 1] = out[i]
  end
  redis.call('ZADD', KEYS[2], unpack(add))
end
return out
`)
