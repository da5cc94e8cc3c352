package redissortedset

// The cross-slot settle.
//
// On a Redis Cluster a script may touch only keys of one hash slot. Where a
// request queue and its result list share a slot (one hash tag on both:
// llm-d-async:requests:{pool}, llm-d-async:results:{pool}:<tenant>), a
// result is written by keys.Settle: fenced by the claim's owner token, it
// pushes the result and drops the claim in one atomic step. Upstream's own
// names (llm-d-async:requests:<pool>, llm-d-async:results:<pool>:<tenant>,
// no hash tag) put the list in another slot than the claim keys
// ({<queue>}:claimed, ...), so no one script can do both. Upstream (#491)
// then acks in three steps (renew the claim as a fence, push, drop the
// claim) and documents the duplicate a crash between the last two leaves:
// the claim stays, expires, and the request is dispatched again and
// answered a second time. sluice settles such a pair in three steps too,
// arranged so that a crash between any two of them leaves the request
// either still claimed, with no result written, or with its result
// written exactly once and the claim still there to be dropped, and never
// its claim dropped without a result:
//
//  1. PREPARE (keys.SettlePrepare, the claim's slot), fenced by the owner
//     token: the settling record (the result, its list, the list's ttl,
//     the mode, the payload key to delete) is written beside the claim,
//     under the claim id, and the lease is renewed. From here on the claim
//     is never handed back to the queue (Release and Requeue leave a claim
//     with a settling record of its owner alone) and a reclaimer that finds
//     its lease expired finishes the settle instead of re-dispatching the
//     request. A claim lost before this step (the lease expired and another
//     replica reclaimed it) writes nothing: a late result, counted, as on
//     one slot.
//  2. PUSH (keys.PushOnce, the result list's slot): the result is pushed
//     unless the list's pushed set (keys.Pushed: {<list>}:sluice-pushed)
//     holds the marker of this settle, the claim's owner token; the marker
//     is added with the push and kept for the dedupe window (below). A
//     second PUSH of the same settle within the window pushes nothing.
//  3. COMMIT (keys.SettleCommit, the claim's slot): the settling record
//     and, still fenced by the owner token, the claim are dropped (mode b
//     also dead-letters the claimed message, atomically with the drop).
//
// Then, as on one slot in a cluster, the payload key (upstream's
// request-payload:<id>:<token>, another slot) is deleted with a plain DEL;
// it expires on its own if that fails.
//
// A crash (the replica dies, or Redis fails and the write is given up)
// between the steps leaves:
//
//   - before 1: the claim, no record, no result. The lease expires, the
//     reclaimer returns the request to the queue, it is dispatched again
//     and its one result written then. No duplicate, nothing lost.
//   - between 1 and 2: the claim, its record, no result. The owner's
//     heartbeat stops, the lease expires, and the reclaimer (any sluice
//     replica serving the queue) renews the lease and finishes the settle
//     from the record: PUSH (the marker is absent: the result is pushed),
//     then COMMIT. Exactly one result, the one the dead replica computed;
//     the request is not dispatched again.
//   - between 2 and 3: the claim, its record, the result in the list with
//     its marker. The reclaimer finishes as above: PUSH finds the marker
//     and pushes nothing, COMMIT drops the claim. Exactly one result.
//   - between 3 and the payload DEL: the payload key lingers until its own
//     expiry (upstream's producer gives it the request's deadline plus 10
//     minutes). Nothing else.
//
// A replica that is not dead but stalls (or keeps failing) between the
// steps is the same case: Redis failing, it retries for result_retry_ms,
// each retry starting again at step 1 (the record is rewritten, the PUSH
// finds its marker), then gives up and stops renewing the lease; the core's
// nack leaves the claim alone; the reclaimer finishes. If it resumes after
// the reclaimer finished, its PUSH finds the marker, its COMMIT finds the
// claim gone.
//
// The one duplicate this leaves: the marker outlives the push by the
// dedupe window (2 × lease_ms + reclaim_interval_ms + result_retry_ms, and
// at least 2 minutes), enough for the reclaimer of a live replica to
// finish a settle whose owner died. A settle finished later than that
// (every replica serving the queue down for longer than the window between
// the owner's step 2 and its step 3, or a replica stalled that long between
// the steps) pushes the result again. That second copy is the same bytes:
// the same id, the same request_token (an envelope's), the same status and
// payload, because it is the record the first push wrote, not a second
// dispatch. A consumer drops it by id and request_token: upstream's
// durable result consumer does so already (it keys results by
// id + "\x00" + request_token and keeps tombstones 7 days); a plain reader
// drops a result whose (id, request_token) it has seen (id alone for a
// flat request, which has no token).
//
// Mixed fleets: an upstream replica on the same queue reclaims an expired
// claim without reading the settling record, so a sluice replica dying
// between steps 1 and 3 there can have its request dispatched again by
// upstream, which then writes a second result (same id and token, its own
// content, the duplicate upstream documents for its own ack); the record
// left behind is dropped by the next claim of that id or stays as a small
// orphan in {<queue>}:settling. Redis' asynchronous replication can lose
// any step's write at a failover, as on one slot: min_replicas_acked
// waits for replicas after each step.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// crossSlotWarning says that queue's results go to list in another slot.
func crossSlotWarning(n keys.Names, queue, list string) string {
	return fmt.Sprintf("queue %s and its result list %s are in different hash slots: results take the cross-slot settle "+
		"(three steps; a crash between them loses nothing, see docs/redis-sortedset.md); %s", queue, list, n.CrossSlotHint())
}

// minDedupeWindowMS is the least time a cross-slot push's marker is kept.
const minDedupeWindowMS = 2 * 60 * 1000

// dedupeWindowMS is how long a cross-slot push's marker is kept: long
// enough for a live replica's reclaimer to finish a settle whose owner died
// (the lease runs out, a reclaim round comes), with room for the owner's
// own retries.
func (t *Transport) dedupeWindowMS() int {
	return max(2*t.opts.LeaseMS+t.opts.ReclaimIntervalMS+t.opts.ResultRetryMS, minDedupeWindowMS)
}

// settleRecord is a settling record's content after the owner token.
type settleRecord struct {
	leaseMS, windowMS int
	mode              byte
	ttl               int64
	list, payloadKey  string
	result            []byte
}

// encode is the record as SettlePrepare takes it:
// "<lease>|<window>|<mode>|<ttl>|<len list>|<len payload key>|<list><payload key><result>".
func (r settleRecord) encode() string {
	var b strings.Builder
	b.Grow(40 + len(r.list) + len(r.payloadKey) + len(r.result))
	b.WriteString(strconv.Itoa(r.leaseMS))
	b.WriteByte('|')
	b.WriteString(strconv.Itoa(r.windowMS))
	b.WriteByte('|')
	b.WriteByte(r.mode)
	b.WriteByte('|')
	b.WriteString(strconv.FormatInt(r.ttl, 10))
	b.WriteByte('|')
	b.WriteString(strconv.Itoa(len(r.list)))
	b.WriteByte('|')
	b.WriteString(strconv.Itoa(len(r.payloadKey)))
	b.WriteByte('|')
	b.WriteString(r.list)
	b.WriteString(r.payloadKey)
	b.Write(r.result)
	return b.String()
}

// parseStoredRecord parses a stored record, "<owner token>|" + encode().
func parseStoredRecord(s string) (token string, r settleRecord, err error) {
	f := strings.SplitN(s, "|", 8)
	if len(f) != 8 {
		return "", r, fmt.Errorf("settling record: %d fields", len(f))
	}
	token = f[0]
	var ll, pl int
	var errs [5]error
	r.leaseMS, errs[0] = strconv.Atoi(f[1])
	r.windowMS, errs[1] = strconv.Atoi(f[2])
	r.ttl, errs[2] = strconv.ParseInt(f[4], 10, 64)
	ll, errs[3] = strconv.Atoi(f[5])
	pl, errs[4] = strconv.Atoi(f[6])
	if err := errors.Join(errs[:]...); err != nil || len(f[3]) != 1 || ll < 0 || pl < 0 || ll+pl > len(f[7]) {
		return "", r, fmt.Errorf("settling record of %s: malformed", token)
	}
	r.mode = f[3][0]
	rest := f[7]
	r.list, r.payloadKey, r.result = rest[:ll], rest[ll:ll+pl], []byte(rest[ll+pl:])
	return token, r, nil
}

// Fault points of the cross-slot settle, for tests: the hook is called
// with each before the step it names runs, and an error it returns fails
// the batch there as a Redis error would.
const (
	faultBeforePrepare = iota + 1
	faultBeforePush
	faultBeforeCommit
	faultBeforePayloadDel
)

// fault calls the transport's fault hook, if any.
func (t *Transport) fault(point int) error {
	if t.faultHook == nil {
		return nil
	}
	return t.faultHook(point)
}

// flushCross settles batch, whose result list is in another hash slot
// than the claims, in the three steps above. It returns a status per item
// (1 done, 0 late) and whether each item's result is known pushed (for a
// retry after an error, which then needs only the commit).
func (s *settler) flushCross(ctx context.Context, batch []settleItem) (st []int64, pushed []bool, err error) {
	t := s.t
	st = make([]int64, len(batch))
	pushed = make([]bool, len(batch))
	window := t.dedupeWindowMS()
	// Step 1: PREPARE the results not pushed yet.
	var prep []int
	var args []any
	for i, it := range batch {
		pushed[i] = it.pushed
		if it.mode == 'd' || it.pushed {
			continue
		}
		rec := settleRecord{leaseMS: t.opts.LeaseMS, windowMS: window, mode: it.mode, ttl: it.ttl, list: s.list, payloadKey: it.payloadKey, result: it.result}
		prep = append(prep, i)
		args = append(args, it.token, it.claim, rec.encode())
	}
	if err := t.fault(faultBeforePrepare); err != nil {
		return nil, pushed, err
	}
	ready := make([]bool, len(batch)) // prepared now, or pushed before
	for i, it := range batch {
		ready[i] = it.pushed
	}
	if len(prep) > 0 {
		ps, err := t.runScript(ctx, keys.SettlePrepare, []string{s.q.Owners, s.q.ClaimsIdx, s.q.Settling, s.q.Stats}, args...).Int64Slice()
		if err == nil && len(ps) != len(prep) {
			err = fmt.Errorf("settle prepare: %d statuses for %d items", len(ps), len(prep))
		}
		if err != nil {
			return nil, pushed, fmt.Errorf("settle prepare on %s: %w", s.q.Name, err)
		}
		for j, i := range prep {
			ready[i] = ps[j] == 1
		}
	}
	// Step 2: PUSH what was prepared.
	if err := t.fault(faultBeforePush); err != nil {
		return nil, pushed, err
	}
	args = args[:0]
	var push []int
	for _, i := range prep {
		if ready[i] {
			it := batch[i]
			push = append(push, i)
			args = append(args, it.token, it.result, it.ttl, window)
		}
	}
	if len(push) > 0 {
		if err := t.runScript(ctx, keys.PushOnce, []string{s.list, keys.Pushed(s.list)}, args...).Err(); err != nil {
			return nil, pushed, fmt.Errorf("push results to %s: %w", s.list, err)
		}
		for _, i := range push {
			pushed[i] = true
		}
	}
	// Step 3: COMMIT the pushed ones and the dead letters.
	if err := t.fault(faultBeforeCommit); err != nil {
		return nil, pushed, err
	}
	args = args[:0]
	var commit []int
	for i, it := range batch {
		if it.mode == 'd' || ready[i] {
			commit = append(commit, i)
			args = append(args, modeArg(it.mode), it.token, it.claim, it.dead)
		}
	}
	if len(commit) > 0 {
		cs, err := t.runScript(ctx, keys.SettleCommit, []string{s.q.Claimed, s.q.Owners, s.q.ClaimsIdx, s.q.Settling, s.q.Dead, s.q.Stats, s.q.Redeliveries}, args...).Int64Slice()
		if err == nil && len(cs) != len(commit) {
			err = fmt.Errorf("settle commit: %d statuses for %d items", len(cs), len(commit))
		}
		if err != nil {
			return nil, pushed, fmt.Errorf("settle commit on %s: %w", s.q.Name, err)
		}
		for j, i := range commit {
			if batch[i].mode == 'd' {
				st[i] = cs[j]
			} else {
				st[i] = 1 // written; a lost claim here was finished by a reclaimer
			}
		}
	}
	return st, pushed, nil
}

// finishSettles finishes the cross-slot settles the reclaimer handed over
// (pairs of claim id and stored record, see keys.Reclaim): PUSH, then
// COMMIT, then the payload key's DEL, as their dead owner would have. It
// returns how many it finished.
func finishSettles(ctx context.Context, c redis.Cmdable, k keys.Queue, pairs []any, run scriptRunner) (int, error) {
	done := 0
	var errs []error
	for i := 0; i+1 < len(pairs); i += 2 {
		ck, _ := pairs[i].(string)
		stored, _ := pairs[i+1].(string)
		tok, r, err := parseStoredRecord(stored)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := run(ctx, keys.PushOnce, []string{r.list, keys.Pushed(r.list)}, tok, r.result, r.ttl, r.windowMS).Err(); err != nil {
			errs = append(errs, fmt.Errorf("finish a settle: push to %s: %w", r.list, err))
			continue // the lease the reclaim gave it runs out and the next round tries again
		}
		if err := run(ctx, keys.SettleCommit, []string{k.Claimed, k.Owners, k.ClaimsIdx, k.Settling, k.Dead, k.Stats, k.Redeliveries},
			modeArg(r.mode), tok, ck, "").Err(); err != nil {
			errs = append(errs, fmt.Errorf("finish a settle: commit on %s: %w", k.Name, err))
			continue
		}
		if r.payloadKey != "" {
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_ = c.Del(dctx, r.payloadKey).Err()
			cancel()
		}
		done++
	}
	return done, errors.Join(errs...)
}
