package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
)

// resultTally counts result messages by what they say, decoded with
// core/wire as a consumer of results would read them. Only the first
// result of a request that answers 200 with no error code is ok: an error
// result, another status, a message that is not a result, and a second
// result for a request already answered are failed. Throughput is ok
// results per second; failed is a figure of its own.
type resultTally struct {
	ok, failed int
	seen       map[string]bool
}

// add counts one result message.
func (t *resultTally) add(b []byte) {
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	r, err := wire.DecodeResult(b)
	if err != nil {
		t.failed++
		return
	}
	if r.StatusCode != http.StatusOK || r.ErrorCode != wire.CodeNone || t.seen[r.ID] {
		t.failed++
		return
	}
	t.seen[r.ID] = true
	t.ok++
}

// addAll counts every message of bs.
func (t *resultTally) addAll(bs [][]byte) {
	for _, b := range bs {
		t.add(b)
	}
}

// total is every result counted.
func (t *resultTally) total() int { return t.ok + t.failed }

// tallyLists reads every result in the Redis lists and counts them.
func tallyLists(ctx context.Context, c redis.UniversalClient, lists ...string) (resultTally, error) {
	var t resultTally
	for _, l := range lists {
		vs, err := c.LRange(ctx, l, 0, -1).Result()
		if err != nil {
			return t, fmt.Errorf("read results %s: %w", l, err)
		}
		for _, v := range vs {
			t.add([]byte(v))
		}
	}
	return t, nil
}

// sample is one side's run: ok and failed results, the time from the
// side's start to its last result (seconds) and to its first (first: the
// side's start-up, which the clock includes on both sides).
type sample struct {
	ok, failed int
	seconds    float64
	first      time.Duration
}

// rate is ok results per second.
func (s sample) rate() float64 { return float64(s.ok) / s.seconds }

// samples collects one side's runs.
type samples []sample

func (ss samples) rates() []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = s.rate()
	}
	return out
}

// firstMs is the median time to the first result, in milliseconds.
func (ss samples) firstMs() float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = float64(s.first) / float64(time.Millisecond)
	}
	return median(out)
}

// pairFigures are the figures of a scenario that measured sluice against
// a baseline run by run (alternate): each side's median rate, the median
// of the runs' ratios, the failed results of each side summed, and each
// side's median time to its first result. Each run's pair goes to standard
// error.
func pairFigures(name string, sl, base samples) figures {
	for i := range min(len(sl), len(base)) {
		fmt.Fprintf(os.Stderr, "%s run %d/%d: throughput=%.0f baseline=%.0f ratio=%.2f first_result_ms=%.0f baseline_first_result_ms=%.0f failed=%d baseline_failed=%d\n",
			name, i+1, len(sl), sl[i].rate(), base[i].rate(), sl[i].rate()/base[i].rate(),
			float64(sl[i].first)/float64(time.Millisecond), float64(base[i].first)/float64(time.Millisecond), sl[i].failed, base[i].failed)
	}
	return figures{"throughput": median(sl.rates()), "baseline": median(base.rates()),
		"ratio": medianRatio(sl.rates(), base.rates()), "failed": sl.failed(), "baseline_failed": base.failed(),
		"first_result_ms": sl.firstMs(), "baseline_first_result_ms": base.firstMs()}
}

// failed is the failed results summed over the runs: a bound of 0 holds
// for every run, not the median one.
func (ss samples) failed() float64 {
	n := 0
	for _, s := range ss {
		n += s.failed
	}
	return float64(n)
}
