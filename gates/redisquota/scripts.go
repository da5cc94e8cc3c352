package redisquota

import (
	"crypto/sha1"
	"encoding/hex"
)

// script is a Lua script sent with EVALSHA. (go-redis' Script.Load must not
// be used on a pipeline: it reads the digest before the pipeline runs.)
type script struct {
	src string
	sha string
}

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// Scripts. Each request runs exactly one of them (and a reserved one, one
// more at release), batched with other requests' scripts in one pipeline.
// Every script reads the clock with TIME, so windows and lease expiries
// follow one clock (Redis') whatever the replicas' clocks say, as sluice's
// transport scripts do.
//
// Key shapes are upstream's, so that sluice and upstream replicas running
// side by side count one quota: the tenant key is prefix + attribute + ":" +
// value, a sorted set in rate-limit mode and an integer counter in
// concurrency mode. The lease set (tenant key + LeaseSuffix) is sluice's own;
// upstream never reads it.

// rateLimit is upstream's sliding-window log: drop the entries older than
// the window, refuse when limit entries remain, else add one. Scores are
// Unix nanoseconds, as upstream writes them; the member is the same
// nanosecond string followed by "-" and a unique id, so two admissions in one
// nanosecond (or one microsecond: TIME's resolution) stay two entries.
// Upstream only ever counts (ZCARD) and trims by score, so it counts sluice's
// members as its own and sluice counts upstream's.
//
// The nanosecond strings are built as text: a double cannot hold a Unix
// nanosecond exactly, and Lua formats numbers with 14 digits.
//
//	KEYS: tenant key
//	ARGV: limit, window (whole µs), window (ns below a µs), ttl s, unique id
//	returns: {1, entries after the admission, 0} or
//	         {0, entries, ms until the oldest entry leaves the window}
var rateLimitScript = newScript(`
local t = redis.call('TIME')
local usec = tonumber(t[2])
local now_us = tonumber(t[1]) * 1000000 + usec
local now_ns = t[1] .. string.format('%06d', usec) .. '000'
local hi, rem = now_us - tonumber(ARGV[2]), tonumber(ARGV[3])
local cutoff
if rem > 0 then
  cutoff = string.format('%.0f', hi - 1) .. string.format('%03d', 1000 - rem)
else
  cutoff = string.format('%.0f', hi) .. '000'
end
if hi > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, cutoff) end
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[1]) then
  local wait = 1
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if oldest[2] then
    wait = math.ceil((tonumber(oldest[2]) - tonumber(cutoff)) / 1000000)
    if wait < 1 then wait = 1 end
  end
  return {0, n, wait}
end
redis.call('ZADD', KEYS[1], now_ns, now_ns .. '-' .. ARGV[5])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {1, n + 1, 0}
`)

// leasePrelude is shared by the concurrency scripts. It reads the clock and
// the counter (upstream's key) and reaps expired leases: each lease in the
// lease set (scored by its expiry, Unix ms) is one unit of the counter held
// by a sluice request; a lease that expired belongs to a holder that died
// (its replica crashed before releasing) and its unit is given back. When
// the counter is gone (it expired, or an operator deleted it), every unit
// was forgiven with it, so the leases go too: a later release of one of
// them must not decrement a new counter.
//
// After it: now (ms), cur (the counter, nil when absent).
const leasePrelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('GET', KEYS[1])
if cur then
  cur = tonumber(cur)
  if not cur then return redis.error_reply('quota counter ' .. KEYS[1] .. ' does not hold a number') end
  local reaped = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if reaped > 0 and cur > 0 then
    cur = redis.call('DECRBY', KEYS[1], math.min(reaped, cur))
  end
else
  redis.call('DEL', KEYS[2])
end
-- keep both keys while the latest lease lives, and at least ttl_ms
local function keep(ttl_ms, only_extend)
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[2] then
    local h = tonumber(last[2]) - now
    if h > ttl_ms then ttl_ms = h end
  end
  for i = 1, 2 do
    local p = redis.call('PTTL', KEYS[i])
    if p ~= -2 and not (only_extend and (p == -1 or p >= ttl_ms)) then
      redis.call('PEXPIRE', KEYS[i], ttl_ms)
    end
  end
end
`

// acquireScript is upstream's concurrency acquire (refuse when the counter
// is at the limit, else INCR and set the TTL) after reaping, plus the
// lease: the request's unit is recorded in the lease set, expiring at
// now + lease ms. The TTL of both keys is upstream's (the window, in whole
// seconds, or 300) or the latest lease's expiry, whichever is later.
//
//	KEYS: counter, lease set
//	ARGV: limit, ttl s, lease id, lease ms
//	returns: {1, counter after the acquire} or {0, counter}
var acquireScript = newScript(leasePrelude + `
if cur and cur >= tonumber(ARGV[1]) then return {0, cur} end
cur = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
keep(tonumber(ARGV[2]) * 1000, false)
return {1, cur}
`)

// releaseScript gives one unit back, once: only when the lease was still
// there (a release after its lease was reaped, or after the counter expired,
// decrements nothing). As upstream's release, it never takes the counter
// below 0 and refreshes the TTL only while the counter stays above 0.
//
//	KEYS: counter, lease set
//	ARGV: ttl s, lease id
//	returns: 1 when the unit was given back, 0 when it had been already
var releaseScript = newScript(`
local held = redis.call('ZREM', KEYS[2], ARGV[2])
` + leasePrelude + `
if not cur or held == 0 then return 0 end
if cur > 0 then
  cur = redis.call('DECR', KEYS[1])
  if cur > 0 then keep(tonumber(ARGV[1]) * 1000, false) end
end
return 1
`)

// renewScript extends the leases of requests still running (a live holder
// keeps its unit however long it runs; only a dead one stops renewing), and
// never re-creates a lease that was reaped or released. It only ever
// lengthens the keys' TTLs.
//
//	KEYS: counter, lease set
//	ARGV: ttl s, then lease id, lease ms pairs
//	returns: the number of leases extended
var renewScript = newScript(leasePrelude + `
if not cur then return 0 end
local n = 0
for i = 2, #ARGV, 2 do
  n = n + redis.call('ZADD', KEYS[2], 'XX', 'CH', now + tonumber(ARGV[i + 1]), ARGV[i])
end
keep(tonumber(ARGV[1]) * 1000, true)
return n
`)

var allScripts = []*script{rateLimitScript, acquireScript, releaseScript, renewScript}
