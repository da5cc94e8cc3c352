package config

import (
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
)

// The deployment's Redis topology (redis_mode, redis_addrs,
// redis_master_name) is read from JSON and validated as upstream's mode,
// addrs and master_name are.
func TestRedisTopology(t *testing.T) {
	base := func() *Config {
		c := &Config{Transport: "redis-sortedset", TransportConfig: TransportConfig{ResultQueueName: "r",
			Queues: []Queue{{Queue: transport.Queue{Name: "q"}, IGWBaseURL: "http://gw"}}}}
		c.SetDefaults()
		return c
	}
	c, err := Parse([]byte(`{"transport":"redis-sortedset","redis_mode":"sentinel","redis_master_name":"mymaster",
		"redis_addrs":["s2:26379","s3:26379"],"transport_config":{"result_queue_name":"r","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}}`), "test")
	if err != nil {
		t.Fatal(err)
	}
	if c.RedisMode != "sentinel" || c.RedisMasterName != "mymaster" || len(c.RedisAddrs) != 2 {
		t.Fatalf("parsed %q %q %v", c.RedisMode, c.RedisMasterName, c.RedisAddrs)
	}
	c.SetDefaults()
	if err := c.Validate(known()); err != nil {
		t.Errorf("sentinel config: %v", err)
	}
	for name, tc := range map[string]struct {
		mode, master string
		addrs        []string
		want         string
	}{
		"standalone":               {"standalone", "", nil, ""},
		"sentinel without name":    {"sentinel", "", nil, "redis_mode: sentinel needs redis_master_name"},
		"name without sentinel":    {"cluster", "m", nil, "redis_master_name: \"m\" needs redis_mode sentinel"},
		"addrs in single mode":     {"", "", []string{"h:1"}, "redis_addrs: [h:1] need redis_mode cluster or sentinel"},
		"an address not host:port": {"cluster", "", []string{"h"}, `redis_addrs: "h" is not host:port`},
		"unknown mode":             {"replicated", "", nil, `redis_mode: "replicated": want single (or standalone), cluster or sentinel`},
	} {
		c := base()
		c.RedisMode, c.RedisMasterName, c.RedisAddrs = tc.mode, tc.master, tc.addrs
		err := c.Validate(known())
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
