package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/poolsim"
)

// The purpose demo, shortened: every batch request is answered exactly
// once (evictions included), the floor and the burst figures are
// measured, the batch goes through pool-headroom, and the live lines come
// once a second.
func TestPoolDemoAccountsForEveryRequest(t *testing.T) {
	var progress bytes.Buffer
	sum, err := RunPool(context.Background(), PoolOptions{
		Batch: 24, BatchOutput: 32, Floor: 2 * time.Second, Progress: &progress,
		Waves: poolsim.Waves{Warmup: time.Second, Burst: 2 * time.Second, Idle: 2 * time.Second, Cycles: 1, BurstRate: 10, IdleRate: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Missing != 0 || sum.Duplicates != 0 || sum.BatchOK != sum.Batch || sum.BatchFailed != 0 {
		t.Fatalf("batch not answered exactly once, ok: %+v", sum)
	}
	if sum.FloorP99Ms <= 0 || sum.BurstP99Ms <= 0 || sum.P99Ratio <= 0 || sum.InteractiveErrors != 0 {
		t.Fatalf("interactive figures missing or failed requests: %+v", sum)
	}
	if sum.BatchTokens != 24*32 {
		t.Errorf("batch tokens %d, want %d", sum.BatchTokens, 24*32)
	}
	if sum.ResumedTokens > 0 && sum.PrefixHitTokens == 0 {
		t.Errorf("%d tokens resumed but the pods' prefix caches served none: the continuations missed their blocks", sum.ResumedTokens)
	}
	if sum.Gate != "pool-headroom" {
		t.Errorf("gate %q", sum.Gate)
	}
	if n := strings.Count(progress.String(), "interactive TTFT p99"); n < 3 {
		t.Errorf("%d live lines, want at least one a second:\n%s", n, progress.String())
	}
}
