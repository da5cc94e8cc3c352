package redisbudget_test

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/testenv"
)

// keysOnMasters returns one key per master of c: keys[i] is served by
// c.Nodes[i].
func keysOnMasters(t *testing.T, c *testenv.RedisCluster, prefix string) []string {
	t.Helper()
	is, err := c.SpreadOverMasters(context.Background(), func(i int) string { return prefix + strconv.Itoa(i) })
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(is))
	for m, i := range is {
		keys[m] = prefix + strconv.Itoa(i)
	}
	return keys
}

// TestCluster runs the gate against a Redis Cluster (3 masters, 3
// replicas), started once for its subtests: the conformance suite; keys on
// every master read through one seed node with the deployment's
// redis_mode; and a master killed while the gates refresh: the gate whose
// key it served follows its failure policy while the slot is unreachable
// and reads the key again from the promoted replica on its own, while the
// gate whose key is on another master never fails.
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
	keys := keysOnMasters(t, c, "budget-")

	t.Run("conformance", func(t *testing.T) {
		gatetest.Run(t, func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"address":"`+c.URL+`","redis_mode":"cluster","budget_key":"`+keys[1]+`"}`)
		}, gatetest.Features{
			Set: func(t testing.TB, b float64) {
				if err := admin.Set(ctx, keys[1], strconv.FormatFloat(b, 'g', -1, 64), 0).Err(); err != nil {
					t.Fatal(err)
				}
			},
			Failing: func(t testing.TB) gate.Gate {
				return mustBuild(t, `{"address":"127.0.0.1:`+strconv.Itoa(testenv.FreePort(t))+`","redis_mode":"cluster"}`)
			},
		})
	})

	t.Run("every master through one seed node", func(t *testing.T) {
		for i, k := range keys {
			v := strconv.FormatFloat(0.1*float64(i+1), 'g', -1, 64)
			if err := admin.Set(ctx, k, v, 0).Err(); err != nil {
				t.Fatal(err)
			}
			g, err := build(t, `{"address":"`+c.Nodes[0].Addr+`","budget_key":"`+k+`"}`, gate.Env{RedisMode: "cluster"})
			if err != nil {
				t.Fatal(err)
			}
			if b, err := gatetest.Query(t, g); err != nil || strconv.FormatFloat(b, 'g', -1, 64) != v {
				t.Errorf("key %s on master %d: budget %v, %v; want %s", k, i, b, err, v)
			}
		}
	})

	t.Run("master killed", func(t *testing.T) {
		t.Cleanup(func() { waitPoolDialers(t) }) // runs after the gates' Close
		// Redis' default (cluster-require-full-coverage yes) stops every
		// slot while one has no master: turned off, the other masters
		// serve on, and the gate on one of them must not notice.
		for _, n := range c.Nodes {
			m := redis.NewClient(&redis.Options{Addr: n.Addr})
			err := m.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err()
			m.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		// Written and acknowledged by the replica, so the promoted replica
		// has them.
		vals := []string{"0.7", "0.4"}
		for i, v := range vals {
			m := redis.NewClient(&redis.Options{Addr: c.Nodes[i].Addr})
			p := m.Pipeline()
			p.Set(ctx, keys[i], v, 0)
			wait := p.Do(ctx, "WAIT", 1, 5000)
			_, err := p.Exec(ctx)
			m.Close()
			if err != nil || wait.Val() != int64(1) {
				t.Fatalf("SET %s and WAIT for its replica: %v, %v", keys[i], wait.Val(), err)
			}
		}
		refreshers := make([]*gate.Refresher, 2)
		var failures [2]atomic.Int64
		for i := range refreshers {
			g := mustBuild(t, `{"address":"`+c.URL+`","redis_mode":"cluster","budget_key":"`+keys[i]+`"}`)
			r := gate.NewRefresher(g, gate.RefresherConfig{Name: keys[i], Interval: 20 * time.Millisecond,
				Observe: func(_ float64, err error) {
					if err != nil {
						if failures[i].Add(1) == 1 {
							t.Logf("gate %d: %v", i, err)
						}
					}
				}})
			r.Start(ctx)
			t.Cleanup(func() { _ = r.Close() })
			refreshers[i] = r
		}
		waitFor(t, 5*time.Second, func() bool { return refreshers[0].Budget() == 0.7 && refreshers[1].Budget() == 0.4 },
			"both budgets read")
		c.Nodes[0].Stop()
		killed := time.Now()
		// Closed (the default policy) while the slot has no master.
		waitFor(t, 10*time.Second, func() bool { return refreshers[0].Budget() == 0 }, "the closed policy on the dead master's key")
		// Back on its own once the replica is promoted.
		waitFor(t, 20*time.Second, func() bool { return refreshers[0].Budget() == 0.7 }, "the budget read from the promoted replica")
		t.Logf("budget back %v after the kill, %d failed queries meanwhile", time.Since(killed).Round(time.Millisecond), failures[0].Load())
		if failures[0].Load() == 0 {
			t.Error("no failed query on the dead master's key")
		}
		if n := failures[1].Load(); n != 0 || refreshers[1].Budget() != 0.4 {
			t.Errorf("the gate on a live master failed %d queries (budget %v)", n, refreshers[1].Budget())
		}
	})
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
