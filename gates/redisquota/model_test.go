package redisquota_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/internal/testenv"
)

// quotaModel is the executable model of the concurrency quota's lease
// counters: per tenant, the holders of a slot, each live (its replica runs
// and renews its lease), dead (its replica crashed: no renewal, no release)
// or expired (dead, and its lease ran out). Its invariants, checked against
// Redis after every step:
//
//   - a quota is never above its limit: the counter ≤ limit;
//   - every slot is recorded exactly once: the counter equals the number
//     of leases in the lease set (a slot given back twice, or never, breaks
//     it);
//   - the counter counts the live and dead holders, and may still count an
//     expired one until a script of the tenant reaps it — never more, never
//     fewer;
//   - an admission succeeds exactly when fewer than limit slots are held by
//     holders that are live or dead but not expired (reaping comes first);
//   - a release gives its slot back once, however often it is called.
type quotaModel struct {
	limit   int
	holders []*quotaHolder
}

type quotaHolder struct {
	tenant   string
	replica  int
	gate     *redisquota.Gate // the replica's gate that admitted it
	lease    string           // the lease set member
	release  func()
	released bool
	dead     bool // its replica crashed before it released
	expired  bool // dead, and its lease ran out
	reaped   bool // expired, and a script of its tenant ran since
}

// held counts tenant's slots the model says Redis holds: at least (lo)
// and at most (hi, with expired leases not yet reaped).
func (m *quotaModel) held(tenant string) (lo, hi int) {
	for _, h := range m.holders {
		if h.tenant != tenant || h.released || h.reaped {
			continue
		}
		hi++
		if !h.expired {
			lo++
		}
	}
	return lo, hi
}

// scriptRan notes that a script of tenant ran: it reaped what had expired.
func (m *quotaModel) scriptRan(tenant string) {
	for _, h := range m.holders {
		if h.tenant == tenant && h.expired {
			h.reaped = true
		}
	}
}

// fataler is what the rig needs of a test: *testing.T or *rapid.T.
type fataler interface {
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// quotaRig runs replicas of the redis-quota gate on one real redis-server.
type quotaRig struct {
	addr, prefix string
	admin        *redis.Client
	replicas     []*redisquota.Gate // nil: crashed
	m            *quotaModel
	tenants      []string
}

func (r *quotaRig) start(t fataler, i int) {
	g, err := redisquota.New(redisquota.Config{Redis: redisconn.Config{Address: r.addr}, Mode: redisquota.Concurrency,
		Limit: r.m.limit, Prefix: r.prefix, LeaseTTL: time.Minute, DeferDelay: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.replicas[i] = g
}

func (r *quotaRig) key(tenant string) string { return r.prefix + "userid:" + tenant }

// leaseSet is tenant's lease set on a single node (Gate.LeaseSetKey).
func (r *quotaRig) leaseSet(tenant string) string { return r.key(tenant) + redisquota.LeaseSuffix }

func (r *quotaRig) leases(t fataler, tenant string) []string {
	ls, err := r.admin.ZRange(context.Background(), r.leaseSet(tenant), 0, -1).Result()
	if err != nil {
		t.Fatalf("lease set: %v", err)
	}
	return ls
}

// counter reads tenant's counter and lease count straight from Redis.
func (r *quotaRig) counter(t fataler, tenant string) (n, leases int) {
	ctx := context.Background()
	s, err := r.admin.Get(ctx, r.key(tenant)).Result()
	switch {
	case err == redis.Nil:
	case err != nil:
		t.Fatalf("counter: %v", err)
	default:
		if n, err = strconv.Atoi(s); err != nil {
			t.Fatalf("counter %q: %v", s, err)
		}
	}
	c, err := r.admin.ZCard(ctx, r.leaseSet(tenant)).Result()
	if err != nil {
		t.Fatalf("lease set: %v", err)
	}
	return n, int(c)
}

// sync waits until what g queued before (releases, which are sent
// without waiting, in g's next pipeline) has run: an admission of a tenant
// of its own goes out after them, in order.
func (r *quotaRig) sync(t fataler, g *redisquota.Gate) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := g.Admit(ctx, &wire.Request{ID: "sync", Deadline: time.Now().Add(time.Hour), Metadata: map[string]string{"userid": "sync"}})
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if d.Release != nil {
		d.Release() // the sync tenant is not checked
	}
}

// check compares Redis with the model.
func (r *quotaRig) check(t fataler) {
	for _, tenant := range r.tenants {
		lo, hi := r.m.held(tenant)
		n, leases := r.counter(t, tenant)
		if n > r.m.limit {
			t.Fatalf("tenant %s: counter %d above the limit %d", tenant, n, r.m.limit)
		}
		if n != leases || n < lo || n > hi {
			t.Fatalf("tenant %s: counter %d, %d leases; the model holds %d (up to %d with expired leases not yet reaped)",
				tenant, n, leases, lo, hi)
		}
	}
}

var quotaRun atomic.Int64

// TestModelQuota runs random interleavings of admissions, releases
// (some twice), replica crashes and restarts, and the lease expiry of
// crashed holders against replicas of the redis-quota gate (concurrency
// mode) on a real redis-server, with Redis itself restarted between steps
// (on its append-only file, fsynced on every write: the quota survives),
// and checks the model's invariants after every step.
func TestModelQuota(t *testing.T) {
	port := testenv.FreePort(t)
	rs := testenv.StartRedis(t, testenv.RedisOptions{Persist: true, Dir: t.TempDir(), Port: port})
	admin := testenv.RedisClient(t, rs.URL)
	tt := t
	// A Redis restart costs ~0.4 s: make test (rapid's default checks)
	// restarts Redis a few times in all; with -rapid.checks given (make
	// verify) there is no bound.
	restarts, restartBudget := 0, 3
	flag.Visit(func(f *flag.Flag) {
		if f.Name == "rapid.checks" {
			restartBudget = math.MaxInt
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		r := &quotaRig{addr: rs.Addr, admin: admin, prefix: fmt.Sprintf("mq%d:", quotaRun.Add(1)),
			m: &quotaModel{limit: rapid.IntRange(1, 3).Draw(t, "limit")}, tenants: []string{"alice", "bob"},
			replicas: make([]*redisquota.Gate, 2)}
		for i := range r.replicas {
			r.start(t, i)
		}
		defer func() {
			for _, g := range r.replicas {
				if g != nil {
					_ = g.Close()
				}
			}
		}()
		live := func() []int {
			var out []int
			for i, g := range r.replicas {
				if g != nil {
					out = append(out, i)
				}
			}
			return out
		}
		holders := func(pred func(*quotaHolder) bool) []*quotaHolder {
			var out []*quotaHolder
			for _, h := range r.m.holders {
				if pred(h) {
					out = append(out, h)
				}
			}
			return out
		}
		t.Repeat(map[string]func(*rapid.T){
			"admit": func(t *rapid.T) {
				up := live()
				if len(up) == 0 {
					t.Skip("every replica down")
				}
				i := rapid.SampledFrom(up).Draw(t, "replica")
				tenant := rapid.SampledFrom(r.tenants).Draw(t, "tenant")
				before := r.leases(t, tenant)
				lo, _ := r.m.held(tenant)
				want := lo < r.m.limit
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				d, err := r.replicas[i].Admit(ctx, &wire.Request{ID: "x", Deadline: time.Now().Add(time.Hour),
					Metadata: map[string]string{"userid": tenant}})
				cancel()
				if err != nil {
					t.Fatalf("admit: %v", err)
				}
				r.m.scriptRan(tenant)
				if got := d.Verdict == gate.Admit; got != want {
					t.Fatalf("tenant %s with %d of %d slots held: admitted %v, want %v", tenant, lo, r.m.limit, got, want)
				}
				if d.Verdict != gate.Admit {
					return
				}
				var added []string
				for _, l := range r.leases(t, tenant) {
					if !slices.Contains(before, l) {
						added = append(added, l)
					}
				}
				if len(added) != 1 || d.Release == nil {
					t.Fatalf("admitted: %d new leases %q, release %v; want one lease and a release", len(added), added, d.Release != nil)
				}
				r.m.holders = append(r.m.holders, &quotaHolder{tenant: tenant, replica: i, gate: r.replicas[i], lease: added[0], release: d.Release})
			},
			"release": func(t *rapid.T) {
				hs := holders(func(h *quotaHolder) bool { return !h.released && !h.dead })
				if len(hs) == 0 {
					t.Skip("no live holder")
				}
				h := rapid.SampledFrom(hs).Draw(t, "holder")
				h.release()
				h.released = true
				r.sync(t, h.gate)
				r.m.scriptRan(h.tenant)
			},
			"release again": func(t *rapid.T) {
				hs := holders(func(h *quotaHolder) bool { return h.released && r.replicas[h.replica] == h.gate })
				if len(hs) == 0 {
					t.Skip("no released holder on a live replica")
				}
				h := rapid.SampledFrom(hs).Draw(t, "holder")
				h.release() // must give nothing back
				r.sync(t, h.gate)
			},
			"crash": func(t *rapid.T) {
				up := live()
				if len(up) == 0 {
					t.Skip("every replica down")
				}
				i := rapid.SampledFrom(up).Draw(t, "replica")
				_ = r.replicas[i].Close()
				r.replicas[i] = nil
				for _, h := range r.m.holders {
					if h.replica == i && !h.released {
						h.dead = true
					}
				}
			},
			"restart": func(t *rapid.T) {
				var down []int
				for i, g := range r.replicas {
					if g == nil {
						down = append(down, i)
					}
				}
				if len(down) == 0 {
					t.Skip("every replica up")
				}
				r.start(t, rapid.SampledFrom(down).Draw(t, "replica"))
			},
			// The lease TTL of the crashed holders runs out (live holders
			// renewed theirs): their expiry is moved into the past.
			"expire dead": func(t *rapid.T) {
				hs := holders(func(h *quotaHolder) bool { return h.dead && !h.expired })
				if len(hs) == 0 {
					t.Skip("no dead holder")
				}
				ctx := context.Background()
				past := float64(time.Now().Add(-time.Hour).UnixMilli())
				for _, h := range hs {
					if err := r.admin.ZAddXX(ctx, r.leaseSet(h.tenant), redis.Z{Score: past, Member: h.lease}).Err(); err != nil {
						t.Fatal(err)
					}
					h.expired = true
				}
			},
			"redis restart": func(t *rapid.T) {
				if rapid.IntRange(0, 3).Draw(t, "rarely") != 0 {
					t.Skip("Redis restarts are slow: one draw in four")
				}
				if restarts >= restartBudget {
					t.Skip("the run's Redis restarts are spent (make verify has no bound)")
				}
				restarts++
				dir := rs.Dir()
				rs.Stop()
				rs = testenv.StartRedis(tt, testenv.RedisOptions{Persist: true, Dir: dir, Port: port})
				// Each live replica's first script after the restart may meet a
				// dead connection (an error: the request would be deferred);
				// the step ends once every replica's scripts go through again.
				for _, g := range r.replicas {
					if g == nil {
						continue
					}
					for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						d, err := g.Admit(ctx, &wire.Request{ID: "sync", Deadline: time.Now().Add(time.Hour), Metadata: map[string]string{"userid": "sync"}})
						cancel()
						if err == nil {
							if d.Release != nil {
								d.Release()
							}
							break
						}
						if time.Now().After(end) {
							t.Fatalf("a replica's scripts still fail 10 s after the Redis restart: %v", err)
						}
					}
				}
			},
			"": func(t *rapid.T) { r.check(t) },
		})
		// At the end every live holder releases, and every dead one
		// expires: the quota must come back to 0.
		for _, h := range r.m.holders {
			if !h.released && !h.dead {
				h.release()
				h.released = true
				r.sync(t, h.gate)
			}
		}
		ctx := context.Background()
		for _, h := range r.m.holders {
			if h.dead && !h.expired {
				_ = r.admin.ZAddXX(ctx, r.leaseSet(h.tenant), redis.Z{Score: 1, Member: h.lease}).Err()
				h.expired = true
			}
		}
		if len(live()) == 0 {
			r.start(t, 0)
		}
		g := r.replicas[live()[0]]
		for _, tenant := range r.tenants {
			d, err := g.Admit(ctx, &wire.Request{ID: "y", Deadline: time.Now().Add(time.Hour), Metadata: map[string]string{"userid": tenant}})
			if err != nil || d.Verdict != gate.Admit {
				t.Fatalf("tenant %s after every holder ended: %v %v, want admitted", tenant, d.Verdict, err)
			}
			r.m.scriptRan(tenant)
			d.Release()
		}
		r.sync(t, g)
		r.check(t)
		for _, tenant := range r.tenants {
			if n, _ := r.counter(t, tenant); n != 0 {
				t.Fatalf("tenant %s: %d slots still held after every holder ended", tenant, n)
			}
		}
	})
}

// TestQuotaReleaseTwiceRegression is TestModelQuota's shrunk failure with
// the quota-release-twice mutant kept as a fixed case: two holders of one
// tenant, the first released twice; the second still holds its slot.
func TestQuotaReleaseTwiceRegression(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	{
		r := &quotaRig{addr: rs.Addr, admin: admin, prefix: "rq:",
			m: &quotaModel{limit: 2}, tenants: []string{"alice"}, replicas: make([]*redisquota.Gate, 1)}
		r.start(t, 0)
		g := r.replicas[0]
		defer func() { _ = g.Close() }()
		ctx := context.Background()
		var rel []func()
		for range 2 {
			d, err := g.Admit(ctx, &wire.Request{ID: "a", Deadline: time.Now().Add(time.Hour), Metadata: map[string]string{"userid": "alice"}})
			if err != nil || d.Verdict != gate.Admit {
				t.Fatalf("admit: %v %v", d.Verdict, err)
			}
			rel = append(rel, d.Release)
		}
		rel[0]()
		rel[0]()
		r.sync(t, g)
		if n, leases := r.counter(t, "alice"); n != 1 || leases != 1 {
			t.Fatalf("after one of two holders released twice: counter %d, %d leases; want 1 and 1", n, leases)
		}
		rel[1]()
		r.sync(t, g)
		if n, leases := r.counter(t, "alice"); n != 0 || leases != 0 {
			t.Fatalf("after both released: counter %d, %d leases; want 0", n, leases)
		}
	}
}
