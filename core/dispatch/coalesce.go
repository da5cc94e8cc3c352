package dispatch

import (
	"net"
	"sync"
	"time"
)

// maxPendingWrite bounds the bytes a coalescingConn holds before Write waits
// for the socket to take them.
const maxPendingWrite = 256 << 10

// coalescingConn is an HTTP/2 connection whose writes are gathered and
// written by one goroutine, so that the frames of many streams share a
// system call.
//
// The HTTP/2 client flushes after every frame it writes for a request (the
// HEADERS, then the DATA), which costs two system calls per request, the
// most expensive part of a call on a busy host. Here Write copies into a
// buffer and wakes the writer; everything that arrives while the writer is
// busy or not yet running goes out with the next write. A write error is
// sticky: it closes the connection (so the client's read loop fails every
// stream on it) and every later Write returns it.
type coalescingConn struct {
	net.Conn

	wmu sync.Mutex // held while writing to Conn; taken before mu

	mu      sync.Mutex
	drained sync.Cond // signalled when the writer has taken the buffer
	buf     []byte    // waiting to be written
	spare   []byte    // the writer's last buffer, reused
	err     error     // sticky write error, or net.ErrClosed after Close
	wake    chan struct{}
}

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c, wake: make(chan struct{}, 1)}
	cc.drained.L = &cc.mu
	go cc.writeLoop()
	return cc
}

// Write queues p for the writer. It waits only when maxPendingWrite bytes are
// already waiting.
func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && len(c.buf) > 0 && len(c.buf)+len(p) > maxPendingWrite {
		c.drained.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	c.buf = append(c.buf, p...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (c *coalescingConn) writeLoop() {
	for range c.wake {
		c.wmu.Lock()
		c.mu.Lock()
		out := c.buf
		c.buf, c.spare = c.spare[:0], nil
		stop := c.err != nil
		c.drained.Broadcast()
		c.mu.Unlock()
		if stop {
			c.wmu.Unlock()
			return
		}
		var err error
		if len(out) > 0 {
			_, err = c.Conn.Write(out)
		}
		c.wmu.Unlock()
		c.mu.Lock()
		if err != nil && c.err == nil {
			c.err = err
			c.drained.Broadcast()
		}
		if cap(out) <= maxPendingWrite {
			c.spare = out[:0]
		}
		c.mu.Unlock()
		if err != nil {
			_ = c.Conn.Close()
			return
		}
	}
}

// closeFlushTimeout bounds how long Close tries to write what is still
// waiting (a GOAWAY, the last frames) before it closes.
const closeFlushTimeout = time.Second

// Close writes what is still waiting (for up to closeFlushTimeout) and
// closes the connection. Later writes fail with net.ErrClosed.
func (c *coalescingConn) Close() error {
	c.wmu.Lock()
	c.mu.Lock()
	out, prev := c.buf, c.err
	c.buf = nil
	if c.err == nil {
		c.err = net.ErrClosed
	}
	c.drained.Broadcast()
	c.mu.Unlock()
	if prev == nil && len(out) > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		_, _ = c.Conn.Write(out)
	}
	c.wmu.Unlock()
	select {
	case c.wake <- struct{}{}: // let the writer see the error and return
	default:
	}
	return c.Conn.Close()
}
