package headroom

// Replicas that share one account.
//
// Each sluice replica counts only the calls it admitted as "own". With
// several replicas on one queue and one pool, each would read the other
// replicas' batch as traffic sluice does not send ("others"): it keeps too
// little batch and takes back calls that are not in the way. With an
// account (gate_params.account_redis), at every reading each replica
// publishes its own in flight (per pod with dispatch "pods", one number
// pool-wide with dispatch "gateway") and reads the sum of the other live
// replicas', in the same Redis round trip, beside its scrape of the pods:
//
//	peers_i   = the other replicas' calls on pod i (or the pool)
//	others_i  = max(0, running_i + ceil(waiting_weight × waiting_i) − own_i − peers_i)
//	allowed_i = the rule's limit for the batch of every replica together
//	limit_i   = this replica's part of allowed_i (share):
//	  room  R = allowed_i − own_i − peers_i ≥ 0: own_i + its 1/n of R
//	  excess E = own_i + peers_i − allowed_i > 0: own_i less its part of E,
//	    in proportion to what it holds there
//
// own_i and peers_i count the calls released within the release grace in
// others_i (a call taken back is on its pod until the pod's next step).
// With dispatch "pods" the split (R, E and the parts) counts the calls
// running now instead, and each replica publishes them per pod beside
// its in flight: a call released within the grace has left its seat, or
// is leaving it, and one replica alone measures its limit against what
// runs (the evictor takes back what runs over it). Counted in the split,
// a call one replica finished and placed again, or took back and still
// counted, was an excess of one that no replica's calls made, and the
// replica placed first in the order took back a call for it.
//
// Each replica also publishes, with dispatch "pods", the peak of others
// its own readings hold per pod (held_i), and a pod's rule holds the
// highest of its own and the other live replicas' published peaks. Each
// replica reads the pods at its own times, so each held the peaks its
// readings happened to see: in the simulation two replicas' limits for a
// pod differed at 38 % of their readings (three: 48 %; 12 % and 14 %
// holding the highest), and the replica with the
// highest limit placed the calls that the one with the lowest took back
// (its part of an excess no single replica would have seen). Holding the
// highest peak, the replicas agree on each pod's limit as one replica
// reading as often as all of them would. A replica publishes its own
// readings' peak, not the highest it holds, so a peak ends when the hold
// of the replica that read it does (or when that replica's field expires,
// within account_ttl); a replica without a hold holds no peak, the
// others' neither. In a deterministic simulation
// (account_pods_sim_test.go: 2 pods, interactive traffic rising and
// falling, batch calls that finish, three seeds) two and three replicas
// took back 0.322 and 0.327 calls per placed call against one replica's
// 0.288; with the split by the calls running alone 0.317 and 0.330, with
// the peaks alone 0.302 and 0.312, with both 0.269 and 0.266, completing
// more calls than one replica (1,062 and 1,063 against 1,047; 1,086 and
// 1,093 before): while the replicas' limits differ, the split's precision
// hardly matters; once they agree, the calls released within the grace
// made most of the rest.
//
// The parts add up to R and E exactly, whatever the replicas hold: the
// replicas are put in one order (their ids sorted, rotated by one place
// every 200 refresh intervals so that none is always last), and the replica
// at place k takes back ceil(E × C_{k+1} / T) − ceil(E × C_k / T) of E,
// C_k being what the replicas before it hold and T what all hold (so two
// replicas that both see an excess E take back E between them, not 2E);
// its part of R is floor(R × (k+1) / n) − floor(R × k / n). With
// dispatch "pods" a request that finds no room in this replica's part of
// any pod while another replica has room goes back to the queue (see
// handBack).
//
// Each replica sees the others as of their last exchange, up to a refresh
// interval old, and a replica admits (or places) its calls just after its
// readings: a call another replica admitted since its last exchange is on
// the pods but not yet in the account. Read as other traffic, it was a
// one-reading rise of others that the hold kept for its length, after the
// account counted the call as well, so the limit stayed a seat low and, on
// a full pool, a replica took back a call that was in nobody's way (with
// two replicas, 30 % more take-backs per batch request than one, issue
// 42). So a rise that the other live replicas' fresh calls could explain
// waits for the next reading:
//
//	fresh_i     = the sum of the room the other live replicas published for i
//	            + pending_prefills (dispatch "pods"; 0 pool-wide) for each
//	              one that published none
//	others_i(t) = max(raw_i(t) − fresh_i, min(raw_i(t), raw_i(t−1)))
//
// raw being others as above, t this reading and t−1 the last: a rise of
// at most fresh_i counts from the next reading on (by then the peers have
// published their calls, and a rise that stays is other traffic), the
// part of a rise beyond it at once, a fall at once (confirmed).
//
// With dispatch "gateway" each replica publishes, beside its in flight,
// its room: how many calls more than it publishes it may have on the pool
// before its next exchange, its limit as the last reading gave it (at
// most max_concurrency) less its in flight as published. The calls
// released within the release grace are in that in flight: they have
// left the pool (a completion leaves at once), so the calls that replace
// them add nothing the others do not count already. It keeps to it: with
// other live replicas a reading's limit is at most the last reading's, or
// what it runs when that is more (bounded), so a rise of its limit takes
// effect one reading late, once the room that covers it is published (a
// call taken back or cancelled that is still on its pod for a step and is
// replaced at once is the exception: the others count it at once, as
// before the rooms). With dispatch "pods" a replica places at most
// pending_prefills calls on a pod between two of its readings, a bound
// every replica knows: it publishes no room (its field keeps the old
// format, which older replicas read). Either way it is one round trip per
// reading. The costs: up to fresh_i new interactive requests count one
// reading late (the reserve is what absorbs the arrivals between two
// readings), and a gateway replica with other live replicas fills a rise
// of its limit a reading later. Without other live replicas fresh_i is 0
// and nothing is bounded. A fresh call still waiting for the pod's next
// step counts waiting_weight, not 1: the part beyond 1 is not confirmed
// away, as it is not for a replica's own fresh calls (alone, or once the
// peer has published the call): the replicas see what one replica sees.
// (Counting it too, 2 × pending_prefills per peer at waiting_weight 2,
// delays more of the interactive rises; in one benchmark run it took back
// no fewer.)
//
// The account is a Redis hash per pool (account_key), one field per
// replica: its counts, its room or its calls running and held others, and
// their expiry ("<expiry ms>:3,0,room=live:2,room=live:0,room=held:1,
// room=held:0" with dispatch "pods" on two pods, "<expiry ms>:12,room=4"
// pool-wide), set and read by one Lua script that reads the time from
// Redis (TIME), so replica clocks do not matter; the script drops expired
// fields. A replica that dies stops counting, its calls, its room and its
// peaks, within account_ttl; one that closes its gate removes itself at
// once.
//
// In a rolling upgrade the formats meet. A field without room (an older
// sluice) is a replica that published none: pending_prefills per pod with
// dispatch "pods" (what every version places at most), 0 pool-wide. A
// "pods" field without calls running counts its in flight as running
// (the split of an excess may then miss by the calls it released within
// the grace, as before), and without held others holds no peak. The
// running calls and held others start with "room=" so that the version
// before them, which reads every other token as a count, reads the
// field's counts right (and, its rooms not matching them one for one, as
// a replica that published no room, as every "pods" replica was to it);
// the version before rooms reads them as counts, so a "pods" replica of
// that version on several pods does not count a newer one until it is
// upgraded. An
// older gateway replica admits up to its whole part of the room and
// nothing bounds its fresh calls, so they count at once, as they did
// before the room: a rise of others is never held back on a bound nobody
// gave (taking it for unbounded would hold back every interactive rise).
// An older replica reads a new pool-wide field by its numbers, "room=4"
// being none (0): its calls, summed as before. (An older replica with
// dispatch "pods" on exactly two pods would read it as calls on its first
// pod; the replicas should share a dispatch anyway.) A
// failed exchange (Redis down) does not stop the gate: it keeps the last
// peers for up to account_ttl, then counts none (each replica alone, as
// without an account), and logs once per outage.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// AccountDeployment as gate_params.account_redis names the deployment's
// Redis (REDIS_URL, with its redis_mode, redis_addrs, redis_master_name).
const AccountDeployment = "deployment"

// Account defaults.
const (
	// DefaultAccountKeyPrefix starts the default account_key; a hash of
	// the sorted endpoints follows.
	DefaultAccountKeyPrefix = "sluice:headroom:account:"
	// MinAccountTTL is the least default account_ttl (the default is
	// 10 refresh intervals).
	MinAccountTTL = time.Second
	// accountTimeoutMin bounds one exchange from below (the bound is two
	// refresh intervals).
	accountTimeoutMin = 250 * time.Millisecond
	// accountTurnIntervals is how many refresh intervals the replicas'
	// order holds before it rotates by one place (see exchangeScript):
	// around a rotation replicas reading on either side of it may both
	// take a room's remainder, so it is rare (10 s at the default
	// refresh); a replica left out of a small room meanwhile hands its
	// requests back (handBack).
	accountTurnIntervals = 200
)

// Account is where the replicas gating one pool share their in-flight
// counts. It is safe for concurrent use.
type Account interface {
	// Exchange publishes what this replica holds, mine, and returns
	// what the other live replicas hold (see Peers). What it published
	// stays this replica's until it is replaced or expires.
	Exchange(ctx context.Context, mine Holding) (Peers, error)
	// Close withdraws this replica's counts, as far as it can, and
	// releases the account's resources.
	Close() error
}

// Holding is what one replica publishes at an exchange: one element per
// pod, in the order of the sorted endpoints (dispatch "pods"), or one
// pool-wide (dispatch "gateway").
type Holding struct {
	// InFlight is its calls, those released within the release grace
	// included (a call taken back is on its pod until the pod's next
	// step: the others must not read it as other traffic).
	InFlight []int
	// Room is, per element, the most calls it may still admit before its
	// next exchange (nil: it publishes none, as with dispatch "pods",
	// whose bound pending_prefills every replica knows).
	Room []int
	// Live is, per element, its calls running now: InFlight less those
	// released within the grace, which have left their seats or are
	// leaving them (nil: InFlight; dispatch "gateway").
	Live []int
	// Held is, per element, the highest others of its own readings
	// within the hold (nil: none; dispatch "gateway").
	Held []int
}

// Peers is what the other live replicas hold, as one Exchange saw it.
type Peers struct {
	// InFlight is, per element of mine, the sum of the other replicas'
	// counts (nil: none).
	InFlight []int
	// Live is, per element, the sum of the other replicas' calls running
	// now (Holding.Live; InFlight for a replica that published none).
	Live []int
	// Below is, per element, the part of Live held by the replicas
	// placed before this one in the replicas' order (one every replica
	// sees alike; the Redis account rotates it).
	Below []int
	// Held is, per element, the highest others any other replica's own
	// readings held (Holding.Held; 0 from a replica that published none).
	Held []int
	// Room is, per element, the sum of the room the Bounded replicas
	// published (the most each may still admit before its next exchange;
	// see sharing.confirmed).
	Room []int
	// Replicas is how many other replicas are live; Rank this replica's
	// place in the order, in [0, Replicas].
	Replicas, Rank int
	// Bounded is how many of the Replicas published a room; each of the
	// others (dispatch "pods", an older sluice) counts as sharing.fresh.
	Bounded int
}

// at returns element i of xs, 0 past its end.
func at(xs []int, i int) int {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// AccountConfig configures the account a gate shares with the other
// replicas of its deployment (Config.Account). The zero value is no
// account: no peers.
type AccountConfig struct {
	// Redis is the Redis holding the account (gate_params.account_redis:
	// host:port, a redis:// or rediss:// URL carrying credentials, db and
	// TLS, or "deployment" for the deployment's Redis and topology).
	// Empty Address: no account, unless Account is set.
	Redis redisconn.Config
	// Key is the hash holding the pool's account (default
	// DefaultAccountKeyPrefix + a hash of the sorted endpoints, so that
	// every replica reading the same pods shares it).
	Key string
	// Replica is this replica's id, unique among the replicas (default
	// hostname-pid).
	Replica string
	// TTL is how long a replica's counts count after its last exchange
	// (default 10 refresh intervals, at least MinAccountTTL; at least two
	// refresh intervals).
	TTL time.Duration
	// Account, when set, is used instead of Redis (embedding, tests).
	Account Account
}

// enabled reports whether an account is configured.
func (a AccountConfig) enabled() bool { return a.Account != nil || a.Redis.Address != "" }

// setDefaults fills the zero fields of an enabled account.
func (a *AccountConfig) setDefaults(endpoints []string, refresh time.Duration) {
	if !a.enabled() {
		return
	}
	if a.Key == "" {
		sum := sha256.Sum256([]byte(strings.Join(slices.Sorted(slices.Values(endpoints)), "\n")))
		a.Key = DefaultAccountKeyPrefix + hex.EncodeToString(sum[:8])
	}
	if a.Replica == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "sluice"
		}
		a.Replica = host + "-" + strconv.Itoa(os.Getpid())
	}
	if a.TTL == 0 {
		a.TTL = max(MinAccountTTL, 10*refresh)
	}
}

// validate reports every unusable account parameter.
func (a AccountConfig) validate(refresh time.Duration) []error {
	if !a.enabled() {
		if a.Key != "" || a.Replica != "" || a.TTL != 0 {
			return []error{errors.New("gate_params.account_key, replica and account_ttl need gate_params.account_redis (the Redis the replicas share)")}
		}
		return nil
	}
	var errs []error
	if a.Account == nil {
		if _, _, err := net.SplitHostPort(a.Redis.Address); err != nil && !redisconn.IsURL(a.Redis.Address) {
			errs = append(errs, fmt.Errorf("gate_params.account_redis: %q, want host:port, a redis:// or rediss:// URL, or %q", a.Redis.Address, AccountDeployment))
		} else if _, err := a.Redis.Options(); err != nil {
			errs = append(errs, fmt.Errorf("gate_params.account_redis: %w", err))
		}
	}
	if a.Replica == "" || strings.ContainsAny(a.Replica, ":, \t\r\n") {
		errs = append(errs, fmt.Errorf("gate_params.replica: %q, want a non-empty id without spaces, ':' or ','", a.Replica))
	}
	if a.TTL < 2*refresh {
		errs = append(errs, fmt.Errorf("gate_params.account_ttl: %v, want at least two refresh intervals (%v): a live replica's counts must not expire between its readings", a.TTL, 2*refresh))
	}
	return errs
}

// accountParams reads account_redis, account_key, replica and
// account_ttl.
func accountParams(p gate.Params, env gate.Env) (AccountConfig, error) {
	var a AccountConfig
	switch addr := strings.TrimSpace(p.String("account_redis", "")); addr {
	case "":
	case AccountDeployment:
		if env.RedisURL == "" {
			return a, errors.New(`gate_params.account_redis: "deployment", but the deployment names no Redis (REDIS_URL)`)
		}
		top, err := redisclient.ParseTopology(env.RedisMode, env.RedisAddrs, env.RedisMasterName)
		if err != nil {
			return a, fmt.Errorf("gate_params.account_redis: the deployment's redis_mode, redis_addrs, redis_master_name: %w", err)
		}
		a.Redis = redisconn.Config{Address: env.RedisURL, Mode: top.Mode, Addrs: top.Addrs, MasterName: top.MasterName}
	default:
		a.Redis = redisconn.Config{Address: addr}
	}
	a.Key = p.String("account_key", "")
	a.Replica = p.String("replica", "")
	var err error
	if a.TTL, err = p.Duration("account_ttl", 0); err != nil {
		return a, err
	}
	if p.Has("account_ttl") && a.TTL == 0 {
		a.TTL = -1 // refused by validate, not defaulted
	}
	return a, nil
}

// exchangeScript sets this replica's field of the pool's hash (KEYS[1]) to
// its counts and room (ARGV[3]: "3,0,2", or "12,room=4" with a room per
// count, or with dispatch "pods" "3,0,2,room=live:2,room=live:0,
// room=live:2,room=held:1,room=held:0,room=held:3": its calls running now
// and its held others per count) and their expiry, now + ARGV[2] ms by
// Redis' clock, drops the expired fields, and returns {live other
// replicas, this replica's place in the order, how many others published
// a room, sums per element, sums of the calls running now (the counts of
// a field without them), the same of the replicas placed before it, sums
// of the rooms published, the highest held others published}. A token
// "room=<name>:<n>" is no room to this script; it starts with "room=" so
// that the version before it, which reads any "room=" token as a room and
// any other as a count, reads the counts right (and, the rooms not
// matching the counts one for one, the replica as one that published no
// room, as every "pods" replica did). The
// order is the replicas' ids sorted, rotated by one place every ARGV[4]
// ms, so that no replica is always the one that gets no part of a small
// room or takes back a small excess. A replica publishing several numbers
// while this one publishes one is counted by their sum (and its rooms'); one
// publishing one number while this one publishes several is not counted
// (its calls cannot be placed on a pod). A field whose rooms do not match
// its counts one for one (an older sluice's has none) published no room.
var exchangeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local function parse(v)
  local c, r, l, h = {}, {}, {}, {}
  for x in string.gmatch(v, '[^,]+') do
    local room = string.match(x, '^room=(.*)$')
    local name, num = string.match(room or '', '^(%a+):(.*)$')
    if name == 'live' then l[#l + 1] = tonumber(num) or 0
    elseif name == 'held' then h[#h + 1] = tonumber(num) or 0
    elseif name then
    elseif room then r[#r + 1] = tonumber(room) or 0
    else c[#c + 1] = tonumber(x) or 0 end
  end
  if #r ~= #c then r = nil end
  if #l ~= #c then l = c end
  if #h ~= #c then h = nil end
  return c, r, l, h
end
local function total(xs)
  local s = 0
  for j = 1, #xs do s = s + xs[j] end
  return s
end
local function highest(xs)
  local s = 0
  for j = 1, #xs do s = math.max(s, xs[j]) end
  return s
end
local n = #parse(ARGV[3])
redis.call('HSET', KEYS[1], me, (now + ttl) .. ':' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
local ids, counts, rooms, lives, helds = {me}, {}, {}, {}, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local sep = string.find(v, ':', 1, true)
  local exp = sep and tonumber(string.sub(v, 1, sep - 1))
  if not exp or exp <= now then
    redis.call('HDEL', KEYS[1], id)
  elseif id ~= me then
    local c, r, l, h = parse(string.sub(v, sep + 1))
    if #c ~= n and n == 1 then
      c, r, l, h = {total(c)}, r and {total(r)}, {total(l)}, h and {highest(h)}
    end
    if #c == n then
      ids[#ids + 1] = id
      counts[id], rooms[id], lives[id], helds[id] = c, r, l, h
    end
  end
end
table.sort(ids)
local live = #ids
local turn = math.floor(now / period) % live
local place = {}
for k, id in ipairs(ids) do place[id] = (k - 1 + turn) % live end
local sum, run, below, room, held, bounded = {}, {}, {}, {}, {}, 0
for j = 1, n do sum[j], run[j], below[j], room[j], held[j] = 0, 0, 0, 0, 0 end
for id, c in pairs(counts) do
  local before, r, l, h = place[id] < place[me], rooms[id], lives[id], helds[id]
  if r then bounded = bounded + 1 end
  for j = 1, n do
    sum[j] = sum[j] + c[j]
    run[j] = run[j] + l[j]
    if before then below[j] = below[j] + l[j] end
    if r then room[j] = room[j] + r[j] end
    if h then held[j] = math.max(held[j], h[j]) end
  end
end
local out = {live - 1, place[me], bounded}
for _, xs in ipairs({sum, run, below, room, held}) do
  for j = 1, n do out[#out + 1] = xs[j] end
end
return out
`)

// redisAccount is an Account in a Redis hash (see exchangeScript).
type redisAccount struct {
	client  redis.UniversalClient
	where   string // the server, without credentials
	key     string
	replica string
	ttl     time.Duration
	turn    time.Duration // how long the replicas' order stays before it rotates
	once    sync.Once
}

// newRedisAccount returns the account of a, whose replicas' order
// rotates every turn; it does not connect yet.
func newRedisAccount(a AccountConfig, turn time.Duration) (*redisAccount, error) {
	o, err := a.Redis.Options()
	if err != nil {
		return nil, fmt.Errorf("gate_params.account_redis: %w", err)
	}
	// one exchange at a time per gate, bounded by its context; a failed
	// one is asked again at the next reading
	o.Tune(func(c *redisclient.Common) { c.PoolSize = 2 })
	return &redisAccount{client: o.New(), where: o.Where(), key: a.Key, replica: a.Replica, ttl: a.TTL, turn: max(time.Millisecond, turn)}, nil
}

// roomToken starts each of a field's rooms, and liveToken and heldToken
// its calls running now and its held others (see exchangeScript).
const (
	roomToken = "room="
	liveToken = roomToken + "live:"
	heldToken = roomToken + "held:"
)

// Exchange implements Account.
func (r *redisAccount) Exchange(ctx context.Context, mine Holding) (Peers, error) {
	n := len(mine.InFlight)
	parts := make([]string, 0, 4*n)
	for _, c := range mine.InFlight {
		parts = append(parts, strconv.Itoa(max(0, c)))
	}
	for _, f := range []struct {
		token string
		xs    []int
	}{{roomToken, mine.Room}, {liveToken, mine.Live}, {heldToken, mine.Held}} {
		if f.xs != nil {
			for i := range n {
				parts = append(parts, f.token+strconv.Itoa(max(0, at(f.xs, i))))
			}
		}
	}
	vals, err := exchangeScript.Run(ctx, r.client, []string{r.key}, r.replica, r.ttl.Milliseconds(), strings.Join(parts, ","),
		r.turn.Milliseconds()).Int64Slice()
	if err != nil {
		return Peers{}, fmt.Errorf("replica account %s at %s: %w", r.key, r.where, err)
	}
	if len(vals) != 3+5*n {
		return Peers{}, fmt.Errorf("replica account %s at %s: %d values for %d counts", r.key, r.where, len(vals), n)
	}
	p := Peers{Replicas: int(vals[0]), Rank: int(vals[1]), Bounded: int(vals[2])}
	for k, xs := range []*[]int{&p.InFlight, &p.Live, &p.Below, &p.Room, &p.Held} {
		*xs = make([]int, n)
		for i := range n {
			(*xs)[i] = int(vals[3+k*n+i])
		}
	}
	return p, nil
}

// Close implements Account: it removes this replica's field, so the
// others stop counting it at their next reading, and closes the client.
func (r *redisAccount) Close() error {
	var err error
	r.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = r.client.HDel(ctx, r.key, r.replica).Err() // gone within the TTL anyway
		if cerr := r.client.Close(); cerr != nil {
			err = fmt.Errorf("close replica account client: %w", cerr)
		}
	})
	return err
}

// sharing is the gate's side of its account: the order the counts travel
// in, the last peers and how long they are kept when the account fails.
type sharing struct {
	acct    Account
	order   []int // order[k]: the endpoint index of the k-th sorted endpoint
	ttl     time.Duration
	timeout time.Duration
	log     *slog.Logger
	what    string // for Describe and the log

	// fresh is how many calls one other replica that published no room
	// (Peers.Bounded) may have placed on a pod since its last exchange, on
	// the pod but not yet in the account (see confirmed): with dispatch
	// "pods" pending_prefills, which bounds every version's placements; 0
	// pool-wide, where such a replica is an older sluice, which admits up
	// to its whole part of the room: its rises count at once, as before
	// (see the file's notes on rolling upgrades).
	fresh int
	// raw is each pod's others as the last reading computed them, before
	// confirmed; g.mu guards it.
	raw []int

	mu     sync.Mutex
	last   Peers // in the endpoints' order
	lastOK time.Time
	down   bool // an outage is logged
}

// newSharing returns the gate's account, nil without one.
func newSharing(cfg Config) (*sharing, error) {
	a := cfg.Account
	if !a.enabled() {
		return nil, nil
	}
	s := &sharing{acct: a.Account, ttl: a.TTL, timeout: max(accountTimeoutMin, 2*cfg.RefreshInterval), log: cfg.Logger,
		what: fmt.Sprintf("%s as replica %s (ttl %v)", a.Key, a.Replica, a.TTL)}
	if s.acct == nil {
		r, err := newRedisAccount(a, accountTurnIntervals*cfg.RefreshInterval)
		if err != nil {
			return nil, err
		}
		s.acct, s.what = r, fmt.Sprintf("%s at %s as replica %s (ttl %v)", a.Key, r.where, a.Replica, a.TTL)
	}
	if cfg.Dispatch == DispatchPods {
		s.fresh = cfg.PendingPrefills
	}
	s.order = make([]int, len(cfg.Endpoints))
	for i := range s.order {
		s.order[i] = i
	}
	slices.SortStableFunc(s.order, func(x, y int) int { return strings.Compare(cfg.Endpoints[x], cfg.Endpoints[y]) })
	return s, nil
}

// exchange publishes mine (in the endpoints' order; one element
// pool-wide) and returns the peers to count at now and whether they were
// published: the account's answer, or on a failure the last answer while
// it is younger than the TTL, else none.
func (s *sharing) exchange(ctx context.Context, now time.Time, mine Holding) (Peers, bool) {
	order := s.order
	if len(mine.InFlight) != len(order) {
		order = []int{0} // pool-wide
	}
	// sorted is xs in the sorted endpoints' order (nil stays nil)
	sorted := func(xs []int) []int {
		if xs == nil {
			return nil
		}
		out := make([]int, len(order))
		for k, i := range order {
			out[k] = at(xs, i)
		}
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	p, err := s.acct.Exchange(ctx, Holding{InFlight: sorted(mine.InFlight), Room: sorted(mine.Room), Live: sorted(mine.Live),
		Held: sorted(mine.Held)})
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if !s.down {
			s.down = true
			s.log.Warn("replica account failed: keeping the other replicas' last counts for up to account_ttl, then counting none, until it answers again",
				"account", s.what, "err", err)
		}
		if s.lastOK.IsZero() || now.Sub(s.lastOK) > s.ttl {
			s.last = Peers{}
		}
		return s.last, false
	}
	if s.down {
		s.down = false
		s.log.Info("replica account answers again", "account", s.what)
	}
	out := Peers{Replicas: p.Replicas, Rank: p.Rank, Bounded: p.Bounded,
		InFlight: make([]int, len(order)), Live: make([]int, len(order)), Below: make([]int, len(order)), Room: make([]int, len(order)),
		Held: make([]int, len(order))}
	for k, i := range order {
		out.InFlight[i], out.Below[i], out.Room[i], out.Held[i] = at(p.InFlight, k), at(p.Below, k), at(p.Room, k), at(p.Held, k)
		out.Live[i] = at(p.InFlight, k)
		if p.Live != nil {
			out.Live[i] = at(p.Live, k)
		}
	}
	s.last, s.lastOK = out, now
	return out, true
}

// confirmed returns the others of pod i (pool-wide: i = 0) to count at
// this reading, of others as computed from the gauges less every
// replica's calls known (raw_i in the file's notes): a rise over the last
// reading's that the other replicas' calls admitted since their last
// exchange could explain (the rooms they published, fresh for each that
// published none) counts only from the next reading on, when they have
// published those calls; the part of a rise beyond that counts at once.
// Without an account or other replicas it is others. g.mu is held.
func (s *sharing) confirmed(i, others int, p Peers) int {
	if s == nil {
		return others
	}
	if len(s.raw) <= i {
		s.raw = append(s.raw, make([]int, i+1-len(s.raw))...)
		s.raw[i] = others
	}
	prev := s.raw[i]
	s.raw[i] = others
	fresh := at(p.Room, i) + s.fresh*max(0, p.Replicas-p.Bounded)
	return max(others-fresh, min(others, prev))
}

// close closes the account.
func (s *sharing) close() error {
	if s == nil {
		return nil
	}
	return s.acct.Close()
}

// describe is the account's part of Describe.
func (s *sharing) describe() string {
	if s == nil {
		return ""
	}
	return "; counts the other replicas' in flight as its own through the account " + s.what
}

// exchange starts the reading's exchange with the account (nil: none),
// beside the scrape of the pods, and returns what waits for its answer:
// the peers and, pool-wide, the bound that goes with the room this
// replica published (its limit until its next exchange, see the file's
// notes), -1 when none was published.
func (g *Gate) exchange(ctx context.Context) func() (Peers, int) {
	if g.share == nil {
		return func() (Peers, int) { return Peers{}, -1 }
	}
	g.mu.Lock()
	now := g.now()
	var mine Holding
	bound := -1
	if g.pods == nil {
		mine.InFlight = []int{g.own.at(now, g.cfg.ReleaseGrace)}
		// until the next exchange the queue's limit is at most the last
		// reading's (and max_concurrency), or what runs when that is more:
		// what it runs then exceeds what it published by at most that
		// limit less mine, the calls released within the grace being off
		// the pods (refilling them adds nothing the others do not count)
		limit := min(g.ruled, g.cfg.MaxConcurrency)
		mine.Room = []int{max(0, limit-mine.InFlight[0])}
		bound = max(g.own.live(), limit)
	} else {
		// per pod: the calls running now, which the pods' limits are
		// split by, and the peak of others this replica's own readings
		// hold, which the others hold too (see the file's notes)
		for _, p := range g.pods {
			mine.InFlight = append(mine.InFlight, p.own.at(now, g.cfg.ReleaseGrace))
			mine.Live = append(mine.Live, p.own.live())
			mine.Held = append(mine.Held, p.held)
		}
	}
	g.mu.Unlock()
	type answer struct {
		peers Peers
		ok    bool
	}
	done := make(chan answer, 1)
	go func() {
		p, ok := g.share.exchange(ctx, now, mine)
		done <- answer{p, ok}
	}()
	return func() (Peers, int) {
		a := <-done
		if !a.ok {
			return a.peers, -1
		}
		return a.peers, bound
	}
}

// bounded returns limit, this replica's part of the pool (dispatch
// "gateway") as the rule and share give it, held to bound, the last
// reading's limit or what ran at this reading's exchange when that is more
// (-1: no room published), while other replicas read the room that goes
// with it (see the file's notes); g.ruled keeps limit, whose room the next
// exchange publishes. The bound never takes a call back that limit
// leaves: it is at least min(limit, what ran). g.mu is held.
func (g *Gate) bounded(limit, bound int, p Peers) int {
	g.ruled = limit
	if bound < 0 || p.Replicas == 0 {
		return limit
	}
	return min(limit, bound)
}

// handBack reports, with an account and dispatch "pods", whether a
// request no pod takes should go back to the queue rather than wait here:
// this replica has no room left on any pod while the other replicas have
// some. Waiting here, it would wait for this replica's part of the pool
// while another replica could place it now (a replica that claimed the
// most urgent requests at once would run them on 1/n of the pool); back in
// the queue, a replica with room claims it, the earliest deadline first.
// This replica does not claim it again at once: its credits are its part.
// g.mu is held.
func (g *Gate) handBack() bool {
	if g.share == nil || g.pods == nil {
		return false
	}
	mine, theirs := 0, 0
	for _, p := range g.pods {
		own := p.own.live()
		mine += max(0, p.last.Allowed-own)
		if p.last.Queued == 0 { // a pod where a request waits takes no batch from anyone
			theirs += max(0, p.last.Pooled-own-p.last.PeersLive)
		}
	}
	return mine == 0 && theirs > 0
}

// share is this replica's limit out of allowed, the limit for the batch
// of every replica together, on a pod (or the pool) where it runs own
// and the other replicas p.Live, p.Below of those run by the replicas
// ranked before it of the others live (see the file's notes). Without
// peers it is allowed.
func share(allowed, own int, p Peers, i int) int {
	peers, below := at(p.Live, i), at(p.Below, i)
	total := own + peers
	if allowed >= total {
		room, n := allowed-total, p.Replicas+1
		return own + room*(p.Rank+1)/n - room*p.Rank/n
	}
	excess := total - allowed
	return own - (ceilDiv(excess*(below+own), total) - ceilDiv(excess*below, total))
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int) int { return (a + b - 1) / b }
