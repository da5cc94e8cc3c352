package pipeline

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TestWorkers checks the handler's goroutines: messages one after another
// share one worker; messages at once each get one (none waits for another's
// handler); errors come back to their own caller; closing stops them.
func TestWorkers(t *testing.T) {
	base := runtime.NumGoroutine()
	work, cancel := context.WithCancel(context.Background())
	defer cancel()
	errOdd := errors.New("odd")
	release := make(chan struct{})
	var hold sync.WaitGroup
	w := newWorkers(work, func(m *message.Message) error {
		if m.UUID == "hold" {
			hold.Done()
			<-release
		}
		if len(m.Payload)%2 == 1 {
			return errOdd
		}
		return nil
	})
	for i := range 100 {
		err := w.run(message.NewMessage("seq", make([]byte, i)))
		if (i%2 == 1) != errors.Is(err, errOdd) {
			t.Fatalf("message %d: error %v", i, err)
		}
	}
	if n := w.started.Load(); n != 1 {
		t.Fatalf("100 messages one after another started %d workers, want 1", n)
	}
	// Ten at once, each held in its handler: ten workers, and an eleventh
	// message is handled while they are held.
	hold.Add(10)
	var running sync.WaitGroup
	for range 10 {
		running.Add(1)
		go func() { defer running.Done(); _ = w.run(message.NewMessage("hold", nil)) }()
	}
	hold.Wait()
	if err := w.run(message.NewMessage("free", nil)); err != nil {
		t.Fatal(err)
	}
	if n := w.started.Load(); n != 11 {
		t.Fatalf("%d workers started, want 11 (10 held at once, the first one among them, and one for the free message)", n)
	}
	close(release)
	running.Wait()
	w.close()
	w.close() // twice is harmless
	if err := w.run(message.NewMessage("late", []byte{1})); !errors.Is(err, errOdd) {
		t.Fatalf("a message after close: %v, want its handler's error", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after close, %d before: the workers did not stop", runtime.NumGoroutine(), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
