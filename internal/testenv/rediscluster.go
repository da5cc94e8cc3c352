package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisCluster is a Redis Cluster of redis-server processes on 127.0.0.1,
// started for a test: masters that share the 16,384 hash slots evenly, each
// with its replicas.
type RedisCluster struct {
	// Nodes are the servers, masters first (Nodes[:Masters]) then replicas.
	Nodes []*Redis
	// Masters is how many of Nodes were started as masters.
	Masters int
	// URL is the cluster in go-redis's cluster URL form:
	// redis://host:port?addr=host2:port2&addr=... (every node).
	URL string
	// opts are the options each node was started with (its port
	// included), for Restart.
	opts []RedisOptions
}

// RedisClusterOptions configure StartRedisCluster.
type RedisClusterOptions struct {
	// Masters is the number of masters (default 3).
	Masters int
	// Replicas is the number of replicas per master (default 1; see
	// NoReplicas).
	Replicas int
	// NoReplicas starts masters only (Replicas is then ignored).
	NoReplicas bool
	// NodeTimeout is cluster-node-timeout: how long a master may be
	// unreachable before its replica is promoted (default 1s).
	NodeTimeout time.Duration
	// Persist keeps an append-only file per node.
	Persist bool
	// Env is added to every node's environment (e.g. FakeClock.Env).
	Env []string
}

// StartRedisCluster starts a Redis Cluster (3 masters with 1 replica each by
// default) and stops every node at the end of the test. It returns once
// every node reports cluster_state:ok and every replica is attached.
func StartRedisCluster(t testing.TB, o RedisClusterOptions) *RedisCluster {
	t.Helper()
	LookPath(t, "redis-server", "redis-server")
	c, err := StartRedisClusterProcesses(o, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// StartRedisClusterProcesses starts a cluster outside a test (benchmarks);
// every node's data directory is made under dir. The caller calls Stop.
func StartRedisClusterProcesses(o RedisClusterOptions, dir string) (*RedisCluster, error) {
	if o.Masters == 0 {
		o.Masters = 3
	}
	if o.NoReplicas {
		o.Replicas = 0
	} else if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = time.Second
	}
	if o.Masters < 1 || o.Replicas < 0 {
		return nil, fmt.Errorf("redis cluster: %d masters, %d replicas each", o.Masters, o.Replicas)
	}
	c := &RedisCluster{Masters: o.Masters}
	n := o.Masters * (1 + o.Replicas)
	for i := 0; i < n; i++ {
		nodeDir := filepath.Join(dir, "node-"+strconv.Itoa(i))
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			c.Stop()
			return nil, err
		}
		ro := RedisOptions{Dir: nodeDir, Persist: o.Persist, Env: o.Env, Args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
			// A replica may take over however long it was cut off: the
			// tests kill masters on purpose.
			"--cluster-replica-validity-factor", "0",
		}}
		r, err := StartRedisProcess(ro)
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("redis cluster node %d: %w", i, err)
		}
		_, port, _ := net.SplitHostPort(r.Addr)
		ro.Port, _ = strconv.Atoi(port)
		c.Nodes = append(c.Nodes, r)
		c.opts = append(c.opts, ro)
	}
	addrs := make([]string, len(c.Nodes))
	for i, r := range c.Nodes {
		addrs[i] = r.Addr
	}
	c.URL = "redis://" + addrs[0]
	if len(addrs) > 1 {
		c.URL += "?addr=" + strings.Join(addrs[1:], "&addr=")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.form(ctx, o); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	return c, nil
}

// form assigns the slots, introduces the nodes and attaches the replicas.
func (c *RedisCluster) form(ctx context.Context, o RedisClusterOptions) error {
	clients := make([]*redis.Client, len(c.Nodes))
	for i, r := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: r.Addr})
		defer clients[i].Close()
	}
	const slots = 16384
	for i := 0; i < o.Masters; i++ {
		lo, hi := i*slots/o.Masters, (i+1)*slots/o.Masters-1
		if err := clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("node %s: addslotsrange %d-%d: %w", c.Nodes[i].Addr, lo, hi, err)
		}
	}
	host, port, _ := net.SplitHostPort(c.Nodes[0].Addr)
	for i := 1; i < len(clients); i++ {
		if err := clients[i].ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("node %s: meet: %w", c.Nodes[i].Addr, err)
		}
	}
	ids := make([]string, o.Masters)
	for i := range ids {
		id, err := clients[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("node %s: myid: %w", c.Nodes[i].Addr, err)
		}
		ids[i] = id
	}
	// A replica can only attach once it knows its master.
	for i := o.Masters; i < len(clients); i++ {
		master := ids[(i-o.Masters)%o.Masters]
		if err := retry(ctx, func() error {
			return clients[i].ClusterReplicate(ctx, master).Err()
		}); err != nil {
			return fmt.Errorf("node %s: replicate %s: %w", c.Nodes[i].Addr, master, err)
		}
	}
	for i, cl := range clients {
		if err := retry(ctx, func() error {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(clients))+"\r") {
				return fmt.Errorf("not formed yet: %s", strings.ReplaceAll(info, "\r\n", " "))
			}
			if i >= o.Masters {
				repl, err := cl.Info(ctx, "replication").Result()
				if err != nil {
					return err
				}
				if !strings.Contains(repl, "master_link_status:up") {
					return fmt.Errorf("replica not in sync yet")
				}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("node %s: %w", c.Nodes[i].Addr, err)
		}
	}
	return nil
}

// retry calls fn every 50ms until it succeeds or ctx ends, returning its
// last error.
func retry(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MasterOf returns the index in Nodes of the node serving key's hash slot
// as a master now (after failovers too), or -1.
func (c *RedisCluster) MasterOf(ctx context.Context, key string) (int, error) {
	for _, r := range c.Nodes {
		if r.cmd == nil {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: r.Addr})
		slot, err := cl.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			cl.Close()
			continue
		}
		shards, err := cl.ClusterShards(ctx).Result()
		cl.Close()
		if err != nil {
			return -1, fmt.Errorf("node %s: cluster shards: %w", r.Addr, err)
		}
		for _, s := range shards {
			owns := false
			for _, sr := range s.Slots {
				owns = owns || (sr.Start <= slot && slot <= sr.End)
			}
			if !owns {
				continue
			}
			for _, sn := range s.Nodes {
				if sn.Role != "master" {
					continue
				}
				for j, n := range c.Nodes {
					if n.Addr == net.JoinHostPort(sn.IP, strconv.FormatInt(sn.Port, 10)) {
						return j, nil
					}
				}
			}
		}
		return -1, nil
	}
	return -1, fmt.Errorf("no node answers")
}

// Restart kills node i (kill -9) and starts it again on the same port,
// data directory and cluster configuration (nodes.conf), returning once it
// reports cluster_state:ok. Without Persist it comes back empty.
func (c *RedisCluster) Restart(i int) error {
	c.Nodes[i].Stop()
	r, err := StartRedisProcess(c.opts[i])
	if err != nil {
		return fmt.Errorf("restart redis cluster node %d: %w", i, err)
	}
	c.Nodes[i] = r
	cl := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := retry(ctx, func() error {
		info, err := cl.ClusterInfo(ctx).Result()
		if err == nil && !strings.Contains(info, "cluster_state:ok") {
			err = fmt.Errorf("cluster_state not ok yet")
		}
		return err
	}); err != nil {
		return fmt.Errorf("restart redis cluster node %s: %w", r.Addr, err)
	}
	return nil
}

// Stop stops every node; safe to call twice.
func (c *RedisCluster) Stop() {
	for _, r := range c.Nodes {
		r.Stop()
	}
}

// ReplicasOf returns the indexes in Nodes of the replicas attached to the
// master Nodes[master] now.
func (c *RedisCluster) ReplicasOf(ctx context.Context, master int) ([]int, error) {
	cl := redis.NewClient(&redis.Options{Addr: c.Nodes[master].Addr})
	defer cl.Close()
	role, err := cl.Do(ctx, "ROLE").Slice()
	if err != nil {
		return nil, fmt.Errorf("node %s: role: %w", c.Nodes[master].Addr, err)
	}
	if len(role) < 3 || role[0] != "master" {
		return nil, fmt.Errorf("node %s is not a master: %v", c.Nodes[master].Addr, role)
	}
	reps, _ := role[2].([]any)
	var out []int
	for _, rep := range reps {
		f, _ := rep.([]any)
		if len(f) < 2 {
			continue
		}
		addr := net.JoinHostPort(fmt.Sprint(f[0]), fmt.Sprint(f[1]))
		for j, n := range c.Nodes {
			if n.Addr == addr {
				out = append(out, j)
			}
		}
	}
	return out, nil
}

// SpreadOverMasters returns, for each master Nodes[m] (m < Masters), the
// smallest i whose key(i) that master serves: keys to put load or faults on
// every master. Call it before any failover.
func (c *RedisCluster) SpreadOverMasters(ctx context.Context, key func(i int) string) ([]int, error) {
	out := make([]int, c.Masters)
	for m := range out {
		out[m] = -1
	}
	for i, left := 0, c.Masters; left > 0; i++ {
		if i == 10_000 {
			return nil, fmt.Errorf("no key on some master among %d tried", i)
		}
		m, err := c.MasterOf(ctx, key(i))
		if err != nil {
			return nil, err
		}
		if m >= 0 && m < c.Masters && out[m] < 0 {
			out[m] = i
			left--
		}
	}
	return out, nil
}
