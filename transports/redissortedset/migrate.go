package redissortedset

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// Migrator moves the state of sorted-set queues between sluice's key layout
// and upstream llm-d-async's, for a cut-over in either direction (`sluice
// migrate`). Every move is atomic and happens only if the source entry is
// still there, so a migration is safe to re-run: a second run finds nothing
// left to move.
type Migrator struct {
	c     redis.Cmdable
	opts  Options
	names keys.Names
	// DryRun counts what would move and writes nothing.
	DryRun bool
	// Force also moves leases that are still being renewed (a sluice
	// replica still runs the request; its result will be discarded as late).
	Force bool
}

// NewMigrator returns a migrator for the queues of a deployment configured
// with o (its prefix and retry_queue_name) on client c.
func NewMigrator(c redis.Cmdable, o Options) (*Migrator, error) {
	o.SetDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if _, ok := c.(*redis.ClusterClient); ok {
		return nil, errors.New("migrating between sluice's and upstream's layouts needs a single Redis: upstream's shared retry set and request keys span hash slots, so a cluster cannot move them atomically")
	}
	return &Migrator{c: c, opts: o, names: keys.Names{Prefix: o.Prefix, DelayedTemplate: o.RetryQueueName}}, nil
}

// UpstreamRetrySet is the name of upstream's retry set the migrator reads
// and writes.
func (m *Migrator) UpstreamRetrySet() string { return m.opts.UpstreamRetrySet() }

// LiveLeasesError reports leases still being renewed: a sluice replica still
// serves the queue.
type LiveLeasesError struct {
	Queue string
	// Count is the number of leases whose expiry is in the future.
	Count int64
	// Until is the latest expiry.
	Until time.Time
}

func (e *LiveLeasesError) Error() string {
	return fmt.Sprintf("%s: %d lease(s) still being renewed (the last expires %s): stop every sluice replica serving it first, or give --force",
		e.Queue, e.Count, e.Until.Format(time.RFC3339))
}

// CheckLeases returns a *LiveLeasesError when queue has leases whose expiry
// (by Redis' clock) is in the future, nil when none.
func (m *Migrator) CheckLeases(ctx context.Context, queue string) error {
	k := m.names.Queue(queue)
	now, err := m.c.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("read the Redis clock: %w", err)
	}
	from := "(" + strconv.FormatInt(now.UnixMilli(), 10)
	n, err := m.c.ZCount(ctx, k.Leases, from, "+inf").Result()
	if err != nil {
		return fmt.Errorf("count live leases of %s: %w", queue, err)
	}
	if n == 0 {
		return nil
	}
	last, err := m.c.ZRangeWithScores(ctx, k.Leases, -1, -1).Result()
	if err != nil {
		return fmt.Errorf("read leases of %s: %w", queue, err)
	}
	e := &LiveLeasesError{Queue: queue, Count: n}
	if len(last) == 1 {
		e.Until = time.UnixMilli(int64(last[0].Score))
	}
	return e
}

// RollbackReport is what MigrateToUpstream moved (or would move) for one
// queue, and what it left.
type RollbackReport struct {
	Queue string
	// Leased counts leased, unsettled requests returned to the queue with
	// their deadline score; LiveLeases of them were still being renewed.
	Leased, LiveLeases int
	// Retries counts delayed retries moved into upstream's retry set.
	Retries int
	// RetriesToQueue counts delayed retries returned to the queue at once
	// instead: their message does not name this queue in
	// internal.request_queue_name, so upstream's retry mover would send them
	// elsewhere (to its first queue) or, not being envelopes, drop them.
	RetriesToQueue int
	// RetriesLeft counts delay-set entries not in sluice's format, left.
	RetriesLeft int
	// DeadLettered and Redeliveries are left in place (upstream has neither);
	// they stay for a later cut-over back to sluice.
	DeadLettered, Redeliveries int64
}

// ToUpstream moves queue's sluice-only state into upstream's shapes:
// leased requests back into the queue with their deadline score, delayed
// retries into upstream's retry set (member: the message; score: due time in
// Unix seconds). It refuses, before moving anything, while leases are still
// being renewed, unless Force is set.
func (m *Migrator) ToUpstream(ctx context.Context, queue string) (RollbackReport, error) {
	rep := RollbackReport{Queue: queue}
	k := m.names.Queue(queue)
	if err := m.CheckLeases(ctx, queue); err != nil {
		var live *LiveLeasesError
		if !errors.As(err, &live) || !m.Force {
			return rep, err
		}
		rep.LiveLeases = int(live.Count)
	}
	n, err := m.returnLeases(ctx, k)
	rep.Leased = n
	if err != nil {
		return rep, err
	}
	retrySet := m.UpstreamRetrySet()
	// Upstream's retry mover sends an entry to the queue its
	// internal.request_queue_name names (else to its first queue; a member
	// that is no envelope it drops).
	self := newQueueRoutes()
	self.add("", queue)
	moved, left, err := moveMembers(ctx, m.c, k.Delayed, "+inf", m.DryRun, func(z redis.Z) (moveItem, bool) {
		rec, _ := z.Member.(string)
		score, msg, ok := strings.Cut(rec, "|")
		if !ok {
			return moveItem{}, false
		}
		if _, named := self.queueOf([]byte(msg)); named {
			due := strconv.FormatFloat(z.Score/1000, 'f', -1, 64)
			return moveItem{queue: "retry", dst: retrySet, score: due, member: msg}, true
		}
		return moveItem{queue: "queue", dst: queue, score: score, member: msg}, true
	})
	rep.Retries, rep.RetriesToQueue, rep.RetriesLeft = moved["retry"], moved["queue"], left
	if err != nil {
		return rep, err
	}
	if rep.DeadLettered, err = m.c.LLen(ctx, k.Dead).Result(); err != nil {
		return rep, fmt.Errorf("count dead letters of %s: %w", queue, err)
	}
	if rep.Redeliveries, err = m.c.HLen(ctx, k.Redeliveries).Result(); err != nil {
		return rep, fmt.Errorf("count redeliveries of %s: %w", queue, err)
	}
	return rep, nil
}

// returnLeases returns every lease of k to the queue at its original score:
// expired ones as the reclaimer would (the delivery counts), and with Force
// the live ones as a hand-back.
func (m *Migrator) returnLeases(ctx context.Context, k keys.Queue) (int, error) {
	release := []string{k.Leases, k.Leased, k.Name, k.Redeliveries, k.Stats}
	if m.DryRun {
		n, err := m.c.ZCard(ctx, k.Leases).Result()
		if err != nil {
			return 0, fmt.Errorf("count leases of %s: %w", k.Name, err)
		}
		return int(n), nil
	}
	const limit = 500
	total := 0
	for {
		n, err := keys.Release.Run(ctx, m.c, release, "reclaim", limit).Int()
		total += n
		if err != nil {
			return total, fmt.Errorf("return expired leases of %s: %w", k.Name, err)
		}
		if n < limit {
			break
		}
	}
	if !m.Force {
		return total, nil
	}
	for {
		toks, err := m.c.ZRange(ctx, k.Leases, 0, limit-1).Result()
		if err != nil {
			return total, fmt.Errorf("read leases of %s: %w", k.Name, err)
		}
		if len(toks) == 0 {
			return total, nil
		}
		args := make([]any, 0, len(toks)+1)
		args = append(args, "release")
		for _, tok := range toks {
			args = append(args, tok)
		}
		n, err := keys.Release.Run(ctx, m.c, release, args...).Int()
		total += n
		if err != nil {
			return total, fmt.Errorf("return live leases of %s: %w", k.Name, err)
		}
	}
}

// FromUpstream moves the entries of upstream's retry set that belong to
// queues (by internal.request_queue_name, else internal.queue_id) into each
// queue's delay set, keeping their due time, so that they return to their
// queue with their deadline score when due. Entries of other queues stay. It
// returns the count moved per queue and the count left. A running sluice
// does the same for due entries on its own; this is the explicit, one-time
// form.
func (m *Migrator) FromUpstream(ctx context.Context, queues []transport.Queue) (map[string]int, int, error) {
	routes := newQueueRoutes()
	for _, q := range queues {
		routes.add(q.ID, q.Name)
	}
	return moveMembers(ctx, m.c, m.UpstreamRetrySet(), "+inf", m.DryRun, func(z redis.Z) (moveItem, bool) {
		msg, _ := z.Member.(string)
		q, ok := routes.queueOf([]byte(msg))
		if !ok {
			return moveItem{}, false
		}
		due := strconv.FormatInt(int64(math.Round(z.Score*1000)), 10)
		return moveItem{queue: q, dst: m.names.Queue(q).Delayed, score: due, member: deadlineScore([]byte(msg)) + "|" + msg}, true
	})
}
