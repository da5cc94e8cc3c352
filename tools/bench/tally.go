package main

import (
	"context"
	"fmt"
	"net/http"

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

// sample is one side's run: ok and failed results and the time from the
// side's start to its last result.
type sample struct {
	ok, failed int
	seconds    float64
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

// failed is the failed results summed over the runs: a bound of 0 holds
// for every run, not the median one.
func (ss samples) failed() float64 {
	n := 0
	for _, s := range ss {
		n += s.failed
	}
	return float64(n)
}
