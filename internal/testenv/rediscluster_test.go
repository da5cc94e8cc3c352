package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRedisCluster forms a cluster of 3 masters and 3 replicas, writes keys
// across it, kills the master of one key and reads the key back from the
// promoted replica.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six redis-server processes")
	}
	c := StartRedisCluster(t, RedisClusterOptions{})
	if len(c.Nodes) != 6 {
		t.Fatalf("nodes = %d, want 6", len(c.Nodes))
	}
	o, err := redis.ParseClusterURL(c.URL)
	if err != nil {
		t.Fatalf("parse %s: %v", c.URL, err)
	}
	// go-redis reloads the slot map every 60s by default; a failover is
	// only seen that late unless the interval is short.
	o.ClusterStateReloadInterval = time.Second
	cl := redis.NewClusterClient(o)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	masters := map[string]bool{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		if err := cl.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
		i, err := c.MasterOf(ctx, k)
		if err != nil || i < 0 || i >= c.Masters {
			t.Fatalf("master of %s = %d, %v", k, i, err)
		}
		masters[c.Nodes[i].Addr] = true
	}
	if len(masters) < 2 {
		t.Fatalf("8 keys landed on %d master(s); slots are not spread", len(masters))
	}
	// WAIT so the replica has the key before its master dies.
	i, _ := c.MasterOf(ctx, "a")
	direct := redis.NewClient(&redis.Options{Addr: c.Nodes[i].Addr})
	n, err := direct.Do(ctx, "WAIT", 1, 2000).Int()
	direct.Close()
	if err != nil || n != 1 {
		t.Fatalf("wait on %s: %d replicas, %v", c.Nodes[i].Addr, n, err)
	}
	c.Nodes[i].Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := cl.Get(ctx, "a").Result()
		if err == nil && v == "a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after killing master %s, get a: %q, %v", c.Nodes[i].Addr, v, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if j, err := c.MasterOf(ctx, "a"); err != nil || j == i || j < 0 {
		t.Fatalf("master of a after failover = %d, %v (killed %d)", j, err, i)
	}
}
