package main

// Replicas in interactive-protection: a headroom arm named with -x<n> runs
// n sluice replicas on the one batch queue (the memory transport serves
// several consumers of one queue), each with the queue's concurrency / n
// (rounded up), their pool-headroom gates sharing one account in a
// redis-server the bench starts (gate_params.account_redis). The pool's
// take-backs per batch request (batch_aborted_per_request) compare 1, 2 and 3
// replicas: without the account each replica would read the others'
// batch as interactive traffic and take back more.

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/memory"
)

// ipReplicasPart reads an arm name's x<n> part: n ≥ 1 replicas.
func ipReplicasPart(name, part string) (int, error) {
	n, err := strconv.Atoi(part[1:])
	if err != nil || n < 1 {
		return 0, fmt.Errorf("arm %q: x<n> wants a replica count ≥ 1", name)
	}
	return n, nil
}

// ipSharedMem is the memory transport the replicas share: a replica that
// stops does not close it under the others.
type ipSharedMem struct{ *memory.Transport }

// Close does nothing; the bench owns the transport.
func (ipSharedMem) Close() error { return nil }

// ipReplicaConfigs returns the n replicas' configurations of cfg: the
// queues' concurrency split n ways (rounded up), and each queue's gate
// given the account at addr and the replica's id (addr "": no account).
func ipReplicaConfigs(cfg *config.Config, n int, addr string) []*config.Config {
	out := make([]*config.Config, n)
	for i := range n {
		c := *cfg
		c.Concurrency = max(1, (cfg.Concurrency+n-1)/n)
		c.TransportConfig.Queues = make([]config.Queue, len(cfg.TransportConfig.Queues))
		for j, q := range cfg.TransportConfig.Queues {
			q.GateParams = make(map[string]json.RawMessage, len(q.GateParams)+2)
			for k, v := range cfg.TransportConfig.Queues[j].GateParams {
				q.GateParams[k] = v
			}
			if addr != "" {
				q.GateParams["account_redis"], _ = json.Marshal(addr)
				q.GateParams["replica"], _ = json.Marshal(fmt.Sprintf("replica-%d", i))
			}
			c.TransportConfig.Queues[j] = q
		}
		out[i] = &c
	}
	return out
}

// ipApps builds the arm's sluice: one app on mem, or with n > 1 replicas
// n apps sharing mem and, with account, an account in a redis-server
// started here. The returned func stops that server once the apps have
// stopped.
func ipApps(cfg *config.Config, mem *memory.Transport, n int, account bool) ([]*app.App, func(), error) {
	if n <= 1 {
		ap, err := newApp(cfg, app.Options{Transport: mem, Registry: prometheus.NewRegistry()})
		if err != nil {
			return nil, nil, err
		}
		return []*app.App{ap}, func() {}, nil
	}
	addr, stop := "", func() {}
	if account {
		r, err := testenv.StartRedisProcess(testenv.RedisOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("the replicas' account: %w", err)
		}
		addr, stop = r.Addr, r.Stop
	}
	var apps []*app.App
	for _, c := range ipReplicaConfigs(cfg, n, addr) {
		ap, err := newApp(c, app.Options{Transport: ipSharedMem{mem}, Registry: prometheus.NewRegistry()})
		if err != nil {
			stop()
			return nil, nil, err
		}
		apps = append(apps, ap)
	}
	return apps, stop, nil
}
