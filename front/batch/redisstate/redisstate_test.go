package redisstate_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/batch/redisstate"
	"github.com/sluice-io/sluice/front/batch/statetest"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The suite against a real redis-server, each run under its own prefix.
func TestConformance(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	var n atomic.Int64
	statetest.Run(t, func(t testing.TB) batch.State {
		s, err := redisstate.Dial(r.URL, fmt.Sprintf("t%d:", n.Add(1)), transport.Env{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// The suite against a real three-master Redis Cluster: a job's scripts and
// transactions must stay in one hash slot (CROSSSLOT otherwise).
func TestConformanceCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.RedisClusterOptions{Masters: 3, NoReplicas: true})
	var n atomic.Int64
	statetest.Run(t, func(t testing.TB) batch.State {
		s, err := redisstate.Dial(c.URL, fmt.Sprintf("c%d:", n.Add(1)), transport.Env{RedisMode: "cluster"})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
