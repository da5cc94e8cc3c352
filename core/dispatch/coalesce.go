package dispatch

import (
	"net"
	"sync"
	"time"
)

// maxPendingWrite bounds the bytes a coalescingConn holds before Write waits
// for the socket to take them.
const maxPendingWrite = 256 << 10

// closeFlushTimeout bounds how long Close lets the writer send what is still
// waiting (a GOAWAY, the last frames) before it closes the socket.
const closeFlushTimeout = time.Second

// coalescingConn is an HTTP/2 connection whose writes are gathered and
// written by one goroutine, so that the frames of many streams share a
// system call.
//
// The h2c client writes each frame with its own Write (HEADERS, then DATA)
// as calls come; one system call per frame was the most expensive part of a
// call on a busy host. Here Write copies into a buffer and wakes the writer;
// everything that arrives while the writer is busy or not yet running goes
// out with the next write. A write error is sticky: it closes the
// connection (so the client's read loop fails every stream on it) and every
// later Write returns it.
type coalescingConn struct {
	net.Conn

	mu      sync.Mutex
	drained sync.Cond // signalled when the writer takes the buffer or stops
	buf     []byte    // waiting to be written
	spare   []byte    // the writer's last buffer, reused
	err     error     // sticky write error
	closed  bool      // Close was called: no more writes are taken

	wake chan struct{} // one token: "there may be something to write"
	done chan struct{} // closed when the writer has stopped
}

func newCoalescingConn(c net.Conn) *coalescingConn {
	cc := &coalescingConn{Conn: c, wake: make(chan struct{}, 1), done: make(chan struct{})}
	cc.drained.L = &cc.mu
	go cc.writeLoop()
	return cc
}

// Write queues p for the writer. It waits only when maxPendingWrite bytes are
// already waiting.
func (c *coalescingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && !c.closed && len(c.buf) > 0 && len(c.buf)+len(p) > maxPendingWrite {
		c.drained.Wait()
	}
	if err := c.failure(); err != nil {
		c.mu.Unlock()
		return 0, err
	}
	c.buf = append(c.buf, p...)
	c.mu.Unlock()
	c.kick()
	return len(p), nil
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

func (c *coalescingConn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes whatever is waiting, in order, until a write fails or
// the connection is closed and everything waiting has been written.
func (c *coalescingConn) writeLoop() {
	defer close(c.done)
	for range c.wake {
		for {
			c.mu.Lock()
			out, closed := c.buf, c.closed
			c.buf, c.spare = c.spare[:0], nil
			c.drained.Broadcast()
			c.mu.Unlock()
			if len(out) == 0 {
				if closed {
					return
				}
				break
			}
			_, err := c.Conn.Write(out)
			c.mu.Lock()
			if err != nil {
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
}

// Close stops taking writes, lets the writer send what is waiting (for up to
// closeFlushTimeout: a peer that stopped reading does not hold it up longer)
// and closes the socket.
func (c *coalescingConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.drained.Broadcast()
	c.mu.Unlock()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	c.kick()
	t := time.NewTimer(closeFlushTimeout + 100*time.Millisecond)
	select {
	case <-c.done:
	case <-t.C:
	}
	t.Stop()
	return c.Conn.Close()
}
