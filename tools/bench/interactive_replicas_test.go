package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
)

// -x<n> names n replicas; each gets 1/n of the queue's concurrency
// (rounded up), the shared account and its own replica id, and the
// original configuration is left as it was.
func TestIPReplicas(t *testing.T) {
	a, err := ipArmByName("headroom-resume-pods-w2-t3-x3", ipPools()[0])
	if err != nil || a.replicas != 3 || !a.resume {
		t.Fatalf("arm = %+v, %v; want 3 replicas with resume", a, err)
	}
	for _, bad := range []string{"headroom-x0", "headroom-x", "headroom-xy"} {
		if _, err := ipArmByName(bad, ipPools()[0]); err == nil || !strings.Contains(err.Error(), "replica count") {
			t.Errorf("%s: %v, want a replica-count error", bad, err)
		}
	}
	cfg := &config.Config{Concurrency: 64, TransportConfig: config.TransportConfig{Queues: []config.Queue{{
		Queue: transport.Queue{Name: "q"}, GateType: "pool-headroom", GateParams: map[string]json.RawMessage{"reserve": json.RawMessage("4")}}}}}
	cs := ipReplicaConfigs(cfg, 3, "127.0.0.1:6399")
	ids := map[string]bool{}
	for _, c := range cs {
		q := c.TransportConfig.Queues[0]
		if c.Concurrency != 22 || string(q.GateParams["account_redis"]) != `"127.0.0.1:6399"` || string(q.GateParams["reserve"]) != "4" {
			t.Errorf("replica config: concurrency %d, params %s; want 22, the account and the arm's params", c.Concurrency, q.GateParams)
		}
		ids[string(q.GateParams["replica"])] = true
	}
	if len(ids) != 3 {
		t.Errorf("replica ids %v, want 3 distinct", ids)
	}
	if _, ok := cfg.TransportConfig.Queues[0].GateParams["replica"]; ok || cfg.Concurrency != 64 {
		t.Error("the original configuration was changed")
	}
	// -noaccount: the replicas count only their own calls
	if a, err := ipArmByName("headroom-resume-pods-x2-noaccount", ipPools()[0]); err != nil || a.replicas != 2 || !a.noAccount {
		t.Errorf("arm = %+v, %v; want 2 replicas without an account", a, err)
	}
	for _, c := range ipReplicaConfigs(cfg, 2, "") {
		if _, ok := c.TransportConfig.Queues[0].GateParams["account_redis"]; ok || c.Concurrency != 32 {
			t.Errorf("a replica without an account: params %s, concurrency %d", c.TransportConfig.Queues[0].GateParams, c.Concurrency)
		}
	}
}
