package h2c

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// maxPendingWrite bounds the bytes a coalescingConn holds before Write
// writes (or waits for the writer to write) what is waiting.
const maxPendingWrite = 256 << 10

// closeFlushTimeout bounds how long Close lets what is still waiting (a
// GOAWAY, the last frames) go out before it closes the socket.
const closeFlushTimeout = time.Second

// coalescingConn is an HTTP/2 connection whose writes are gathered, so that
// the frames of many streams share a system call.
//
// The h2c client writes each frame with its own Write, under its write lock;
// Write only copies into a buffer. After releasing that lock, the caller
// calls Flush: if no other goroutine is writing to the socket, it becomes the
// writer and writes what is waiting — its own frames and whatever others
// added meanwhile — until nothing is left; if one is, that writer takes the
// caller's frames with its next write. So frames leave without waiting for
// another goroutine to be scheduled, and concurrent calls share system calls.
//
// A socket that takes no byte for the stall duration (the peer stopped
// reading) fails with ErrWriteStalled, so no Write or Flush blocks longer
// than that. A write error is sticky: it closes the socket (so the client's
// read loop fails every stream on it) and every later Write and Flush
// returns it.
type coalescingConn struct {
	net.Conn
	stall time.Duration // 0: no bound

	mu       sync.Mutex
	drained  sync.Cond // signalled when a write ends
	buf      []byte    // waiting to be written
	spare    []byte    // the last written buffer, reused
	writing  bool      // a goroutine is writing to the socket
	err      error     // sticky write error
	closed   bool      // Close was called: no more writes are taken
	deadline time.Time // the socket's write deadline
}

func newCoalescingConn(c net.Conn, stall time.Duration) *coalescingConn {
	cc := &coalescingConn{Conn: c, stall: stall}
	cc.drained.L = &cc.mu
	return cc
}

// Write queues p. Only when maxPendingWrite bytes are already waiting does
// it write them itself, or wait for the goroutine that is writing.
func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && !c.closed && len(c.buf) > 0 && len(c.buf)+len(p) > maxPendingWrite {
		if c.writing {
			c.drained.Wait()
		} else {
			c.flushLocked()
		}
	}
	if err := c.failure(); err != nil {
		return 0, err
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

// Flush writes what is waiting, unless another goroutine is writing: that
// one writes it. It returns the sticky error, if any.
func (c *coalescingConn) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.writing {
		c.flushLocked()
	}
	return c.err
}

// failure is the error a Write gets now, if any. Caller holds mu.
func (c *coalescingConn) failure() error {
	if c.err != nil {
		return c.err
	}
	if c.closed {
		return net.ErrClosed
	}
	return nil
}

// flushLocked writes until nothing is waiting or a write fails. Caller holds
// mu and nobody else is writing; mu is released around each write.
func (c *coalescingConn) flushLocked() {
	c.writing = true
	for c.err == nil && len(c.buf) > 0 {
		out := c.buf
		c.buf, c.spare = c.spare[:0], nil
		for rest := out; len(rest) > 0 && c.err == nil; {
			c.extendDeadlineLocked()
			c.mu.Unlock()
			n, err := c.Conn.Write(rest)
			c.mu.Lock()
			rest = rest[n:]
			switch {
			case err == nil:
			case errors.Is(err, os.ErrDeadlineExceeded) && c.stall > 0 && !c.closed:
				if n == 0 {
					c.err = fmt.Errorf("%w: no byte written for %s", ErrWriteStalled, c.stall)
				}
				// Otherwise the peer reads, slowly: write the rest with a
				// new deadline.
			default:
				c.err = err
			}
		}
		if c.err != nil {
			_ = c.Conn.Close()
		}
		if cap(out) <= maxPendingWrite {
			c.spare = out[:0]
		}
		c.drained.Broadcast()
	}
	c.writing = false
	c.drained.Broadcast()
}

// extendDeadlineLocked moves the socket's write deadline to stall from now
// once less than half of that is left, so that a write fails after between
// half the stall duration and all of it without progress, at the cost of a
// deadline change only every so often. Caller holds mu.
func (c *coalescingConn) extendDeadlineLocked() {
	if c.stall <= 0 || c.closed {
		return
	}
	now := time.Now()
	if c.deadline.Sub(now) > c.stall/2 {
		return
	}
	c.deadline = now.Add(c.stall)
	_ = c.Conn.SetWriteDeadline(c.deadline)
}

// Close stops taking writes, sends what is waiting (for up to
// closeFlushTimeout: a peer that stopped reading does not hold it up longer)
// and closes the socket.
func (c *coalescingConn) Close() error {
	dl := time.Now().Add(closeFlushTimeout)
	_ = c.Conn.SetWriteDeadline(dl) // unblocks a writer stuck now
	c.mu.Lock()
	c.closed = true
	c.deadline = dl
	_ = c.Conn.SetWriteDeadline(dl) // a writer may have moved it before mu was held
	for c.writing {
		c.drained.Wait()
	}
	c.flushLocked()
	c.mu.Unlock()
	return c.Conn.Close()
}
