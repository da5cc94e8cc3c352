package pipeline

import (
	"testing"
	"time"
)

func TestRunningWaitZero(t *testing.T) {
	var r running
	if !r.waitZero(time.Millisecond) {
		t.Fatal("nothing running, yet waitZero timed out")
	}
	r.add(1)
	if r.waitZero(20 * time.Millisecond) {
		t.Fatal("waitZero returned with a handler running")
	}
	done := make(chan bool)
	go func() { done <- r.waitZero(5 * time.Second) }()
	time.Sleep(10 * time.Millisecond)
	r.add(1) // a late handler while someone waits: allowed
	r.add(-1)
	r.add(-1)
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("waitZero timed out after the count reached zero")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitZero did not return")
	}
}
