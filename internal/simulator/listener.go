package simulator

import (
	"bufio"
	"net"
)

// readBufferSize is the per-connection read buffer of BufferReads: room for
// dozens of the small HTTP/2 frames a completion request is made of. At
// 4 KiB, the HTTP/1 server's own 4 KiB reads bypass it (bufio reads a
// request at least as large as its buffer straight into the caller's slice).
const readBufferSize = 4 << 10

// BufferReads returns a listener whose connections read through a buffer.
//
// Go's HTTP/2 server reads every frame with two reads straight from the
// connection (the 9-byte header, then the payload), so a request costs at
// least four read system calls; through a buffer, one read picks up every
// frame that has arrived. Start uses it; so should a program that serves
// Handler on a listener of its own when it measures sluice on the same
// machine, where the simulator's system calls take CPU from sluice.
func BufferReads(ln net.Listener) net.Listener { return bufferedListener{ln} }

type bufferedListener struct{ net.Listener }

func (l bufferedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, readBufferSize)}, nil
}

// bufferedConn is a connection whose reads go through r; everything else
// (writes, deadlines, close) is the connection's own.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
