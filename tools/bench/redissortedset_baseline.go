package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The redis-sortedset scenario's baseline: the fastest plain loop we could
// write doing the same crash-safe work as sluice, without any framework.
//
// baseWorkers goroutines each loop: one Lua call moves up to baseBatch
// members from the queue into a lease set (token → expiry, Redis clock)
// and a lease hash (token → member); each member is decoded and POSTed to
// the gateway in turn; then one Lua call writes the batch's results and
// removes its leases, each item fenced by its lease token (a lease that was
// lost writes nothing). Per message that is 1/baseBatch of two Redis round
// trips and one HTTP call; there is no credit accounting, gate, cancel
// check, retry, heartbeat or metrics.
//
// 256 goroutines × 32 is the shape the issue measured at ~30,000 msg/s on
// a quiet machine. On the shared 2-core bench machine, interleaved runs of
// 64×32, 128×32, 256×16, 256×32 and 512×32 were within the noise of each
// other (load average 15-25 from other work), so none was reliably
// faster; benchBaselineRedisQueue takes the shape as parameters to re-check.
const (
	baseWorkers = 256
	baseBatch   = 32
	baseLeaseMS = 15000
)

var (
	// KEYS: queue, leases, leased; ARGV: n, token prefix.
	// returns: {token, member, ...}
	baseClaim = redis.NewScript(`
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + ` + strconv.Itoa(baseLeaseMS) + `
local p = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[1]))
local out, h, z = {}, {}, {}
for i = 1, #p, 2 do
  local tok = ARGV[2] .. i
  h[#h + 1] = tok; h[#h + 1] = p[i]
  z[#z + 1] = exp; z[#z + 1] = tok
  out[#out + 1] = tok; out[#out + 1] = p[i]
end
if #p > 0 then
  redis.call('HSET', KEYS[3], unpack(h))
  redis.call('ZADD', KEYS[2], unpack(z))
end
return out
`)
	// KEYS: leases, leased, results; ARGV: token, result, ...
	// returns: how many results were written (leases still held).
	baseSettle = redis.NewScript(`
local res = {}
for i = 1, #ARGV, 2 do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[2], ARGV[i])
    res[#res + 1] = ARGV[i + 1]
  end
end
if #res > 0 then redis.call('LPUSH', KEYS[3], unpack(res)) end
return #res
`)
)

// benchBaselineRedis drains the bench queue with the plain loop until it
// is empty; the caller times it (timeRedisSide) as it times sluice.
func benchBaselineRedis(ctx context.Context, c redis.UniversalClient, gw string) error {
	return benchBaselineRedisQueue(ctx, c, gw, rss.RequestQueueName("bench"), rss.ResultQueueName("bench", ""), baseWorkers, baseBatch)
}

// benchBaselineRedisQueue is the loop on request queue q and result list
// results, which must share a hash slot on a cluster (the loop's lease keys
// are q's companions: q+":base-leases" is in q's slot when q has a hash tag),
// with workers goroutines claiming up to batch members at once. A call that
// fails (no answer, or a request it cannot read) is written as an error
// result, as sluice writes one, so both sides' failures are counted the same
// way by the results they leave; only Redis failing stops the loop.
func benchBaselineRedisQueue(ctx context.Context, c redis.UniversalClient, gw, q, results string, workers, batch int) error {
	return baselineLoop(ctx, c, gw, q, workers, batch, func(ctx context.Context, client *http.Client, url, token string, member []byte) (string, []byte) {
		return results, baselineCall(ctx, client, url, token, member)
	})
}

// memberCall answers one claimed member: the result list its result goes
// to, and the result.
type memberCall func(ctx context.Context, client *http.Client, url, token string, member []byte) (list string, result []byte)

// baselineLoop is the plain loop on request queue q: workers goroutines
// claim up to batch members at once, answer each with call, and settle
// each batch with one fenced call per result list its members name (one,
// unless the members route their results apart).
func baselineLoop(ctx context.Context, c redis.UniversalClient, gw, q string, workers, batch int, call memberCall) error {
	ks := []string{q, q + ":base-leases", q + ":base-leased"}
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	if err := baseClaim.Load(ctx, c).Err(); err != nil {
		return err
	}
	if err := baseSettle.Load(ctx, c).Err(); err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		seq      atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		cancel()
	}
	url := gw + "/v1/completions"
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lists []string // the result lists of one batch, and their settle arguments
			var args [][]any
			for rctx.Err() == nil {
				prefix := "base:" + strconv.FormatInt(seq.Add(1), 36) + ":"
				got, err := baseClaim.EvalSha(rctx, c, ks, batch, prefix).StringSlice()
				if err != nil {
					fail(fmt.Errorf("claim: %w", err))
					return
				}
				if len(got) == 0 {
					return // the queue was filled beforehand: empty means drained
				}
				lists = lists[:0]
				for i := range args {
					args[i] = args[i][:0]
				}
				for i := 0; i+1 < len(got); i += 2 {
					list, res := call(rctx, client, url, got[i], []byte(got[i+1]))
					j := slices.Index(lists, list)
					if j < 0 {
						j = len(lists)
						lists = append(lists, list)
						if j == len(args) {
							args = append(args, make([]any, 0, 2*batch))
						}
					}
					args[j] = append(args[j], got[i], res)
				}
				for j, list := range lists {
					if _, err := baseSettle.EvalSha(rctx, c, []string{ks[1], ks[2], list}, args[j]...).Int64(); err != nil {
						fail(fmt.Errorf("settle: %w", err))
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil && !errors.Is(firstErr, context.Canceled) {
		return firstErr
	}
	return nil
}

// baselineCall decodes one queued request, POSTs its payload and returns its
// result: the answer, or an error result when the request cannot be read
// (under its lease token, having no id) or the call got no answer.
func baselineCall(ctx context.Context, client *http.Client, url, token string, member []byte) []byte {
	req, err := wire.Decode(member)
	if err != nil {
		return wire.ErrorResult(&wire.Request{ID: token}, wire.CodeInvalidRequest, err.Error()).Marshal()
	}
	return baselinePost(ctx, client, url, req)
}

// baselinePost POSTs a decoded request's payload and returns its result.
func baselinePost(ctx context.Context, client *http.Client, url string, req *wire.Request) []byte {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(req.Payload))
	if err != nil {
		return wire.ErrorResult(req, wire.CodeInferenceError, err.Error()).Marshal()
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hr)
	if err != nil {
		return wire.ErrorResult(req, wire.CodeInferenceError, err.Error()).Marshal()
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return wire.ErrorResult(req, wire.CodeInferenceError, err.Error()).Marshal()
	}
	res := wire.Result{ID: req.ID, StatusCode: resp.StatusCode, Payload: string(body), Metadata: req.Metadata}
	return res.Marshal()
}
