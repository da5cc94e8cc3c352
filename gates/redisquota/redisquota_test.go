package redisquota_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func registry(t testing.TB) *gate.Registry {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(redisquota.Type, redisquota.NewFactory()); err != nil {
		t.Fatal(err)
	}
	return r
}

// build builds a gate from JSON gate_params through the registry, as app does.
func build(t testing.TB, r *gate.Registry, params string) (gate.Gate, error) {
	t.Helper()
	return gatetest.Build(t, r, redisquota.Type, params, gate.Env{})
}

// quota builds a redis-quota gate at addr with the extra params (a JSON
// object's members) and returns it as an Admitter.
func quota(t testing.TB, addr, params string) gate.Admitter {
	t.Helper()
	return quotaIn(t, registry(t), addr, params)
}

func quotaIn(t testing.TB, r *gate.Registry, addr, params string) gate.Admitter {
	t.Helper()
	g, err := build(t, r, `{"address":"`+addr+`",`+params+`}`)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g.(gate.Admitter)
}

func request(tenant string) *wire.Request {
	return &wire.Request{ID: "r-" + tenant, Deadline: time.Now().Add(time.Minute),
		Metadata: map[string]string{"userid": tenant, "job_id": "j"}}
}

func admit(t testing.TB, a gate.Admitter, req *wire.Request) gate.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := a.Admit(ctx, req)
	if err != nil {
		t.Fatalf("Admit %s: %v", req.ID, err)
	}
	return d
}

// expect checks a decision's verdict, the request's classification and
// whether a Release came with it.
func expect(t testing.TB, d gate.Decision, req *wire.Request, verdict gate.Verdict, class string, release bool) {
	t.Helper()
	if d.Verdict != verdict || req.Classification() != class || (d.Release != nil) != release {
		t.Fatalf("decision %v (reason %q, release %v), classification %q; want %v, %q, release %v",
			d.Verdict, d.Reason, d.Release != nil, req.Classification(), verdict, class, release)
	}
}

func getInt(t testing.TB, c *redis.Client, key string) int {
	t.Helper()
	v, err := c.Get(context.Background(), key).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("GET %s: %v", key, err)
	}
	return v
}

func TestParams(t *testing.T) {
	tests := []struct {
		name    string
		params  string
		wantErr string
	}{
		{"minimal", `{"address":"127.0.0.1:6379","limit":5}`, ""},
		{"all upstream params, numbers as strings", `{"address":"127.0.0.1:6379","attribute":"tenant","mode":"concurrency",
			"limit":"5","window":"30s","prefix":"q:","gating_mode":"classifying"}`, ""},
		{"sluice params", `{"address":"127.0.0.1:6379","limit":1,"mode":"concurrency","lease_ttl":"10s","defer_delay":0.5}`, ""},
		{"redis url", `{"address":"redis://:pw@127.0.0.1:6379/2","limit":1}`, ""},
		{"tls host:port", `{"address":"127.0.0.1:6380","limit":1,"tls":true,"password":"pw","username":"u"}`, ""},
		{"generic params", `{"address":"127.0.0.1:6379","limit":1,"failure_policy":"open"}`, ""},
		{"no address", `{"limit":5}`, "gate_params.address: required"},
		{"bad address", `{"address":"localhost","limit":5}`, "want host:port"},
		{"no limit", `{"address":"127.0.0.1:6379"}`, "gate_params.limit: required"},
		{"zero limit", `{"address":"127.0.0.1:6379","limit":0}`, "want an integer > 0"},
		{"negative limit", `{"address":"127.0.0.1:6379","limit":"-1"}`, "want an integer > 0"},
		{"fractional limit", `{"address":"127.0.0.1:6379","limit":1.5}`, "not an integer"},
		{"limit not a number", `{"address":"127.0.0.1:6379","limit":"many"}`, "not a number"},
		{"window as a bare number", `{"address":"127.0.0.1:6379","limit":1,"window":60}`, `"60" is not a duration`},
		{"window as a bare string number", `{"address":"127.0.0.1:6379","limit":1,"window":"60"}`, `"60" is not a duration`},
		{"zero window", `{"address":"127.0.0.1:6379","limit":1,"window":"0s"}`, "want a duration > 0"},
		{"unknown mode", `{"address":"127.0.0.1:6379","limit":1,"mode":"burst"}`,
			`gate_params.mode "burst": want rate-limit or concurrency`},
		{"unknown gating mode", `{"address":"127.0.0.1:6379","limit":1,"gating_mode":"maybe"}`,
			`gate_params.gating_mode "maybe": want blocking or classifying`},
		{"short lease", `{"address":"127.0.0.1:6379","limit":1,"lease_ttl":"100ms"}`, "lease_ttl 100ms: want at least 1s"},
		{"negative defer delay", `{"address":"127.0.0.1:6379","limit":1,"defer_delay":"-1s"}`, "defer_delay"},
		{"unknown param", `{"address":"127.0.0.1:6379","limit":1,"atribute":"x"}`, "unknown gate_params: atribute"},
		{"password with url", `{"address":"redis://127.0.0.1:6379","limit":1,"password":"x"}`, "go in the address URL"},
		{"bad tls", `{"address":"127.0.0.1:6379","limit":1,"tls":"maybe"}`, "not a boolean"},
		{"cluster url", `{"address":"redis://127.0.0.1:7000?addr=127.0.0.1:7001","redis_mode":"cluster","limit":1}`, ""},
		{"cluster url in single mode", `{"address":"redis://127.0.0.1:7000?addr=127.0.0.1:7001","limit":1}`, "set the redis mode to cluster"},
		{"db in cluster mode", `{"address":"127.0.0.1:7000","redis_mode":"cluster","db":2,"limit":1}`, "db must be 0 with a Redis Cluster"},
		{"unknown redis mode", `{"address":"127.0.0.1:6379","redis_mode":"replicated","limit":1}`, `gate_params.redis_mode, redis_addrs, redis_master_name: redis mode "replicated"`},
		{"sentinel without master name", `{"address":"127.0.0.1:26379","redis_mode":"sentinel","limit":1}`, `needs master_name`},
	}
	r := registry(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, r, tt.params)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	r := registry(t)
	for _, mode := range []string{"rate-limit", "concurrency"} {
		t.Run(mode, func(t *testing.T) {
			gatetest.Run(t, func(t testing.TB) gate.Gate {
				g, err := build(t, r, `{"address":"`+rs.Addr+`","limit":3,"mode":"`+mode+`"}`)
				if err != nil {
					t.Fatal(err)
				}
				return g
			}, gatetest.Features{})
		})
	}
}

// TestNoAttribute: a request without the attribute is admitted untouched
// and costs no Redis key; an empty value is a tenant of its own.
func TestNoAttribute(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	for _, mode := range []string{"rate-limit", "concurrency"} {
		t.Run(mode, func(t *testing.T) {
			a := quota(t, rs.Addr, `"limit":1,"mode":"`+mode+`"`)
			req := &wire.Request{ID: "anon", Deadline: time.Now().Add(time.Minute), Metadata: map[string]string{"job_id": "j"},
				Labels: map[string]string{wire.LabelClassification: wire.ClassOverflow}}
			for range 3 {
				expect(t, admit(t, a, req), req, gate.Admit, wire.ClassOverflow, false) // stale label kept, as upstream
			}
			if n, _ := admin.DBSize(context.Background()).Result(); n != 0 {
				t.Fatalf("%d keys written for requests without the attribute", n)
			}
			empty := request("")
			expect(t, admit(t, a, empty), empty, gate.Admit, wire.ClassReserved, mode == "concurrency")
			again := request("")
			expect(t, admit(t, a, again), again, gate.Defer, wire.ClassOverflow, false)
			if n, _ := admin.Exists(context.Background(), "quota:userid:").Result(); n != 1 {
				t.Fatal(`the empty tenant's key "quota:userid:" is missing`)
			}
			admin.FlushDB(context.Background())
		})
	}
}

func TestRateLimit(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	ctx := context.Background()
	t.Run("blocking", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":3,"window":"1m"`)
		for i := range 3 {
			req := request("alice")
			expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, false)
			if n := admin.ZCard(ctx, "quota:userid:alice").Val(); n != int64(i+1) {
				t.Fatalf("after %d admissions the window holds %d entries", i+1, n)
			}
		}
		req := request("alice")
		d := admit(t, a, req)
		expect(t, d, req, gate.Defer, wire.ClassOverflow, false)
		if !strings.Contains(d.Reason, `userid "alice"`) || !strings.Contains(d.Reason, "3 requests per 1m0s") {
			t.Errorf("reason %q does not name the tenant and the quota", d.Reason)
		}
		if d.Delay <= 55*time.Second || d.Delay > time.Minute {
			t.Errorf("deferred for %v, want the time until the oldest admission leaves the 1m window", d.Delay)
		}
		other := request("bob") // tenants are independent
		expect(t, admit(t, a, other), other, gate.Admit, wire.ClassReserved, false)
		ttl := admin.TTL(ctx, "quota:userid:alice").Val()
		if ttl <= 110*time.Second || ttl > 120*time.Second {
			t.Errorf("TTL %v, want upstream's 2 × window", ttl)
		}
	})
	t.Run("classifying", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":2,"gating_mode":"classifying","prefix":"c:"`)
		for _, want := range []string{wire.ClassReserved, wire.ClassReserved, wire.ClassOverflow, wire.ClassOverflow} {
			req := request("carol")
			expect(t, admit(t, a, req), req, gate.Admit, want, false)
		}
		if n := admin.ZCard(ctx, "c:userid:carol").Val(); n != 2 {
			t.Errorf("window holds %d entries, want 2 (overflow is not counted)", n)
		}
	})
}

// TestRateLimitWindowSlides: an admission frees when it leaves the window,
// and the deferral says when.
func TestRateLimitWindowSlides(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	a := quota(t, rs.Addr, `"limit":2,"window":"600ms"`)
	first := time.Now()
	admit(t, a, request("dave"))
	time.Sleep(200 * time.Millisecond)
	admit(t, a, request("dave"))
	req := request("dave")
	d := admit(t, a, req)
	expect(t, d, req, gate.Defer, wire.ClassOverflow, false)
	// The first admission leaves the window 600ms after it was made.
	if left := time.Until(first.Add(600 * time.Millisecond)); d.Delay < left-50*time.Millisecond || d.Delay > left+50*time.Millisecond {
		t.Errorf("deferred for %v, want about %v", d.Delay, left)
	}
	time.Sleep(d.Delay + 5*time.Millisecond)
	req = request("dave")
	expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, false)
	// The second admission is still in the window: the next one waits for it.
	req = request("dave")
	d = admit(t, a, req)
	expect(t, d, req, gate.Defer, wire.ClassOverflow, false)
	if d.Delay > 250*time.Millisecond {
		t.Errorf("deferred for %v, want at most the rest of the second admission's window", d.Delay)
	}
}

// TestRateLimitSameInstant: many admissions in the same microsecond (one
// pipeline) are all counted: exactly limit are admitted, each an entry.
func TestRateLimitSameInstant(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	a := quota(t, rs.Addr, `"limit":50`)
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := request("erin")
			if admit(t, a, req).Verdict == gate.Admit {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if n := admin.ZCard(context.Background(), "quota:userid:erin").Val(); admitted != 50 || n != 50 {
		t.Fatalf("%d admitted, %d entries; want exactly the limit, 50", admitted, n)
	}
}

func TestConcurrency(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	ctx := context.Background()
	t.Run("blocking", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":2,"mode":"concurrency","defer_delay":"250ms"`)
		r1, r2 := request("frank"), request("frank")
		d1, d2 := admit(t, a, r1), admit(t, a, r2)
		expect(t, d1, r1, gate.Admit, wire.ClassReserved, true)
		expect(t, d2, r2, gate.Admit, wire.ClassReserved, true)
		if n := getInt(t, admin, "quota:userid:frank"); n != 2 {
			t.Fatalf("counter %d, want 2", n)
		}
		if n := admin.ZCard(ctx, "quota:userid:frank"+redisquota.LeaseSuffix).Val(); n != 2 {
			t.Fatalf("%d leases, want 2", n)
		}
		if ttl := admin.TTL(ctx, "quota:userid:frank").Val(); ttl <= 55*time.Second || ttl > time.Minute {
			t.Errorf("counter TTL %v, want upstream's (the window)", ttl)
		}
		r3 := request("frank")
		d3 := admit(t, a, r3)
		expect(t, d3, r3, gate.Defer, wire.ClassOverflow, false)
		if d3.Delay != 250*time.Millisecond || !strings.Contains(d3.Reason, `userid "frank"`) ||
			!strings.Contains(d3.Reason, "2 concurrent requests") {
			t.Errorf("deferral %v %q", d3.Delay, d3.Reason)
		}
		// Releasing twice gives back one slot.
		d1.Release()
		d1.Release()
		r4 := request("frank")
		d4 := admit(t, a, r4) // queued after the release: sees it
		expect(t, d4, r4, gate.Admit, wire.ClassReserved, true)
		if n := getInt(t, admin, "quota:userid:frank"); n != 2 {
			t.Fatalf("counter %d after a double release and an admission, want 2", n)
		}
		d2.Release()
		d4.Release()
		d4.Release()
		waitFor(t, func() bool { return getInt(t, admin, "quota:userid:frank") == 0 }, "every slot back")
		if n := admin.Exists(ctx, "quota:userid:frank"+redisquota.LeaseSuffix).Val(); n != 0 {
			t.Errorf("lease set left with no lease in it")
		}
	})
	t.Run("classifying", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":1,"mode":"concurrency","gating_mode":"classifying"`)
		r1, r2 := request("gina"), request("gina")
		d1 := admit(t, a, r1)
		expect(t, d1, r1, gate.Admit, wire.ClassReserved, true)
		expect(t, admit(t, a, r2), r2, gate.Admit, wire.ClassOverflow, false)
		if n := getInt(t, admin, "quota:userid:gina"); n != 1 {
			t.Fatalf("counter %d, want 1 (overflow holds nothing)", n)
		}
		d1.Release()
		r3 := request("gina")
		expect(t, admit(t, a, r3), r3, gate.Admit, wire.ClassReserved, true)
	})
}

// TestDeadHolder: a holder that dies without releasing gives its slot back
// once its lease runs out, and not before; a live holder keeps renewing.
func TestDeadHolder(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	params := `"limit":1,"mode":"concurrency","lease_ttl":"1s"`

	// A replica of its own (its own factory, so its own connection) takes
	// the only slot, then dies: its gate closes without releasing.
	dying, err := build(t, registry(t), `{"address":"`+rs.Addr+`",`+params+`}`)
	if err != nil {
		t.Fatal(err)
	}
	held := request("hank")
	expect(t, admit(t, dying.(gate.Admitter), held), held, gate.Admit, wire.ClassReserved, true)
	died := time.Now()
	if err := dying.(interface{ Close() error }).Close(); err != nil {
		t.Fatal(err)
	}

	survivor := quota(t, rs.Addr, params)
	req := request("hank")
	expect(t, admit(t, survivor, req), req, gate.Defer, wire.ClassOverflow, false)
	var back time.Time
	waitFor(t, func() bool {
		req := request("hank")
		if admit(t, survivor, req).Verdict == gate.Admit {
			back = time.Now()
			return true
		}
		return false
	}, "the dead holder's slot")
	if el := back.Sub(died); el < 500*time.Millisecond || el > 2*time.Second {
		t.Errorf("slot came back %v after the holder died, want about its 1s lease", el)
	}
	if n := getInt(t, admin, "quota:userid:hank"); n != 1 {
		t.Errorf("counter %d, want 1 (the survivor's slot only)", n)
	}
}

// TestLiveHolderRenews: a request running longer than lease_ttl keeps its
// slot (its lease is renewed), until its release.
func TestLiveHolderRenews(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	a := quota(t, rs.Addr, `"limit":1,"mode":"concurrency","lease_ttl":"1s"`)
	held := request("ivy")
	d := admit(t, a, held)
	expect(t, d, held, gate.Admit, wire.ClassReserved, true)
	other := quota(t, rs.Addr, `"limit":1,"mode":"concurrency","lease_ttl":"1s"`) // another replica
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		req := request("ivy")
		if v := admit(t, other, req).Verdict; v != gate.Defer {
			t.Fatalf("slot taken from a live holder after %v", time.Since(end.Add(-2500*time.Millisecond)))
		}
	}
	d.Release()
	waitFor(t, func() bool { return admit(t, other, request("ivy")).Verdict == gate.Admit }, "the released slot")
}

// TestLeaseEndsAtDeadline: a lease never outlives its request's deadline
// (the request cannot run past it), however long lease_ttl is.
func TestLeaseEndsAtDeadline(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	a := quota(t, rs.Addr, `"limit":1,"mode":"concurrency","lease_ttl":"1m"`)
	held := request("jack")
	held.Deadline = time.Now().Add(700 * time.Millisecond)
	expect(t, admit(t, a, held), held, gate.Admit, wire.ClassReserved, true) // never released
	req := request("jack")
	expect(t, admit(t, a, req), req, gate.Defer, wire.ClassOverflow, false)
	time.Sleep(time.Until(held.Deadline) + 20*time.Millisecond)
	req = request("jack")
	expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, true)
}

// TestReleaseAfterReap: a release whose lease was already reaped gives
// nothing back twice.
func TestReleaseAfterReap(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	ctx := context.Background()
	a := quota(t, rs.Addr, `"limit":3,"mode":"concurrency"`)
	slow, fast := request("kim"), request("kim")
	ds, df := admit(t, a, slow), admit(t, a, fast)
	// slow's lease expires (as if its renewals were lost) and an admission reaps it.
	leases := "quota:userid:kim" + redisquota.LeaseSuffix
	ids := admin.ZRange(ctx, leases, 0, -1).Val()
	if len(ids) != 2 {
		t.Fatalf("leases %v, want 2", ids)
	}
	admin.ZAdd(ctx, leases, redis.Z{Score: 1, Member: ids[0]})
	third := request("kim")
	dt := admit(t, a, third)
	if n := getInt(t, admin, "quota:userid:kim"); n != 2 {
		t.Fatalf("counter %d after a reap and an admission, want 2", n)
	}
	ds.Release()
	df.Release()
	dt.Release()
	waitFor(t, func() bool { return admin.Exists(ctx, leases).Val() == 0 }, "the releases")
	if n := getInt(t, admin, "quota:userid:kim"); n != 0 {
		t.Fatalf("counter %d after every release, want 0 (not below, not above)", n)
	}
}

// Upstream's scripts, as UPSTREAM.md §1.1 describes them, to check that
// sluice and upstream replicas count one quota.
var (
	upstreamAcquire = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and tonumber(v) >= tonumber(ARGV[1]) then return 0 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1`)
	upstreamRelease = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and tonumber(v) > 0 then
  if redis.call('DECR', KEYS[1]) > 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
end
return 1`)
	upstreamRate = redis.NewScript(`
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1`)
)

func upstreamRateAdmit(t testing.TB, c *redis.Client, key string, limit int, window time.Duration) bool {
	t.Helper()
	now := time.Now().UnixNano()
	ok, err := upstreamRate.Run(context.Background(), c, []string{key},
		strconv.FormatInt(now-window.Nanoseconds(), 10), limit, strconv.FormatInt(now, 10), int(2*window.Seconds())).Int()
	if err != nil {
		t.Fatal(err)
	}
	return ok == 1
}

func TestUpstreamCompatibility(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	ctx := context.Background()
	t.Run("rate-limit", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":4`)
		key := "quota:userid:lea"
		// Upstream admits two, sluice counts them and admits the rest.
		for range 2 {
			if !upstreamRateAdmit(t, admin, key, 4, time.Minute) {
				t.Fatal("upstream refused below the limit")
			}
		}
		r := request("lea")
		expect(t, admit(t, a, r), r, gate.Admit, wire.ClassReserved, false)
		// Upstream counts sluice's entry: one more, then full for both.
		if !upstreamRateAdmit(t, admin, key, 4, time.Minute) {
			t.Fatal("upstream refused the 4th admission")
		}
		if upstreamRateAdmit(t, admin, key, 4, time.Minute) {
			t.Fatal("upstream admitted a 5th: it did not count sluice's entry")
		}
		r = request("lea")
		expect(t, admit(t, a, r), r, gate.Defer, wire.ClassOverflow, false)
		// Upstream's entries leave sluice's window by their scores.
		admin.Del(ctx, key)
		old := time.Now().Add(-2 * time.Minute).UnixNano()
		for i := range 4 {
			s := strconv.FormatInt(old+int64(i), 10)
			admin.ZAdd(ctx, key, redis.Z{Score: float64(old + int64(i)), Member: s})
		}
		r = request("lea")
		expect(t, admit(t, a, r), r, gate.Admit, wire.ClassReserved, false)
		if n := admin.ZCard(ctx, key).Val(); n != 1 {
			t.Errorf("%d entries, want 1: upstream's expired entries trimmed", n)
		}
		// Sluice's entries have upstream's score (Unix ns) and a member that
		// starts with the same nanoseconds.
		z := admin.ZRangeWithScores(ctx, key, 0, -1).Val()[0]
		member := z.Member.(string)
		ns, err := strconv.ParseInt(member[:strings.IndexByte(member, '-')], 10, 64)
		if err != nil || float64(ns) != z.Score || time.Since(time.Unix(0, ns)).Abs() > 5*time.Second {
			t.Errorf("entry %q scored %v: want score = the member's Unix nanoseconds, now", member, z.Score)
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":3,"mode":"concurrency"`)
		key := "quota:userid:max"
		for range 2 { // two upstream holders
			if ok, _ := upstreamAcquire.Run(ctx, admin, []string{key}, 3, 60).Int(); ok != 1 {
				t.Fatal("upstream acquire refused")
			}
		}
		r := request("max")
		d := admit(t, a, r)
		expect(t, d, r, gate.Admit, wire.ClassReserved, true)
		if ok, _ := upstreamAcquire.Run(ctx, admin, []string{key}, 3, 60).Int(); ok != 0 {
			t.Fatal("upstream acquired a 4th slot: it did not count sluice's")
		}
		r = request("max")
		expect(t, admit(t, a, r), r, gate.Defer, wire.ClassOverflow, false)
		upstreamRelease.Run(ctx, admin, []string{key}, 60)
		r = request("max")
		d2 := admit(t, a, r)
		expect(t, d2, r, gate.Admit, wire.ClassReserved, true)
		// Sluice's releases give back only sluice's units.
		d.Release()
		d2.Release()
		waitFor(t, func() bool { return getInt(t, admin, key) == 1 }, "sluice's releases")
		if ttl := admin.TTL(ctx, key).Val(); ttl <= 0 || ttl > time.Minute {
			t.Errorf("counter TTL %v, want upstream's window", ttl)
		}
	})
	t.Run("counter gone", func(t *testing.T) {
		// The counter expires (upstream's TTL) or is deleted while sluice
		// holds a lease: the unit was forgiven with it, so the next script
		// drops the stale lease and its release gives nothing back.
		a := quota(t, rs.Addr, `"limit":1,"mode":"concurrency"`)
		key := "quota:userid:nia"
		r := request("nia")
		d := admit(t, a, r)
		admin.Del(ctx, key)
		r2 := request("nia")
		d2 := admit(t, a, r2)
		expect(t, d2, r2, gate.Admit, wire.ClassReserved, true)
		d.Release()
		r3 := request("nia")
		expect(t, admit(t, a, r3), r3, gate.Defer, wire.ClassOverflow, false) // r2 still holds the slot
		if n := getInt(t, admin, key); n != 1 {
			t.Fatalf("counter %d, want 1 (r2's)", n)
		}
		d2.Release()
		waitFor(t, func() bool { return getInt(t, admin, key) == 0 }, "the release")
	})
	t.Run("not a number", func(t *testing.T) {
		a := quota(t, rs.Addr, `"limit":2,"mode":"concurrency"`)
		admin.Set(ctx, "quota:userid:oz", "lots", 0)
		r := request("oz")
		_, err := a.Admit(ctx, r)
		if err == nil || !strings.Contains(err.Error(), "does not hold a number") || r.Classification() != "" {
			t.Fatalf("Admit = %v, classification %q; want an error naming the bad counter, no label", err, r.Classification())
		}
	})
}

// TestRedisDown: an unreachable Redis is an error at once; one that never
// answers, an error when the context ends.
func TestRedisDown(t *testing.T) {
	for _, mode := range []string{"rate-limit", "concurrency"} {
		t.Run(mode+"/refused", func(t *testing.T) {
			a := quota(t, "127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)), `"limit":1,"mode":"`+mode+`"`)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			req := request("pat")
			_, err := a.Admit(ctx, req)
			if err == nil || time.Since(start) > time.Second || req.Classification() != "" {
				t.Fatalf("Admit = %v after %v, classification %q; want an error at once", err, time.Since(start), req.Classification())
			}
			if !strings.Contains(err.Error(), "quota:userid:pat") {
				t.Errorf("error %q does not name the key", err)
			}
		})
		t.Run(mode+"/hanging", func(t *testing.T) {
			a := quota(t, silentServer(t), `"limit":1,"mode":"`+mode+`"`)
			for range 2 { // the second queues behind the first's pipeline
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				start := time.Now()
				_, err := a.Admit(ctx, request("pat"))
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 700*time.Millisecond {
					t.Fatalf("Admit = %v after %v; want the context's deadline, promptly", err, time.Since(start))
				}
			}
		})
	}
}

// TestAbandonedAdmission: a caller that gives up while its acquire is in
// flight does not keep the slot.
func TestAbandonedAdmission(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	ctx := context.Background()
	a := quota(t, rs.Addr, `"limit":1,"mode":"concurrency"`)
	admit(t, a, request("quinn")).Release() // scripts loaded
	waitFor(t, func() bool { return getInt(t, admin, "quota:userid:quinn") == 0 }, "warm-up release")
	// Pause Redis so the acquire is in flight when the caller gives up.
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 300, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := a.Admit(cctx, request("quinn"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Admit = %v, want the caller's deadline", err)
	}
	// Once Redis answers, the unit is given back.
	waitFor(t, func() bool {
		return admin.Exists(ctx, "quota:userid:quinn"+redisquota.LeaseSuffix).Val() == 0 &&
			getInt(t, admin, "quota:userid:quinn") == 0
	}, "the abandoned unit back")
	req := request("quinn")
	expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, true)
}

// TestClosed: a closed gate refuses to admit requests it would count.
func TestClosed(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	g, err := build(t, registry(t), `{"address":"`+rs.Addr+`","limit":1,"mode":"concurrency"}`)
	if err != nil {
		t.Fatal(err)
	}
	d := admit(t, g.(gate.Admitter), request("ray"))
	if err := g.(interface{ Close() error }).Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := g.(gate.Admitter).Admit(context.Background(), request("ray")); !errors.Is(err, gate.ErrGateClosed) {
		t.Fatalf("Admit after Close = %v, want gate.ErrGateClosed", err)
	}
	d.Release() // after Close: logged, no panic; the lease expires on its own
}

// TestAuth: credentials through a redis:// URL or the password parameter.
func TestAuth(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{Password: "s3cret"})
	for _, addr := range []string{rs.URL, rs.Addr + `","password":"s3cret`} {
		a := quota(t, addr, `"limit":2`)
		req := request("sam")
		expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, false)
	}
	a := quota(t, rs.Addr, `"limit":1`)
	if _, err := a.Admit(context.Background(), request("sam")); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("Admit without a password = %v, want NOAUTH", err)
	}
}

func waitFor(t testing.TB, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// silentServer accepts connections and never answers.
func silentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}
