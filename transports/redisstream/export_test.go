package redisstream

import (
	"context"
	"time"

	"github.com/sluice-io/sluice/core/transport"
)

// Touch runs one heartbeat of src (the loop's step).
func Touch(src transport.Source) error { return src.(*source).touch(context.Background()) }

// AllowTakeover lets the next Claim of src take over idle entries, as if
// half of claim_idle_ms had passed since its last look.
func AllowTakeover(src transport.Source) { src.(*source).lastClaim = time.Time{} }

// Crash ends t as kill -9 would: its loops stop and its client closes, and
// nothing is handed back.
func Crash(t *Transport) {
	t.mu.Lock()
	t.closed = true
	subs := t.subs
	t.mu.Unlock()
	for _, s := range subs {
		if s.cancel != nil {
			s.cancel()
		}
		s.loops.Wait()
	}
	t.cancel()
	t.bg.Wait()
	_ = t.client.Close()
}
