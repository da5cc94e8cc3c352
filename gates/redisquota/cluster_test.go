package redisquota_test

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/testenv"
)

// leaseSetKeyer is the part of *redisquota.Gate the cluster test reads.
type leaseSetKeyer interface {
	Key(value string) string
	LeaseSetKey(value string) string
}

// tenantsOnMasters returns tenants whose keys (quota:userid:<tenant>) are
// served by each master of c (one plain name per master), then tenants
// with braces in their names, wherever they land.
func tenantsOnMasters(t *testing.T, c *testenv.RedisCluster) (plain, braces []string) {
	t.Helper()
	is, err := c.SpreadOverMasters(context.Background(), func(i int) string { return "quota:userid:tenant-" + strconv.Itoa(i) })
	if err != nil {
		t.Fatal(err)
	}
	plain = make([]string, len(is))
	for m, i := range is {
		plain[m] = "tenant-" + strconv.Itoa(i)
	}
	return plain, []string{"a}b", "{x}", "}{", "{}", "c{d"}
}

// TestCluster runs the gate against a Redis Cluster (3 masters, 3
// replicas), started once for its subtests: the conformance suite in both
// modes; tenants on every master, braces in their names included, counted
// in the keys the docs name (through one seed node, the mode taken from the
// deployment's redis_mode); and a master killed while tenants are being
// admitted: the tenant whose keys it served gets errors (the gate's failure
// behaviour: the request is deferred) until its replica is promoted, then
// is admitted again on its own, while a tenant on another master never
// fails.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := testenv.StartRedisCluster(t, testenv.RedisClusterOptions{})
	admin, err := redisclient.New(c.URL, redisclient.Cluster)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	plain, braces := tenantsOnMasters(t, c)
	r := registry(t)
	cluster := gate.Env{RedisMode: "cluster"}

	t.Run("conformance", func(t *testing.T) {
		for _, mode := range []string{"rate-limit", "concurrency"} {
			t.Run(mode, func(t *testing.T) {
				gatetest.Run(t, func(t testing.TB) gate.Gate {
					g, err := gatetest.Build(t, r, redisquota.Type,
						`{"address":"`+c.URL+`","redis_mode":"cluster","limit":3,"mode":"`+mode+`"}`, gate.Env{})
					if err != nil {
						t.Fatal(err)
					}
					return g
				}, gatetest.Features{})
			})
		}
	})

	t.Run("tenants on every master", func(t *testing.T) {
		tenants := append(append([]string{}, plain...), braces...)
		g, err := gatetest.Build(t, r, redisquota.Type,
			`{"address":"`+c.Nodes[0].Addr+`","limit":2,"mode":"concurrency","defer_delay":"100ms"}`, cluster)
		if err != nil {
			t.Fatal(err)
		}
		a, keys := g.(gate.Admitter), g.(leaseSetKeyer)
		masters := map[int]bool{}
		var releases []func()
		for _, v := range tenants {
			m, err := c.MasterOf(ctx, keys.Key(v))
			if err != nil {
				t.Fatal(err)
			}
			masters[m] = true
			for range 2 {
				req := request(v)
				d := admit(t, a, req)
				expect(t, d, req, gate.Admit, wire.ClassReserved, true)
				releases = append(releases, d.Release)
			}
			req := request(v)
			expect(t, admit(t, a, req), req, gate.Defer, wire.ClassOverflow, false)
			if n, err := admin.Get(ctx, keys.Key(v)).Int(); err != nil || n != 2 {
				t.Errorf("tenant %q: counter %s = %d, %v; want 2", v, keys.Key(v), n, err)
			}
			if n := admin.ZCard(ctx, keys.LeaseSetKey(v)).Val(); n != 2 {
				t.Errorf("tenant %q: %d leases in %s, want 2", v, n, keys.LeaseSetKey(v))
			}
		}
		if len(masters) != c.Masters {
			t.Errorf("tenants on %d masters, want all %d", len(masters), c.Masters)
		}
		for _, rel := range releases {
			rel()
		}
		for _, v := range tenants {
			waitFor(t, func() bool {
				n, err := admin.Get(ctx, keys.Key(v)).Int()
				return err == nil && n == 0 && admin.Exists(ctx, keys.LeaseSetKey(v)).Val() == 0
			}, "tenant "+v+" released")
		}

		rl, err := gatetest.Build(t, r, redisquota.Type, `{"address":"`+c.URL+`","redis_mode":"cluster","limit":1,"prefix":"rate:"}`, gate.Env{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range tenants {
			req := request(v)
			expect(t, admit(t, rl.(gate.Admitter), req), req, gate.Admit, wire.ClassReserved, false)
			req = request(v)
			expect(t, admit(t, rl.(gate.Admitter), req), req, gate.Defer, wire.ClassOverflow, false)
		}
	})

	t.Run("MOVED after a failover", func(t *testing.T) {
		// A client that still maps the slot to the old master gets MOVED
		// from it and follows it: the script runs once, on the new master.
		g, err := gatetest.Build(t, r, redisquota.Type,
			`{"address":"`+c.URL+`","redis_mode":"cluster","limit":5,"mode":"concurrency"}`, gate.Env{})
		if err != nil {
			t.Fatal(err)
		}
		a, keys := g.(gate.Admitter), g.(leaseSetKeyer)
		v := plain[2]
		old := redis.NewClient(&redis.Options{Addr: c.Nodes[2].Addr})
		defer old.Close()
		if m, err := c.MasterOf(ctx, keys.Key(v)); err != nil || m != 2 {
			t.Fatalf("tenant %s on node %d (%v), want 2", v, m, err)
		}
		req := request(v)
		expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, true) // the client maps the slot now
		moved := func() int {
			stats := old.Info(ctx, "errorstats").Val()
			for _, line := range strings.Split(stats, "\r\n") {
				if rest, ok := strings.CutPrefix(line, "errorstat_MOVED:count="); ok {
					n, _ := strconv.Atoi(rest)
					return n
				}
			}
			return 0
		}
		before := moved()
		replica := redis.NewClient(&redis.Options{Addr: c.Nodes[5].Addr}) // node 2's replica
		defer replica.Close()
		if err := replica.ClusterFailover(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			return strings.Contains(old.Info(ctx, "replication").Val(), "role:slave")
		}, "the old master turned replica")
		for range 2 {
			req := request(v)
			expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, true)
		}
		if moved() == before {
			t.Fatal("the old master sent no MOVED: the client had already reloaded the slot map")
		}
		if n, err := admin.Get(ctx, keys.Key(v)).Int(); err != nil || n != 3 {
			t.Errorf("counter %d (%v) after 3 admissions, want 3: each script ran once", n, err)
		}
	})

	t.Run("a master not answering holds up only its tenants", func(t *testing.T) {
		g, err := gatetest.Build(t, r, redisquota.Type,
			`{"address":"`+c.URL+`","redis_mode":"cluster","limit":1000,"mode":"concurrency"}`, gate.Env{})
		if err != nil {
			t.Fatal(err)
		}
		a := g.(gate.Admitter)
		stuck, other := plain[1], plain[0] // on c.Nodes[1] and c.Nodes[0]
		for _, v := range []string{stuck, other} {
			req := request(v)
			d := admit(t, a, req)
			expect(t, d, req, gate.Admit, wire.ClassReserved, true)
			d.Release()
		}
		node := redis.NewClient(&redis.Options{Addr: c.Nodes[1].Addr})
		pid, err := strconv.Atoi(infoField(node.Info(ctx, "server").Val(), "process_id"))
		node.Close()
		if err != nil {
			t.Fatal(err)
		}
		// Stopped well within cluster-node-timeout (1 s): no failover.
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		cont := sync.OnceFunc(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		t.Cleanup(cont)
		stuckDone := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			d, err := a.Admit(ctx, request(stuck))
			if err == nil {
				d.Release()
			}
			stuckDone <- err
		}()
		time.Sleep(50 * time.Millisecond) // its pipeline is in flight
		actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		d, err := a.Admit(actx, request(other))
		cancel()
		cont()
		if err != nil {
			t.Fatalf("tenant on a live master while another master is stopped: %v", err)
		}
		d.Release()
		<-stuckDone // answered once the node runs again, or its context's error
		for _, v := range []string{stuck, other} {
			waitFor(t, func() bool {
				n, err := admin.Get(ctx, "quota:userid:"+v).Int()
				return err == nil && n == 0
			}, "tenant "+v+" released")
		}
	})

	t.Run("master killed", func(t *testing.T) {
		t.Cleanup(func() { waitPoolDialers(t) }) // runs after the gate's Close
		// Redis' default (cluster-require-full-coverage yes) stops every
		// slot while one has no master; turned off, the other masters serve
		// on.
		for _, n := range c.Nodes {
			m := redis.NewClient(&redis.Options{Addr: n.Addr})
			err := m.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		g, err := gatetest.Build(t, r, redisquota.Type,
			`{"address":"`+c.URL+`","redis_mode":"cluster","limit":1000,"mode":"concurrency"}`, gate.Env{})
		if err != nil {
			t.Fatal(err)
		}
		a := g.(gate.Admitter)
		dead, live := plain[0], plain[1] // on c.Nodes[0], which is killed, and on c.Nodes[1]
		try := func(v string) error {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			d, err := a.Admit(ctx, request(v))
			if err == nil {
				if d.Verdict != gate.Admit {
					t.Fatalf("tenant %s: %v (%s), want admitted (limit 1000)", v, d.Verdict, d.Reason)
				}
				d.Release()
			}
			return err
		}
		for _, v := range []string{dead, live} {
			if err := try(v); err != nil {
				t.Fatal(err)
			}
		}
		// The kill must lose nothing the test counts on: the releases above
		// are written (they are queued) and have reached the replica that
		// will be promoted (replication is asynchronous; a write the replica
		// never saw would leave the counter above 0 until its lease expired).
		for _, v := range []string{dead, live} {
			waitFor(t, func() bool {
				n, err := admin.Get(ctx, "quota:userid:"+v).Int()
				return err == nil && n == 0
			}, "tenant "+v+" released before the kill")
		}
		m := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
		acked, err := m.Wait(ctx, 1, 5*time.Second).Result()
		m.Close()
		if err != nil || acked < 1 {
			t.Fatalf("the killed master's writes reached %d replicas (%v), want 1", acked, err)
		}
		c.Nodes[0].Stop()
		killed := time.Now()
		var deadErrs, liveErrs int
		var recovered time.Duration
		for time.Since(killed) < 20*time.Second {
			if err := try(live); err != nil {
				if liveErrs++; liveErrs == 1 {
					t.Logf("tenant on a live master: %v", err)
				}
			}
			err := try(dead)
			if err != nil {
				if deadErrs++; deadErrs == 1 {
					t.Logf("tenant on the dead master: %v", err)
				}
			} else if deadErrs > 0 {
				recovered = time.Since(killed)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("tenant on the dead master admitted again %v after the kill, after %d errors", recovered.Round(time.Millisecond), deadErrs)
		switch {
		case deadErrs == 0:
			t.Error("no error for the tenant on the dead master")
		case recovered == 0:
			t.Error("the tenant on the dead master was not admitted again within 20 s")
		}
		if liveErrs != 0 {
			t.Errorf("%d errors for the tenant on a live master", liveErrs)
		}
		// Its counter and leases on the promoted replica are consistent:
		// every admission above was released.
		var last string
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := admin.Get(ctx, "quota:userid:"+dead).Int()
			if err == nil && n == 0 {
				break
			}
			last = "counter " + strconv.Itoa(n)
			if err != nil {
				last = err.Error()
			}
			if time.Now().After(deadline) {
				leases, _ := admin.ZRangeWithScores(ctx, g.(leaseSetKeyer).LeaseSetKey(dead), 0, -1).Result()
				t.Fatalf("the dead master's tenant not released on the promoted replica within 5 s: %s, leases %v", last, leases)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// infoField returns a field of an INFO answer.
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// waitPoolDialers waits (at most 3 s) until go-redis' background re-dialers
// are gone: a pool that failed to dial its node keeps one, sleeping 1 s
// between tries, until it sees the pool closed.
func waitPoolDialers(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		if n := runtime.Stack(buf, true); !bytes.Contains(buf[:n], []byte("(*ConnPool).tryDial")) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
