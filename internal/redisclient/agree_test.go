package redisclient

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/config"
)

// core/config checks the deployment's redis_mode, redis_addrs and
// redis_master_name with its own copy of Topology.Validate's rules (core
// links only core): both must accept and refuse the same topologies.
func TestConfigAgreesWithTopology(t *testing.T) {
	for _, tc := range []struct {
		mode, master string
		addrs        []string
	}{
		{"", "", nil}, {"single", "", nil}, {"standalone", "", nil}, {"Cluster", "", nil}, {"sentinel", "m", nil},
		{"sentinel", "", nil}, {"sentinel", "m", []string{"s:1", "s:2"}}, {"cluster", "", []string{"n:1"}},
		{"cluster", "m", nil}, {"", "m", nil}, {"", "", []string{"h:1"}}, {"standalone", "", []string{"h:1"}},
		{"sentinel", "m", []string{"nohost"}}, {"replicated", "", nil}, {"sentinel", "  ", nil},
	} {
		_, terr := ParseTopology(tc.mode, tc.addrs, tc.master)
		c := &config.Config{RedisMode: tc.mode, RedisAddrs: tc.addrs, RedisMasterName: tc.master}
		var redisProblems []string
		var ps config.Problems
		if err := c.Validate(config.Known{Transport: func(string) bool { return true }, Gate: func(string) bool { return true }}); errors.As(err, &ps) {
			for _, p := range ps {
				if strings.HasPrefix(p.Where, "redis_") {
					redisProblems = append(redisProblems, p.String())
				}
			}
		}
		if (terr == nil) != (len(redisProblems) == 0) {
			t.Errorf("mode %q addrs %v master_name %q: redisclient says %v, core/config says %v", tc.mode, tc.addrs, tc.master, terr, redisProblems)
		}
	}
}
