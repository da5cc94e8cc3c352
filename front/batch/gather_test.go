package batch

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/submit"
)

// chanReader hands out what is sent on c, a slice at a time.
type chanReader struct {
	submit.Reader
	c chan []submit.Result
}

func (r chanReader) Next(ctx context.Context) ([]submit.Result, error) {
	select {
	case rs := <-r.c:
		return rs, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// The job's last step ends once every line left has a result, not at the
// end of the window; a step before it still waits out the window (group
// commit).
func TestGatherLastStepEndsEarly(t *testing.T) {
	const window = 300 * time.Millisecond
	s := &Service{cfg: Config{ChunkSize: 100, RecordWait: window}}
	r := chanReader{c: make(chan []submit.Result, 4)}
	ctx := context.Background()
	results := func(n int) []submit.Result { return make([]submit.Result, n) }

	r.c <- results(3)
	go func() { time.Sleep(20 * time.Millisecond); r.c <- results(4) }()
	start := time.Now()
	rs, err := s.gather(ctx, r, 7)
	if took := time.Since(start); err != nil || len(rs) != 7 || took >= window/2 {
		t.Errorf("last step of 7: %d results, error %v, after %v (window %v)", len(rs), err, took, window)
	}

	r.c <- results(3)
	r.c <- results(4)
	start = time.Now()
	rs, err = s.gather(ctx, r, 500)
	if took := time.Since(start); err != nil || len(rs) != 7 || took < window {
		t.Errorf("a step with 500 left: %d results, error %v, after %v (window %v)", len(rs), err, took, window)
	}

	// The last step with lines that never come waits the window, no more.
	r.c <- results(3)
	start = time.Now()
	rs, _ = s.gather(ctx, r, 7)
	if took := time.Since(start); len(rs) != 3 || took < window || took > window+window/2 {
		t.Errorf("last step, 4 missing: %d results after %v (window %v)", len(rs), took, window)
	}
}
