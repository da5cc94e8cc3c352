package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-io/sluice/internal/simulator"
)

// h2cLoop is the concurrency-h2c baseline: the fastest plain HTTP/2 client
// loop for this work that we know how to write, on golang.org/x/net/http2's
// framing and HPACK directly. No queue, no gate, no result writing, no
// goroutine per request, no lock: inFlight requests spread over
// ceil(inFlight/250) connections (the gateway's stream limit), and on each
// connection one goroutine reads the frames, starts the next request the
// moment an answer ends (its HEADERS and DATA frames, the header block
// encoded once), and flushes what it wrote once the frames already read
// are handled, so a burst of answers is answered with one write. It sends
// requests (total across the connections) and returns when all answers are
// in, with how many failed: an answer other than 200, or a stream the
// gateway reset, is counted and the loop goes on (as sluice's failed calls
// are results, not the end of its run); a connection that fails is an
// error.
func h2cLoop(ctx context.Context, gatewayURL string, inFlight, total int) (failed int, err error) {
	u, err := url.Parse(gatewayURL + simulator.PathCompletions)
	if err != nil {
		return 0, err
	}
	// The same body and headers the net/http baseline sends.
	body := []byte(`{"model":"m","prompt":"hi","max_tokens":8}`)
	deadline := strconv.FormatInt(time.Now().Add(10*time.Minute).UnixMilli(), 10)
	fields := []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":authority", Value: u.Host}, {Name: ":path", Value: u.Path},
		{Name: "content-type", Value: "application/json"},
		{Name: "content-length", Value: strconv.Itoa(len(body))},
		{Name: "x-request-deadline", Value: deadline},
	}
	conns := (inFlight + simulator.MaxConcurrentStreams - 1) / simulator.MaxConcurrentStreams
	var next, bad atomic.Int64 // requests started and failed, across the connections
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		streams := inFlight / conns
		if i < inFlight%conns {
			streams++
		}
		wg.Go(func() {
			if err := h2cLoopConn(ctx, u.Host, streams, int64(total), &next, &bad, fields, body); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return int(bad.Load()), <-errs
}

// h2cLoopConn runs one connection of h2cLoop with streams requests in
// flight until next reaches total, adding the streams that failed to bad.
func h2cLoopConn(ctx context.Context, addr string, streams int, total int64, next, bad *atomic.Int64,
	fields []hpack.HeaderField, body []byte) error {
	nc, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	bw := bufio.NewWriterSize(nc, 64<<10)
	br := bufio.NewReaderSize(nc, 64<<10)
	fr := http2.NewFramer(bw, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.SetReuseFrames()

	// The header block, encoded twice: the first request adds the fields
	// to the gateway's HPACK table, every later one refers to them, so the
	// second block stays valid for all of them.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	encode := func() []byte {
		hb.Reset()
		for _, f := range fields {
			_ = enc.WriteField(f)
		}
		return bytes.Clone(hb.Bytes())
	}
	first, later := encode(), encode()

	const connWindow = 1 << 30
	if _, err := bw.WriteString(http2.ClientPreface); err != nil {
		return err
	}
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: 4 << 20}); err != nil {
		return err
	}
	if err := fr.WriteWindowUpdate(0, connWindow-65535); err != nil {
		return err
	}

	sendWindow := int64(65535) // the gateway's connection window for our DATA
	var (
		nextID   uint32 = 1
		pending  int    // requests due but waiting for send window
		open     int    // streams awaiting their answer
		received int64  // DATA bytes since the last WINDOW_UPDATE we sent
		block    = first
	)
	start := func() error {
		for pending > 0 && sendWindow >= int64(len(body)) {
			id := nextID
			nextID += 2
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true}); err != nil {
				return err
			}
			block = later
			if err := fr.WriteData(id, true, body); err != nil {
				return err
			}
			sendWindow -= int64(len(body))
			pending--
			open++
		}
		return nil
	}
	claim := func() {
		if next.Add(1) <= total {
			pending++
		}
	}
	for range streams {
		claim()
	}
	failedStreams := map[uint32]bool{} // open streams already counted as failed
	// Requests go out once the gateway's SETTINGS arrived (its stream limit
	// is known to be the simulator's); until then pending holds them.
	settled := false
	for {
		if settled {
			if err := start(); err != nil {
				return err
			}
		}
		if open == 0 && pending == 0 && settled {
			return nil
		}
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
		f, err := fr.ReadFrame()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("h2c loop: %w", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				settled = true
				if err := fr.WriteSettingsAck(); err != nil {
					return err
				}
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				sendWindow += int64(f.Increment)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := fr.WritePing(true, f.Data); err != nil {
					return err
				}
			}
		case *http2.MetaHeadersFrame:
			if s := f.PseudoValue("status"); s != "200" {
				failedStreams[f.StreamID] = true
				bad.Add(1)
			}
			if f.StreamEnded() {
				if len(failedStreams) > 0 {
					delete(failedStreams, f.StreamID)
				}
				open--
				claim()
			}
		case *http2.DataFrame:
			received += int64(len(f.Data()))
			if received > connWindow/2 {
				if err := fr.WriteWindowUpdate(0, uint32(received)); err != nil {
					return err
				}
				received = 0
			}
			if f.StreamEnded() {
				if len(failedStreams) > 0 {
					delete(failedStreams, f.StreamID)
				}
				open--
				claim()
			}
		case *http2.RSTStreamFrame:
			// The stream ends unanswered: a failed call, counted once.
			if !failedStreams[f.StreamID] {
				bad.Add(1)
			}
			delete(failedStreams, f.StreamID)
			open--
			claim()
		case *http2.GoAwayFrame:
			return errors.New("h2c loop: the gateway sent GOAWAY")
		}
	}
}

// runConcurrencyAuto is concurrency-h2c with no protocol configured: sluice
// at its default (auto) finds that the gateway speaks h2c. Its baseline is
// concurrency-h2c's.
func runConcurrencyAuto(ctx context.Context, o options) (figures, error) {
	return concurrency(ctx, o, "concurrency-auto", "auto")
}
