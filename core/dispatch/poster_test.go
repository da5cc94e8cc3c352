package dispatch

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-io/sluice/core/dispatch/h2c"
	"github.com/sluice-io/sluice/core/dispatch/internal/loopback"
)

// A gateway that breaks HTTP/2 flow control fails the call Retryable, with
// an error that names the violation; the protocol client's own tests (in
// package h2c) cover each violation.
func TestH2CProtocolErrorRetryable(t *testing.T) {
	addr := loopback.Serve(t, func(nc net.Conn, _ int) {
		defer nc.Close()
		if _, err := io.ReadFull(nc, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(nc, nc)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		_ = fr.WriteSettings()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			if h, ok := f.(*http2.MetaHeadersFrame); ok {
				_ = fr.WriteWindowUpdate(h.StreamID, 1<<31-1) // past 2^31-1
			}
		}
	})
	c := newClient(t, Config{Protocol: ProtocolH2C})
	out := c.Do(t.Context(), Target{BaseURL: "http://" + addr}, newRequest(time.Minute))
	var pe *h2c.ProtocolError
	if out.Class != Retryable || !errors.As(out.Err, &pe) || pe.Code != http2.ErrCodeFlowControl ||
		!strings.Contains(out.Err.Error(), "FLOW_CONTROL_ERROR") {
		t.Fatalf("%v %v, want Retryable with a FLOW_CONTROL_ERROR", out.Class, out.Err)
	}
}
