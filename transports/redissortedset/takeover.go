package redissortedset

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// Taking over from upstream llm-d-async on the same Redis. Its waiting
// requests need nothing (sluice reads the same sorted sets), its requests in
// flight lived only in its memory, and two pieces of its state are honoured
// here:
//
//   - its retry set (DefaultUpstreamRetryQueueName, or the flat
//     retry_queue_name): one sorted set shared by all its queues, member =
//     the envelope, score = due time in Unix seconds. Every replica moves the
//     due entries that belong to a queue it serves back into that queue with
//     the deadline as score, as upstream's own retry mover does, once at
//     start and every poll interval (adoptLoop);
//   - its cancellation keys request-active:<id> / request-cancel:<id>: a
//     request whose cancel key holds its token is answered CANCELLED
//     (Cancelled), and both keys are deleted, if they still hold the token,
//     by the script that writes the request's result (keys.Settle).

// DefaultUpstreamRetryQueueName is the retry set of upstream's sorted-set
// transport when its config names none; sluice adopts it when
// retry_queue_name is not a flat name.
const DefaultUpstreamRetryQueueName = "retry-sortedset"

// UpstreamRetrySet is the name of upstream's retry set that the transport
// adopts: the flat retry_queue_name as configured, else upstream's default.
// Call it after SetDefaults.
func (o Options) UpstreamRetrySet() string {
	if o.UpstreamRetryQueueName != "" {
		return o.UpstreamRetryQueueName
	}
	return DefaultUpstreamRetryQueueName
}

// Metadata keys holding a delivery's request id and upstream request token,
// for the result's settle to clean upstream's cancellation keys.
const (
	metaRequestID    = "sluice_request_id"
	metaRequestToken = "sluice_request_token"
)

// upstreamKeysOf returns the id and request token of an envelope that
// carries one (upstream's producer writes them); "" otherwise. It reads only
// those two members (wire.RequestToken), not the whole request: the core
// decodes the message once, later.
func upstreamKeysOf(msg []byte) (id, token string) {
	return wire.RequestToken(msg)
}

// envelopeRoute is what routes an entry of upstream's retry set: the
// envelope's internal.request_queue_name and internal.queue_id. Values that
// are not strings read as "".
type envelopeRoute struct {
	Internal struct {
		QueueID          json.RawMessage `json:"queue_id"`
		RequestQueueName json.RawMessage `json:"request_queue_name"`
	} `json:"internal"`
}

// jsonString returns raw as a string if it is a JSON string, else "".
func jsonString(raw json.RawMessage) string {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' && plainJSON(raw[1:len(raw)-1]) {
		return string(raw[1 : len(raw)-1]) // no escapes: the bytes are the string
	}
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// plainJSON reports whether b can stand between quotes in JSON as it is
// and reads back as itself: printable ASCII without quote or backslash
// (and without <, >, & which encoding/json escapes).
func plainJSON[T ~string | ~[]byte](b T) bool {
	for i := 0; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// quoteJSON is json.Marshal of a string, without its allocations for the
// common plain case.
func quoteJSON(s string) []byte {
	if plainJSON(s) {
		b := make([]byte, 0, len(s)+2)
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	b, _ := json.Marshal(s)
	return b
}

// queueRoutes maps the queues a deployment serves by name and by id.
type queueRoutes struct {
	byName, byID map[string]string
}

func newQueueRoutes() queueRoutes {
	return queueRoutes{byName: map[string]string{}, byID: map[string]string{}}
}

func (r queueRoutes) add(id, name string) {
	r.byName[name] = name
	if id != "" {
		r.byID[id] = name
	}
}

// queueOf returns the served queue an upstream envelope belongs to, as
// upstream's retry mover routes it: by internal.request_queue_name (which
// upstream always stamps before writing a retry); an envelope naming none
// goes by internal.queue_id. An envelope naming a queue this deployment does
// not serve, or nothing at all, is left to whoever serves it.
func (r queueRoutes) queueOf(msg []byte) (string, bool) {
	var e envelopeRoute
	if json.Unmarshal(msg, &e) != nil {
		return "", false
	}
	if name := jsonString(e.Internal.RequestQueueName); name != "" {
		q, ok := r.byName[name]
		return q, ok
	}
	q, ok := r.byID[jsonString(e.Internal.QueueID)]
	return q, ok
}

// moveItem is where a member of a sorted set goes: destination key, score
// there, member there ("" keeps it), and the request queue it counts for.
type moveItem struct {
	queue, dst, score, member string
}

// movePage is how many members one Move call examines.
const movePage = 256

// moveMembers moves the members of sorted set src scored up to upTo that
// plan places, each atomically and only if still there (keys.Move), and
// counts them per queue; members plan leaves are counted as skipped. With
// dryRun nothing is written.
func moveMembers(ctx context.Context, c redis.Cmdable, src, upTo string, dryRun bool, plan func(redis.Z) (moveItem, bool)) (map[string]int, int, error) {
	moved := map[string]int{}
	skipped, offset := 0, 0
	for {
		zs, err := c.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: src, ByScore: true, Start: "-inf", Stop: upTo,
			Offset: int64(offset), Count: movePage}).Result()
		if err != nil {
			return moved, skipped, fmt.Errorf("read %s: %w", src, err)
		}
		args := make([]any, 0, 4*len(zs))
		items := make([]moveItem, 0, len(zs))
		for _, z := range zs {
			it, ok := plan(z)
			switch {
			case !ok:
				skipped++
				offset++ // it stays: the next page starts after it
			case dryRun:
				moved[it.queue]++
				offset++
			default:
				args = append(args, z.Member, it.dst, it.score, it.member)
				items = append(items, it)
			}
		}
		if len(items) > 0 {
			st, err := keys.Move.Run(ctx, c, []string{src}, args...).Int64Slice()
			if err != nil {
				return moved, skipped, fmt.Errorf("move from %s: %w", src, err)
			}
			for i, it := range items {
				if i < len(st) && st[i] == 1 {
					moved[it.queue]++
				}
			}
		}
		if len(zs) < movePage {
			return moved, skipped, nil
		}
	}
}

// adoptRoutes returns the queues this replica serves.
func (t *Transport) adoptRoutes() queueRoutes {
	r := newQueueRoutes()
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, qs := range t.queues {
		if qs.served {
			r.add(qs.id, name)
		}
	}
	return r
}

// adoptUpstreamRetries moves the due entries of upstream's retry set that
// belong to a queue this replica serves back into that queue, scored by
// their deadline; it returns how many it moved.
func (t *Transport) adoptUpstreamRetries(ctx context.Context) (int, error) {
	routes := t.adoptRoutes()
	if len(routes.byName) == 0 {
		return 0, nil
	}
	src := t.opts.UpstreamRetrySet()
	// Upstream scores a retry now+backoff by its own clock, in seconds.
	upTo := strconv.FormatFloat(float64(time.Now().UnixMilli())/1000, 'f', -1, 64)
	moved, skipped, err := moveMembers(ctx, t.client, src, upTo, false, func(z redis.Z) (moveItem, bool) {
		m, _ := z.Member.(string)
		q, ok := routes.queueOf([]byte(m))
		if !ok {
			return moveItem{}, false
		}
		return moveItem{queue: q, dst: q, score: QueueScore([]byte(m))}, true
	})
	n := 0
	for q, c := range moved {
		n += c
		t.log.Info("moved due retries of upstream's retry set back into their queue", "retry_set", src, "queue", q, "count", c)
		t.notify(ctx, t.queue(q))
	}
	t.adopted.Add(int64(n))
	if prev := t.adoptSkipped.Swap(int64(skipped)); prev != int64(skipped) && skipped > 0 {
		t.log.Info("due entries of upstream's retry set belong to no queue this replica serves; left for whoever serves them",
			"retry_set", src, "count", skipped)
	}
	if err != nil {
		return n, fmt.Errorf("adopt upstream retries: %w", err)
	}
	return n, nil
}

// adoptLoop adopts upstream's due retries at once and every poll interval,
// as upstream's retry mover does. One ranged read of a (normally empty)
// sorted set per interval and replica is all it costs once upstream is gone.
func (t *Transport) adoptLoop() {
	defer t.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-t.closing:
		case <-ctx.Done():
		}
		cancel()
	}()
	tick := time.NewTicker(ms(t.opts.PollIntervalMS))
	defer tick.Stop()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := t.adoptUpstreamRetries(cctx); err != nil && ctx.Err() == nil {
			t.log.Warn("adopting upstream's retries failed; trying again", "err", err)
		}
		ccancel()
		select {
		case <-t.closing:
			return
		case <-tick.C:
		}
	}
}
