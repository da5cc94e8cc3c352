package config

import (
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
)

func TestParseWorkerPools(t *testing.T) {
	pools, err := ParseWorkerPools([]byte(`[{"id":"default","workers":8},{"id":"batch","workers":"x"}]`), "pools.json")
	if err == nil || !strings.Contains(err.Error(), "pools.json") {
		t.Errorf("workers as a string: %v, %v", pools, err)
	}
	_, err = ParseWorkerPools([]byte(`[{"id":"a","workers":1,"gate_typ":"constant"}]`), "pools.json")
	if err == nil || !strings.Contains(err.Error(), "gate_typ") || !strings.Contains(err.Error(), "gate_type") {
		t.Errorf("misspelt field: %v", err)
	}
	pools, err = ParseWorkerPools([]byte(`[{"id":"default","workers":8},{"id":"batch","workers":2,"gate_type":"constant","gate_params":{"budget":"0.5"}}]`), "pools.json")
	if err != nil || len(pools) != 2 || pools[1].Workers != 2 || pools[1].GateType != "constant" || string(pools[1].GateParams["budget"]) != `"0.5"` {
		t.Fatalf("pools %+v, %v", pools, err)
	}
}

// Without pools, one pool "default" of concurrency workers serves every
// queue, and a queue alone may use all of it; with pools, each queue must
// name one that exists.
func TestWorkerPoolDefaultsAndValidation(t *testing.T) {
	queue := func(name, pool string) Queue {
		return Queue{Queue: transport.Queue{Name: name}, IGWBaseURL: "http://gw", WorkerPoolID: pool}
	}
	c := &Config{Concurrency: 16, TransportConfig: TransportConfig{ResultQueueName: "r", Queues: []Queue{queue("a", ""), queue("b", "")}}}
	c.SetDefaults()
	if len(c.WorkerPools) != 1 || c.WorkerPools[0].ID != "default" || c.WorkerPools[0].Workers != 16 {
		t.Errorf("default pools %+v", c.WorkerPools)
	}
	for _, q := range c.TransportConfig.Queues {
		if q.WorkerPoolID != "default" || q.MaxConcurrency != 16 {
			t.Errorf("queue %s: pool %q max %d", q.Name, q.WorkerPoolID, q.MaxConcurrency)
		}
	}
	if err := c.Validate(Known{}); err != nil {
		t.Fatal(err)
	}

	c = &Config{TransportConfig: TransportConfig{ResultQueueName: "r", Queues: []Queue{queue("a", "batch"), queue("b", "")}},
		WorkerPools: []WorkerPool{{ID: "batch", Workers: 4}, {ID: "batch", Workers: 0}, {ID: "", Workers: 1}}}
	c.SetDefaults()
	if q := c.TransportConfig.Queues[0]; q.MaxConcurrency != 4 {
		t.Errorf("queue of pool batch: max %d, want the pool's 4", q.MaxConcurrency)
	}
	err := c.Validate(Known{})
	for _, want := range []string{
		`worker_pools[1].id: duplicate of worker_pools[0] ("batch")`,
		`worker_pools[1].workers: pool "batch" must have at least 1 worker, got 0`,
		`worker_pools[2].id: required`,
		`transport_config.queues[1].worker_pool_id: worker pool "default" specified in queue config not found in pool configuration`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validation %v lacks %q", err, want)
		}
	}
}
