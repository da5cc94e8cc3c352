package dispatch

import (
	"net"
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
// A write error is sticky: it closes the socket (so the client's read loop
// fails every stream on it) and every later Write and Flush returns it.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	drained sync.Cond // signalled when a write ends
	buf     []byte    // waiting to be written
	spare   []byte    // the last written buffer, reused
	writing bool      // a goroutine is writing to the socket
	err     error     // sticky write error
	closed  bool      // Close was called: no more writes are taken
}

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c}
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
		c.mu.Unlock()
		_, err := c.Conn.Write(out)
		c.mu.Lock()
		if err != nil {
			c.err = err
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

// Close stops taking writes, sends what is waiting (for up to
// closeFlushTimeout: a peer that stopped reading does not hold it up longer)
// and closes the socket.
func (c *coalescingConn) Close() error {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	c.mu.Lock()
	c.closed = true
	for c.writing {
		c.drained.Wait()
	}
	c.flushLocked()
	c.mu.Unlock()
	return c.Conn.Close()
}
