package keys

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterFor returns the client of the master holding key: c itself on a
// single node, the node's client on a cluster.
func MasterFor(ctx context.Context, c redis.UniversalClient, key string) (*redis.Client, error) {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("unexpected Redis client %T", c)
}

// WaitPipelined runs the commands fn queues in one pipeline on a connection
// of its own to node, followed by WAIT replicas timeout, and returns how
// many replicas confirmed them. WAIT counts what its own connection wrote,
// which is why the writes and WAIT share one connection. When node does not
// know one of scripts (a promoted replica's script cache starts empty) the
// scripts are loaded and the pipeline runs again, so every script run
// through it must be safe to run twice. The commands' own errors are in
// the commands fn made; err is the pipeline's.
func WaitPipelined(ctx context.Context, node *redis.Client, replicas int, timeout time.Duration, fn func(redis.Pipeliner), scripts ...*redis.Script) (int64, error) {
	conn := node.Conn()
	defer conn.Close()
	var wait *redis.IntCmd
	run := func() error {
		_, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
			fn(p)
			wait = redis.NewIntCmd(ctx, "wait", replicas, timeout.Milliseconds())
			return p.Process(ctx, wait)
		})
		return err
	}
	err := run()
	if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
		for _, sc := range scripts {
			if err = sc.Load(ctx, conn).Err(); err != nil {
				return 0, err
			}
		}
		err = run()
	}
	if err != nil {
		return 0, err
	}
	return wait.Val(), nil
}
