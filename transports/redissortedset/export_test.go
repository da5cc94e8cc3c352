package redissortedset

import (
	"context"
	"time"

	"github.com/sluice-io/sluice/core/transport"
)

// SetIdleWait sets the next idle wait of a source made by Transport.Source,
// as if its claim loop had found the queue empty for a long time.
func SetIdleWait(src transport.Source, d time.Duration) { src.(*source).idle = d }

// WakePending reports whether a source's next Wait would end at once on a
// wake-up already heard.
func WakePending(src transport.Source) bool { return len(src.(*source).wake) > 0 }

// Fault points of the cross-slot settle (see xslot.go).
const (
	FaultBeforePrepare    = faultBeforePrepare
	FaultBeforePush       = faultBeforePush
	FaultBeforeCommit     = faultBeforeCommit
	FaultBeforePayloadDel = faultBeforePayloadDel
)

// SetFaultHook sets the hook called before each step of tp's cross-slot
// settles; an error it returns fails that step.
func SetFaultHook(tp *Transport, fn func(point int) error) { tp.faultHook = fn }

// Heartbeat runs one round of t's heartbeat on queue (the loop's step).
func Heartbeat(t *Transport, queue string) { t.heartbeat(context.Background(), t.queue(queue)) }

// Reclaim runs one round of t's reclaimer on queue (the loop's step).
func Reclaim(t *Transport, queue string) { t.reclaim(context.Background(), t.queue(queue)) }

// Crash ends t as kill -9 would: its loops stop and its client closes, and
// nothing is handed back (a later Close does nothing).
func Crash(t *Transport) {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		close(t.closing)
		t.wg.Wait()
		_ = t.client.Close()
	})
}

// SetSettleHook makes f run after each script call of t's settles; an error
// it returns fails the settle there (a crash between two calls). Set it
// before a settle, never during one.
func SetSettleHook(t *Transport, f func() error) { t.settleHook = f }
