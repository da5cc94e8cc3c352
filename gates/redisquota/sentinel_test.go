package redisquota_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/internal/redisclient"
	"github.com/sluice-io/sluice/internal/testenv"
)

// TestSentinel runs the gate in sentinel mode against a real master, its
// replica and three redis-sentinel processes: the conformance suite in both
// modes (the topology in gate_params), then a gate that takes the topology
// from the deployment keeps counting on the promoted replica after a
// failover.
func TestSentinel(t *testing.T) {
	s := testenv.StartRedisSentinel(t)
	r := registry(t)
	addrs := `["` + strings.Join(s.Sentinels[1:], `","`) + `"]`

	t.Run("conformance", func(t *testing.T) {
		for _, mode := range []string{"rate-limit", "concurrency"} {
			t.Run(mode, func(t *testing.T) {
				gatetest.Run(t, func(t testing.TB) gate.Gate {
					g, err := gatetest.Build(t, r, redisquota.Type, `{"address":"`+s.URL+`","redis_mode":"sentinel","redis_master_name":"`+
						s.MasterName+`","redis_addrs":`+addrs+`,"limit":3,"mode":"`+mode+`"}`, gate.Env{})
					if err != nil {
						t.Fatal(err)
					}
					return g
				}, gatetest.Features{})
			})
		}
	})

	t.Run("failover", func(t *testing.T) {
		ctx := context.Background()
		env := gate.Env{RedisMode: "sentinel", RedisAddrs: s.Sentinels[1:], RedisMasterName: s.MasterName}
		g, err := gatetest.Build(t, r, redisquota.Type, `{"address":"`+s.Sentinels[0]+`","limit":5,"mode":"concurrency"}`, env)
		if err != nil {
			t.Fatal(err)
		}
		a, keys := g.(gate.Admitter), g.(leaseSetKeyer)
		o, err := redisclient.Topology{Mode: redisclient.Sentinel, Addrs: s.Sentinels[1:], MasterName: s.MasterName}.Parse(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		admin := o.New()
		t.Cleanup(func() { _ = admin.Close() })
		const v = "tenant-f"
		for range 2 {
			req := request(v)
			expect(t, admit(t, a, req), req, gate.Admit, wire.ClassReserved, true)
		}
		if err := admin.Do(ctx, "WAIT", 1, 5000).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Failover(ctx); err != nil {
			t.Fatal(err)
		}
		// The gate does not retry (its caller asks again): right after the
		// failover an admission may fail, which defers the request; it is
		// admitted again once the client follows the sentinels.
		deadline := time.Now().Add(20 * time.Second)
		for {
			req := request(v)
			actx, cancel := context.WithTimeout(ctx, 5*time.Second)
			d, err := a.Admit(actx, req)
			cancel()
			if err == nil && d.Verdict == gate.Admit {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not admitted 20 s after the failover: %+v, %v", d, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n, err := admin.Get(ctx, keys.Key(v)).Int(); err != nil || n != 3 {
			t.Errorf("counter %s on the new master = %d, %v; want 3 (2 before the failover, replicated, and 1 after)", keys.Key(v), n, err)
		}
	})
}
