package main

import (
	"net"
	"os"
	"testing"
)

// TestSocketOwner checks the /proc lookup the recording proxy uses to tell
// which replica a streaming pull belongs to: the client end of a loopback
// connection of this process is found as this process's, and not as
// another's.
func TestSocketOwner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := c.LocalAddr().(*net.TCPAddr).Port
	me := os.Getpid()
	if got := socketOwner(port, []int{me}); got != me {
		t.Errorf("socketOwner(%d, [self]) = %d, want %d", port, got, me)
	}
	if got := socketOwner(port, []int{os.Getppid()}); got != 0 {
		t.Errorf("socketOwner(%d, [parent]) = %d, want 0", port, got)
	}
}
