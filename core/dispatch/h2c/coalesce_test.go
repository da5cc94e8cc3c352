package h2c

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Writes from many goroutines, each flushing now and then, arrive whole
// and in the order each writer made them; Close sends what is still
// waiting.
func TestCoalescingConnKeepsWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		b, _ := io.ReadAll(s)
		got <- b
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := newCoalescingConn(raw, 0)
	const writers, each = 8, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				rec := fmt.Appendf(nil, "<%d:%d>", w, i)
				if n, err := c.Write(rec); n != len(rec) || err != nil {
					t.Errorf("write: %d %v", n, err)
					return
				}
				if i%3 == 0 {
					if err := c.Flush(); err != nil {
						t.Errorf("flush: %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	b := <-got
	next := make([]int, writers)
	for len(b) > 0 {
		end := bytes.IndexByte(b, '>')
		if b[0] != '<' || end < 0 {
			t.Fatalf("torn record at %q", b[:min(len(b), 20)])
		}
		var w, i int
		if _, err := fmt.Sscanf(string(b[:end+1]), "<%d:%d>", &w, &i); err != nil {
			t.Fatalf("record %q: %v", b[:end+1], err)
		}
		if i != next[w] {
			t.Fatalf("writer %d: record %d after %d", w, i, next[w]-1)
		}
		next[w]++
		b = b[end+1:]
	}
	for w, n := range next {
		if n != each {
			t.Errorf("writer %d: %d records arrived, want %d", w, n, each)
		}
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Error("write after Close succeeded")
	}
}

// Once the socket fails, flushes and writes fail instead of piling up.
func TestCoalescingConnStickyError(t *testing.T) {
	a, b := net.Pipe()
	c := newCoalescingConn(a, 0)
	_ = b.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.Write([]byte("frame")); err != nil {
			break
		}
		if err := c.Flush(); err != nil {
			if _, err := c.Write([]byte("more")); err == nil {
				t.Fatal("write after a failed flush succeeded")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes kept succeeding after the peer closed")
		}
		time.Sleep(time.Millisecond)
	}
	_ = c.Close()
}

// Close does not wait for a peer that stopped reading: the writer stuck in
// a write is unblocked by the write deadline Close sets.
func TestCoalescingConnCloseWithStuckWriter(t *testing.T) {
	a, b := net.Pipe() // synchronous: a write blocks until the other end reads
	defer b.Close()
	c := newCoalescingConn(a, 0)
	if _, err := c.Write([]byte("first")); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Flush() }()
	time.Sleep(20 * time.Millisecond) // the flush is now blocked in the pipe
	if _, err := c.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close waited for a peer that does not read")
	}
}

// A peer that stops reading fails the flush with ErrWriteStalled once no
// byte went out for the stall duration; a slow peer that keeps reading
// does not.
func TestCoalescingConnStall(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := newCoalescingConn(a, 100*time.Millisecond)
	if _, err := c.Write([]byte("nobody reads this")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Flush(); !errors.Is(err, ErrWriteStalled) {
		t.Fatalf("flush to a peer that does not read: %v, want ErrWriteStalled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the stall took %v to be found", d)
	}
	_ = c.Close()

	a, b = net.Pipe()
	defer b.Close()
	c = newCoalescingConn(a, 100*time.Millisecond)
	const size = 40
	got := make(chan int, 1)
	go func() { // reads a byte every 10 ms: the write takes 4 stall durations
		n := 0
		for buf := make([]byte, 1); n < size; n++ {
			time.Sleep(10 * time.Millisecond)
			if _, err := b.Read(buf); err != nil {
				break
			}
		}
		got <- n
	}()
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush to a slow reader: %v", err)
	}
	if n := <-got; n != size {
		t.Fatalf("peer read %d bytes, want %d", n, size)
	}
	_ = c.Close()
}
