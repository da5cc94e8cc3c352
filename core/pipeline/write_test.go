package pipeline

import "testing"

// TestEarlyWritesBound: at most max results are written on freed credits
// at once; the next ones keep their credits until one of those ends.
func TestEarlyWritesBound(t *testing.T) {
	e := earlyWrites{max: 2}
	for i := range 2 {
		if !e.take() {
			t.Fatalf("early write %d of 2 was refused", i+1)
		}
	}
	if e.take() {
		t.Fatal("a third early write was allowed with two under way")
	}
	e.give()
	if !e.take() {
		t.Fatal("an early write was refused after one ended")
	}
	if e.n.Load() != 2 {
		t.Fatalf("%d under way, want 2", e.n.Load())
	}
}
