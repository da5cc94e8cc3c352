package transport

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/sluice-io/sluice/core/credit"
)

// TestFreeCreditOnce: FreeCredit gives a delivery's credit back before its
// settle, once; the settle then frees nothing more, and a FreeCredit after
// the settle frees nothing either.
func TestFreeCreditOnce(t *testing.T) {
	pool := credit.NewPool(4, credit.Ramp{})
	pool.SetBudget(1)
	src := &modelSource{claimed: map[string]bool{}, wake: make(chan struct{}, 1)}
	inflight := func() int { n, _, _ := pool.Snapshot(); return n }
	if got := pool.TryAcquire(2); got != 2 {
		t.Fatalf("acquired %d", got)
	}
	a, b := message.NewMessage("a", nil), message.NewMessage("b", nil)
	onSettle(a, src, pool, time.Now())
	onSettle(b, src, pool, time.Now())
	if !FreeCredit(a) || inflight() != 1 {
		t.Fatalf("FreeCredit: in flight %d, want 1", inflight())
	}
	if FreeCredit(a) || inflight() != 1 {
		t.Fatalf("second FreeCredit freed again: in flight %d", inflight())
	}
	Ack(a)
	if inflight() != 1 {
		t.Fatalf("the settle after FreeCredit freed again: in flight %d", inflight())
	}
	Ack(b)
	if FreeCredit(b) || inflight() != 0 {
		t.Fatalf("after the settles: in flight %d, want 0", inflight())
	}
	if FreeCredit(message.NewMessage("c", nil)) {
		t.Fatal("a message without a settle hook freed a credit")
	}
}
