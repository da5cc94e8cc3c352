package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/redisclient"
)

// TestRedisSentinel starts a master, a replica and three sentinels, writes a
// key through sluice's sentinel-mode client, fails over and reads the key
// back through the same client from the promoted replica, then writes again.
func TestRedisSentinel(t *testing.T) {
	s := StartRedisSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o, err := redisclient.Topology{Mode: redisclient.Sentinel, Addrs: s.Sentinels[1:], MasterName: s.MasterName}.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := o.New()
	defer c.Close()
	if err := c.Set(ctx, "k", "before", 0).Err(); err != nil {
		t.Fatalf("set through the sentinels: %v", err)
	}
	if err := c.Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
		t.Fatalf("WAIT: %v", err)
	}
	oldMaster := s.Master.Addr
	now, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now == oldMaster || s.Master.Addr != now {
		t.Fatalf("failover: master %s (was %s), harness says %s", now, oldMaster, s.Master.Addr)
	}
	// The client follows the sentinels to the new master; a write on the
	// old one (now a replica) would fail with READONLY.
	var got string
	if err := poll(ctx, func() error {
		if err := c.Set(ctx, "k2", "after", 0).Err(); err != nil {
			return err
		}
		got, err = c.Get(ctx, "k").Result()
		return err
	}); err != nil {
		t.Fatalf("after the failover: %v", err)
	}
	if got != "before" {
		t.Errorf("k = %q on the new master, want before", got)
	}
	if v, err := RedisClient(t, "redis://"+now+"/0").Get(ctx, "k2").Result(); err != nil || v != "after" {
		t.Errorf("k2 on %s = %q, %v; want the write after the failover there", now, v, err)
	}
}
