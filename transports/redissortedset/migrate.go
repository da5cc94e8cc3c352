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

// SluiceOwner reports whether a claim's owner token is a sluice replica's
// ("<replica>:<claim call>:<i>"); upstream's are 16 hex digits.
func SluiceOwner(token string) bool { return strings.Contains(token, ":") }

// liveClaim is a claim whose lease has not expired.
type liveClaim struct {
	claim, owner string
	until        time.Time
}

// liveClaims lists the claims of k whose lease expires after now (Redis'
// clock), with their owners.
func (m *Migrator) liveClaims(ctx context.Context, k keys.Queue) ([]liveClaim, error) {
	now, err := redisNow(ctx, m.c, k)
	if err != nil {
		return nil, err
	}
	from := "(" + strconv.FormatFloat(float64(now.UnixMilli())/1000, 'f', -1, 64)
	zs, err := m.c.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: k.ClaimsIdx, ByScore: true, Start: from, Stop: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("read claims of %s: %w", k.Name, err)
	}
	out := make([]liveClaim, 0, len(zs))
	for i := 0; i < len(zs); i += 1000 {
		page := zs[i:min(i+1000, len(zs))]
		cks := make([]string, len(page))
		for j, z := range page {
			cks[j], _ = z.Member.(string)
		}
		owners, err := m.c.HMGet(ctx, k.Owners, cks...).Result()
		if err != nil {
			return nil, fmt.Errorf("read claim owners of %s: %w", k.Name, err)
		}
		for j, z := range page {
			o, _ := owners[j].(string)
			out = append(out, liveClaim{claim: cks[j], owner: o, until: time.UnixMilli(int64(z.Score * 1000))})
		}
	}
	// The lease layout of earlier sluice versions.
	legacy, err := m.c.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: k.Leases, ByScore: true,
		Start: "(" + strconv.FormatInt(now.UnixMilli(), 10), Stop: "+inf"}).Result()
	if err != nil {
		return nil, fmt.Errorf("read leases of %s: %w", k.Name, err)
	}
	for _, z := range legacy {
		tok, _ := z.Member.(string)
		out = append(out, liveClaim{owner: tok, until: time.UnixMilli(int64(z.Score))})
	}
	return out, nil
}

// CheckLeases returns a *LiveLeasesError when queue has claims of sluice
// replicas whose lease (by Redis' clock) expires in the future, nil when
// none. Live claims of upstream replicas do not count: upstream answers
// them.
func (m *Migrator) CheckLeases(ctx context.Context, queue string) error {
	live, err := m.liveClaims(ctx, m.names.Queue(queue))
	if err != nil {
		return err
	}
	e := &LiveLeasesError{Queue: queue}
	for _, c := range live {
		if SluiceOwner(c.owner) {
			e.Count++
			if c.until.After(e.Until) {
				e.Until = c.until
			}
		}
	}
	if e.Count == 0 {
		return nil
	}
	return e
}

// ClaimsReport is what ReturnClaims found in a queue's claims.
type ClaimsReport struct {
	// Returned counts expired claims (of any replica, sluice or upstream,
	// that died or was stopped) returned to the queue with their stored
	// member, and the expired leases of earlier sluice versions.
	Returned int
	// LiveSluice and LiveUpstream count claims still being renewed by
	// sluice and by upstream replicas, left alone.
	LiveSluice, LiveUpstream int
}

// ReturnClaims returns the expired claims of queue to it, as every
// replica's reclaimer does (so after a cut-over in either direction nothing
// waits for a lease to lapse and a replica to notice), and counts the live
// ones by owner. With DryRun it only counts.
func (m *Migrator) ReturnClaims(ctx context.Context, queue string) (ClaimsReport, error) {
	var rep ClaimsReport
	k := m.names.Queue(queue)
	live, err := m.liveClaims(ctx, k)
	if err != nil {
		return rep, err
	}
	for _, c := range live {
		if SluiceOwner(c.owner) {
			rep.LiveSluice++
		} else {
			rep.LiveUpstream++
		}
	}
	if m.DryRun {
		total, err := m.c.ZCard(ctx, k.ClaimsIdx).Result()
		if err != nil {
			return rep, fmt.Errorf("count claims of %s: %w", queue, err)
		}
		legacy, err := m.c.ZCard(ctx, k.Leases).Result()
		if err != nil {
			return rep, fmt.Errorf("count leases of %s: %w", queue, err)
		}
		rep.Returned = int(total+legacy) - len(live)
		return rep, nil
	}
	now, err := redisNow(ctx, m.c, k)
	if err != nil {
		return rep, err
	}
	n, err := ReclaimExpired(ctx, m.c, k, now)
	rep.Returned += n
	if err != nil {
		return rep, err
	}
	n, err = reclaimLegacy(ctx, m.c, k)
	rep.Returned += n
	return rep, err
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
	// UpstreamClaims counts live claims of upstream replicas, left to them.
	UpstreamClaims int
}

// countUpstreamClaims counts the live claims of upstream replicas on k.
func (m *Migrator) countUpstreamClaims(ctx context.Context, k keys.Queue) (int, error) {
	if m.DryRun {
		return 0, nil
	}
	live, err := m.liveClaims(ctx, k)
	n := 0
	for _, c := range live {
		if !SluiceOwner(c.owner) {
			n++
		}
	}
	return n, err
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
	if rep.UpstreamClaims, err = m.countUpstreamClaims(ctx, k); err != nil {
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

// returnLeases returns the expired claims of k (of any owner: upstream
// reclaims them too, this only does it at once) and the leases of earlier
// sluice versions to the queue, the stored member scored by QueueScore,
// and with Force the live claims of sluice replicas as a hand-back (their
// results will be discarded as late). Live claims of upstream replicas are
// left to them.
func (m *Migrator) returnLeases(ctx context.Context, k keys.Queue) (int, error) {
	if m.DryRun {
		rep, err := m.ReturnClaims(ctx, k.Name)
		n := rep.Returned
		if m.Force {
			n += rep.LiveSluice
		}
		return n, err
	}
	rep, err := m.ReturnClaims(ctx, k.Name)
	total := rep.Returned
	if err != nil || !m.Force {
		return total, err
	}
	live, err := m.liveClaims(ctx, k)
	if err != nil {
		return total, err
	}
	var args []any
	for _, c := range live {
		if SluiceOwner(c.owner) && c.claim != "" {
			member, err := m.c.HGet(ctx, k.Claimed, c.claim).Result()
			if err != nil {
				continue // settled meanwhile
			}
			args = append(args, c.owner, c.claim, QueueScore([]byte(member)))
		}
	}
	if len(args) > 0 {
		n, err := keys.Release.Run(ctx, m.c, []string{k.Claimed, k.Owners, k.ClaimsIdx, k.Name}, args...).Int()
		total += n
		if err != nil {
			return total, fmt.Errorf("return live claims of %s: %w", k.Name, err)
		}
	}
	n, err := keys.LegacyRelease.Run(ctx, m.c, []string{k.Leases, k.Leased, k.Name, k.Redeliveries, k.Stats}, 1<<30, "all").Int()
	total += n
	if err != nil {
		return total, fmt.Errorf("return live leases of %s: %w", k.Name, err)
	}
	return total, nil
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
		return moveItem{queue: q, dst: m.names.Queue(q).Delayed, score: due, member: QueueScore([]byte(msg)) + "|" + msg}, true
	})
}
