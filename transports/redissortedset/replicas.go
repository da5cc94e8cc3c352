package redissortedset

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// Writes acknowledged by replicas (min_replicas_acked).
//
// Redis replicates asynchronously: a master acknowledges a write before its
// replicas hold it, and a master that dies in between takes the write with
// it. For a result that means the request is acked to the core while its
// result and its lease removal exist nowhere once a replica is promoted:
// the lease comes back, expires, and the request runs and is answered a
// second time (or, had a reader already taken the first answer, twice).
// WAIT closes the window: it blocks the connection that wrote until that
// many replicas hold everything it wrote. It has to run on that same
// connection, so the settle script and WAIT go in one pipeline on a
// connection of its own to the master of the queue's slot (go-redis's
// cluster client would spread them over its pool).

// runAcked runs script on the master holding keys[0] and waits until
// MinReplicasAcked replicas hold its writes, for up to
// min_replicas_timeout_ms. A script error or a lost connection returns an
// error with nothing known acknowledged: the caller retries, and the fenced
// scripts make a retry of a write that did land a no-op (counted as a late
// result, since its lease is gone). A write that landed but is still short of
// replicas when the time is up is returned as done, logged and counted
// (Events "replica_shortfalls"): it cannot be taken back, and holding every
// later write of the queue behind it (a master left without replicas
// after a failover) would stop the queue.
func (t *Transport) runAcked(ctx context.Context, script *redis.Script, ks []string, args ...any) (*redis.Cmd, error) {
	node, err := keys.MasterFor(ctx, t.client, ks[0])
	if err != nil {
		return nil, err
	}
	n := t.opts.MinReplicasAcked
	var res *redis.Cmd
	got, err := keys.WaitPipelined(ctx, node, n, ms(t.opts.MinReplicasTimeoutMS), func(p redis.Pipeliner) {
		res = script.EvalSha(ctx, p, ks, args...)
	}, script)
	if err == nil && res.Err() != nil {
		err = res.Err()
	}
	if err != nil {
		t.reloadOnMoved(ctx, err)
		return nil, err
	}
	if got < int64(n) {
		t.replicaShortfalls.Add(1)
		t.log.Warn("a result is written on the master but fewer replicas than min_replicas_acked confirmed it within min_replicas_timeout_ms; a failover now could lose it",
			"queue", ks[0], "replicas", got, "min_replicas_acked", n)
	}
	return res, nil
}

// runScript runs a result-writing script: on the client, or through
// runAcked when min_replicas_acked is set.
func (t *Transport) runScript(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	if t.opts.MinReplicasAcked <= 0 {
		return script.Run(ctx, t.client, keys, args...)
	}
	res, err := t.runAcked(ctx, script, keys, args...)
	if err != nil {
		c := redis.NewCmd(ctx)
		c.SetErr(err)
		return c
	}
	return res
}

// reloadOnMoved makes a cluster client re-read the slot map after an error
// that says the topology changed (the node client used for WAIT does not
// follow redirections by itself).
func (t *Transport) reloadOnMoved(ctx context.Context, err error) {
	cc, ok := t.client.(*redis.ClusterClient)
	if !ok || err == nil {
		return
	}
	var re redis.Error
	if errors.As(err, &re) && !strings.HasPrefix(err.Error(), "MOVED") && !strings.HasPrefix(err.Error(), "ASK") &&
		!strings.HasPrefix(err.Error(), "CLUSTERDOWN") && !strings.HasPrefix(err.Error(), "READONLY") {
		return // a script's own error: the topology is fine
	}
	cc.ReloadState(ctx)
}
