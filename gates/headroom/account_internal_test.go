package headroom

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The replicas' parts of a limit add up to it exactly, whatever each
// holds, when they see one another as they are: an excess is taken back
// once between them (each part within what that replica holds), a room
// is handed out once (each part at least what that replica holds).
func TestShareAddsUp(t *testing.T) {
	for _, holds := range [][]int{{0}, {5}, {12, 4}, {0, 0}, {3, 0, 2}, {1, 1, 1}, {7, 2, 9, 0}} {
		total := 0
		for _, h := range holds {
			total += h
		}
		for allowed := 0; allowed <= total+7; allowed++ {
			sum := 0
			for k, own := range holds {
				p := Peers{Replicas: len(holds) - 1, Rank: k, Live: []int{total - own}, Below: []int{0}}
				for _, h := range holds[:k] {
					p.Below[0] += h
				}
				limit := share(allowed, own, p, 0)
				switch {
				case allowed < total && (limit < 0 || limit > own):
					t.Errorf("holds %v allowed %d: replica %d's limit %d outside [0, %d]", holds, allowed, k, limit, own)
				case allowed >= total && limit < own:
					t.Errorf("holds %v allowed %d: replica %d's limit %d below what it holds (%d)", holds, allowed, k, limit, own)
				}
				sum += limit
			}
			if sum != allowed {
				t.Errorf("holds %v allowed %d: the replicas' limits add up to %d", holds, allowed, sum)
			}
		}
	}
	// alone (no account): the limit is the rule's
	if got := share(3, 8, Peers{}, 0); got != 3 {
		t.Errorf("share alone = %d, want 3", got)
	}
}

// The replicas' order rotates: each replica is in turn first and last,
// and what it is told the replicas before it hold follows its place.
func TestAccountOrderRotates(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	acct := func(id string) *redisAccount { return testAccount(t, r.Addr, id, time.Second, 20*time.Millisecond) }
	a, b := acct("a"), acct("b")
	ctx := context.Background()
	seen := map[int]bool{}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(seen) < 2; time.Sleep(7 * time.Millisecond) {
		if _, err := b.Exchange(ctx, Holding{InFlight: []int{5}}); err != nil {
			t.Fatal(err)
		}
		p, err := a.Exchange(ctx, Holding{InFlight: []int{3}})
		if err != nil {
			t.Fatal(err)
		}
		if p.Replicas != 1 || p.InFlight[0] != 5 || p.Below[0] != 5*p.Rank {
			t.Fatalf("a was told %+v, want 1 other replica holding 5, all of it before a when a is second", p)
		}
		seen[p.Rank] = true
	}
	if !seen[0] || !seen[1] {
		t.Errorf("a's places %v, want both 0 and 1 within 2s at a turn of 20ms", seen)
	}
}

// A rise of others that the other replicas' fresh calls could explain
// counts from the next reading on, a larger one less that much at once,
// a fall at once; alone (or without an account) every rise counts at
// once.
func TestConfirmedOthers(t *testing.T) {
	s := &sharing{fresh: 1}
	two := Peers{Replicas: 2}
	for k, c := range []struct {
		raw  int
		p    Peers
		want int
	}{
		{5, two, 5}, // the first reading counts as read
		{7, two, 5}, // two peers: a rise of 2 waits
		{7, two, 7}, // and counts once it stays
		{10, two, 8},
		{3, two, 3}, // a fall counts at once
		{4, Peers{}, 4},
		{6, Peers{Replicas: 1}, 5},
		{5, Peers{Replicas: 1}, 5},
	} {
		if got := s.confirmed(0, c.raw, c.p); got != c.want {
			t.Errorf("reading %d: others %d with %d other replicas counted as %d, want %d", k, c.raw, c.p.Replicas, got, c.want)
		}
	}
	var none *sharing
	if got := none.confirmed(0, 9, two); got != 9 {
		t.Errorf("without an account: %d, want 9", got)
	}
}

// Rooms travel with the counts: a replica that publishes none (an older
// sluice's format, or dispatch "pods") is counted but not Bounded; a
// replica publishing several rooms while this one publishes one count is
// counted by their sum, as its calls are.
func TestAccountRooms(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	acct := func(id string) *redisAccount { return testAccount(t, r.Addr, id, time.Minute, time.Hour) }
	ctx := context.Background()
	for _, c := range []struct {
		id         string
		mine, room []int
	}{
		{"b", []int{5}, []int{2}},       // gateway
		{"c", []int{1, 2}, nil},         // pods, as every version publishes them
		{"d", []int{1, 1}, []int{1, 0}}, // several rooms
	} {
		if _, err := acct(c.id).Exchange(ctx, Holding{InFlight: c.mine, Room: c.room}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := acct("a").Exchange(ctx, Holding{InFlight: []int{3}, Room: []int{4}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Replicas != 3 || p.InFlight[0] != 10 || p.Bounded != 2 || p.Room[0] != 3 {
		t.Errorf("a gateway replica was told %+v; want 3 replicas holding 10, 2 of them bounded with a room of 3", p)
	}
	// a replica with two pods counts the ones with two counts only
	p, err = acct("e").Exchange(ctx, Holding{InFlight: []int{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Replicas != 2 || !slices.Equal(p.InFlight, []int{2, 3}) || p.Bounded != 1 || !slices.Equal(p.Room, []int{1, 0}) {
		t.Errorf("a pods replica was told %+v; want 2 replicas holding 2 and 3, 1 bounded with rooms 1 and 0", p)
	}
}

// olderExchangeScript is exchangeScript as it was before rooms (sluice
// 5a6d88c), for a rolling upgrade's older replicas.
var olderExchangeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local n = 0
for _ in string.gmatch(ARGV[3], '[^,]+') do n = n + 1 end
redis.call('HSET', KEYS[1], me, (now + ttl) .. ':' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
local ids, counts = {me}, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local sep = string.find(v, ':', 1, true)
  local exp = sep and tonumber(string.sub(v, 1, sep - 1))
  if not exp or exp <= now then
    redis.call('HDEL', KEYS[1], id)
  elseif id ~= me then
    local c = {}
    for x in string.gmatch(string.sub(v, sep + 1), '[^,]+') do c[#c + 1] = tonumber(x) or 0 end
    if #c ~= n and n == 1 then
      local s = 0
      for j = 1, #c do s = s + c[j] end
      c = {s}
    end
    if #c == n then
      ids[#ids + 1] = id
      counts[id] = c
    end
  end
end
table.sort(ids)
local live = #ids
local turn = math.floor(now / period) % live
local place = {}
for k, id in ipairs(ids) do place[id] = (k - 1 + turn) % live end
local sum, below = {}, {}
for j = 1, n do sum[j], below[j] = 0, 0 end
for id, c in pairs(counts) do
  local before = place[id] < place[me]
  for j = 1, n do
    sum[j] = sum[j] + c[j]
    if before then below[j] = below[j] + c[j] end
  end
end
local out = {live - 1, place[me]}
for j = 1, n do out[#out + 1] = sum[j] end
for j = 1, n do out[#out + 1] = below[j] end
return out
`)

// In a rolling upgrade an older gateway replica counts a newer one's
// calls right (its room is no number to it), and the newer one counts
// the older one's as a replica that published no room.
func TestAccountOlderReplica(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	a := testAccount(t, r.Addr, "a", time.Minute, time.Hour)
	ctx := context.Background()
	if _, err := a.Exchange(ctx, Holding{InFlight: []int{5}, Room: []int{2}}); err != nil {
		t.Fatal(err)
	}
	c := testenv.RedisClient(t, r.URL)
	vals, err := olderExchangeScript.Run(ctx, c, []string{"k"}, "old", time.Minute.Milliseconds(), "3", time.Hour.Milliseconds()).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 4 || vals[0] != 1 || vals[2] != 5 {
		t.Errorf("the older replica was told %v; want 1 other replica holding 5", vals)
	}
	p, err := a.Exchange(ctx, Holding{InFlight: []int{5}, Room: []int{2}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Replicas != 1 || p.InFlight[0] != 3 || p.Bounded != 0 || p.Room[0] != 0 {
		t.Errorf("the newer replica was told %+v; want 1 replica holding 3, none bounded", p)
	}
}

// The other replicas' published rooms bound how much of a rise waits for
// the next reading; a replica that published none counts as fresh (0
// pool-wide: its part of a rise counts at once, as before rooms;
// pending_prefills per pod with dispatch "pods").
func TestConfirmedRooms(t *testing.T) {
	s := &sharing{}
	room := func(rooms ...int) Peers {
		p := Peers{Replicas: len(rooms), Room: []int{0}}
		for _, r := range rooms {
			if r >= 0 {
				p.Bounded++
				p.Room[0] += r
			}
		}
		return p
	}
	for k, c := range []struct {
		raw  int
		p    Peers
		want int
	}{
		{5, room(3), 5},
		{8, room(3), 5},      // within the room: waits
		{8, room(3), 8},      // stays: counts
		{13, room(1, 2), 10}, // 2 beyond the rooms count at once
		{13, room(0), 13},
		{15, room(-1), 15}, // an older replica (no room): at once
		{17, room(-1, 1), 16},
		{4, room(5), 4}, // a fall at once
	} {
		if got := s.confirmed(0, c.raw, c.p); got != c.want {
			t.Errorf("reading %d: others %d beside rooms %+v counted as %d, want %d", k, c.raw, c.p, got, c.want)
		}
	}
	pods := &sharing{fresh: 2}
	pods.confirmed(1, 0, Peers{})
	if got := pods.confirmed(1, 9, Peers{Replicas: 2, Bounded: 1, Room: []int{0, 1}}); got != 6 {
		t.Errorf("pods: others 9 beside a room of 1 and a replica without: %d, want 6 (9 less 1 and pending_prefills 2)", got)
	}
}

// With other replicas reading its room, a gateway replica's limit is at
// most what it ran plus that room; alone, or when the exchange failed, it
// is the rule's. Either way the next room is the rule's limit's.
func TestBounded(t *testing.T) {
	g := &Gate{}
	for _, c := range []struct {
		limit, bound int
		p            Peers
		want         int
	}{
		{10, 8, Peers{Replicas: 1}, 8},
		{5, 8, Peers{Replicas: 1}, 5},
		{10, 8, Peers{}, 10},
		{10, -1, Peers{Replicas: 1}, 10},
	} {
		if got := g.bounded(c.limit, c.bound, c.p); got != c.want || g.ruled != c.limit {
			t.Errorf("bounded(%d, %d, %d replicas) = %d (ruled %d), want %d (ruled %d)", c.limit, c.bound, c.p.Replicas, got, g.ruled, c.want, c.limit)
		}
	}
}

// roomsExchangeScript is exchangeScript as it was before the calls running
// now and the held others (sluice 638fc8b), for a rolling upgrade's older
// replicas.
var roomsExchangeScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, period = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local function parse(v)
  local c, r = {}, {}
  for x in string.gmatch(v, '[^,]+') do
    local room = string.match(x, '^room=(.*)$')
    if room then r[#r + 1] = tonumber(room) or 0 else c[#c + 1] = tonumber(x) or 0 end
  end
  if #r ~= #c then r = nil end
  return c, r
end
local function total(xs)
  local s = 0
  for j = 1, #xs do s = s + xs[j] end
  return s
end
local n = #parse(ARGV[3])
redis.call('HSET', KEYS[1], me, (now + ttl) .. ':' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
local ids, counts, rooms = {me}, {}, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local id, v = all[i], all[i + 1]
  local sep = string.find(v, ':', 1, true)
  local exp = sep and tonumber(string.sub(v, 1, sep - 1))
  if not exp or exp <= now then
    redis.call('HDEL', KEYS[1], id)
  elseif id ~= me then
    local c, r = parse(string.sub(v, sep + 1))
    if #c ~= n and n == 1 then
      c, r = {total(c)}, r and {total(r)}
    end
    if #c == n then
      ids[#ids + 1] = id
      counts[id], rooms[id] = c, r
    end
  end
end
table.sort(ids)
local live = #ids
local turn = math.floor(now / period) % live
local place = {}
for k, id in ipairs(ids) do place[id] = (k - 1 + turn) % live end
local sum, below, room, bounded = {}, {}, {}, 0
for j = 1, n do sum[j], below[j], room[j] = 0, 0, 0 end
for id, c in pairs(counts) do
  local before, r = place[id] < place[me], rooms[id]
  if r then bounded = bounded + 1 end
  for j = 1, n do
    sum[j] = sum[j] + c[j]
    if before then below[j] = below[j] + c[j] end
    if r then room[j] = room[j] + r[j] end
  end
end
local out = {live - 1, place[me], bounded}
for j = 1, n do out[#out + 1] = sum[j] end
for j = 1, n do out[#out + 1] = below[j] end
for j = 1, n do out[#out + 1] = room[j] end
return out
`)

// With dispatch "pods" a replica publishes, beside its in flight, its
// calls running now and its readings' held others per pod: the others
// are told the sum of the calls running (a field without them counts its
// in flight), the part of it of the replicas before them, and the highest
// held. The version before reads the counts of such a field right, as a
// replica that published no room.
func TestAccountLiveAndHeld(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	acct := func(id string) *redisAccount { return testAccount(t, r.Addr, id, time.Minute, time.Hour) }
	ctx := context.Background()
	for _, c := range []struct {
		id   string
		mine Holding
	}{
		{"b", Holding{InFlight: []int{4, 2}, Live: []int{3, 2}, Held: []int{1, 5}}},
		{"c", Holding{InFlight: []int{1, 1}}}, // the format before: its in flight runs
		{"d", Holding{InFlight: []int{2, 0}, Live: []int{2, 0}, Held: []int{3, 0}}},
	} {
		if _, err := acct(c.id).Exchange(ctx, c.mine); err != nil {
			t.Fatal(err)
		}
	}
	a := acct("a")
	// the order rotates every millisecond for a: a place after another's,
	// within a few tries
	a.turn = time.Millisecond
	var p Peers
	for range 50 {
		var err error
		if p, err = a.Exchange(ctx, Holding{InFlight: []int{0, 0}, Live: []int{0, 0}, Held: []int{0, 0}}); err != nil {
			t.Fatal(err)
		}
		if p.Rank > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if p.Replicas != 3 || !slices.Equal(p.InFlight, []int{7, 3}) || !slices.Equal(p.Live, []int{6, 3}) ||
		!slices.Equal(p.Held, []int{3, 5}) || p.Bounded != 0 {
		t.Errorf("a was told %+v; want 3 replicas, 7 and 3 in flight, 6 and 3 running, held 3 and 5, none bounded", p)
	}
	// below: the calls running of the replicas placed before a (the ids
	// sorted, rotated by a's place, as a sorts first)
	want := []int{0, 0}
	for k, live := range [][]int{{3, 2}, {1, 1}, {2, 0}} { // b, c, d
		if (k+1+p.Rank)%4 < p.Rank {
			want[0] += live[0]
			want[1] += live[1]
		}
	}
	if p.Rank == 0 || !slices.Equal(p.Below, want) {
		t.Errorf("a at place %d was told %v running before it, want %v", p.Rank, p.Below, want)
	}
	// a gateway replica counts the pods replicas' calls pool-wide
	g, err := acct("e").Exchange(ctx, Holding{InFlight: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Replicas != 4 || g.InFlight[0] != 10 || g.Live[0] != 9 {
		t.Errorf("a gateway replica was told %+v; want 4 replicas, 10 in flight, 9 running", g)
	}
	// the version before reads b's field by its counts
	c := testenv.RedisClient(t, r.URL)
	vals, err := roomsExchangeScript.Run(ctx, c, []string{"k"}, "old", time.Minute.Milliseconds(), "0,0", time.Hour.Milliseconds()).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	// {others, place, bounded, sums, below, rooms}: the others are a, b,
	// c, d (e publishes one count, which two-pod replicas do not count)
	if len(vals) != 9 || vals[0] != 4 || vals[2] != 0 || vals[3] != 7 || vals[4] != 3 {
		t.Errorf("the version before was told %v; want 4 other replicas, none bounded, 7 and 3 in flight", vals)
	}
	p, err = a.Exchange(ctx, Holding{InFlight: []int{0, 0}, Live: []int{0, 0}, Held: []int{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Replicas != 4 || !slices.Equal(p.InFlight, []int{7, 3}) || !slices.Equal(p.Live, []int{6, 3}) || !slices.Equal(p.Held, []int{3, 5}) {
		t.Errorf("beside the version before, a was told %+v; want 4 replicas, 7 and 3 in flight, 6 and 3 running, held 3 and 5", p)
	}
}

// testAccount is replica id's account on the Redis at addr (key "k"),
// closed with the test: its counts live ttl, its order turns every turn.
func testAccount(t *testing.T, addr, id string, ttl, turn time.Duration) *redisAccount {
	t.Helper()
	a, err := newRedisAccount(AccountConfig{Redis: redisconn.Config{Address: addr}, Key: "k", Replica: id, TTL: ttl}, turn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}
