package h2c

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-io/sluice/core/dispatch/internal/loopback"
)

// FuzzHostileGateway plays a hostile gateway: a loopback server whose
// every frame comes from the fuzz input (see the op constants: bad and
// oversized windows, DATA past the windows, headers without :status,
// CONTINUATION floods, RST_STREAM and GOAWAY at odd times, pings, huge
// SETTINGS, truncated frames, garbage, stalls, a gateway that stops
// reading), against one to three concurrent calls. Whatever it does, each
// call must return within its context's deadline plus a small margin, no
// response body buffer may grow past the body cap (nor the stream's
// receive window), a body read whole is within the cap, and every
// connection's goroutines must end once the calls are done. A panic or a
// deadlock fails the input too.
//
// The seed corpus (the adversarial cases named in seeds) runs as a plain
// test; fuzz longer with
//
//	go test -run '^$' -fuzz FuzzHostileGateway -fuzztime 10m ./core/dispatch/h2c
func FuzzHostileGateway(f *testing.F) {
	for _, s := range seeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script []byte) { playHostile(t, script) })
}

// Timing of one fuzz input.
const (
	callTimeout = 100 * time.Millisecond // each call's deadline
	// deadlineMargin is how long a call may outlive its deadline: a loaded
	// 2-core machine running the race detector or parallel fuzz workers
	// schedules late, so this is generous; a call stuck for good is caught
	// by deadlockAfter.
	deadlineMargin = 500 * time.Millisecond
	deadlockAfter  = 10 * time.Second
	serverWrite    = 2 * time.Second // the gateway's own write deadline
)

// Ops of the hostile gateway's script. Each op byte is taken modulo
// numOps; the op's arguments are the bytes after it (zeros past the end).
const (
	opSettings       = iota // n, then n × (id, value choice)
	opSettingsAck           // an unsolicited SETTINGS ACK
	opHeaders               // stream, status choice, flags, content-length choice
	opContinuation          // stream, flags, fragment length, fragment
	opContinuationFl        // count (×8), end: HEADERS without END_HEADERS, then a flood of empty CONTINUATION
	opData                  // stream, length choice, flags
	opDataBurst             // stream, count: full 16 KiB DATA frames
	opWindowUpdate          // stream, increment choice
	opRSTStream             // stream, code
	opGoAway                // last stream choice, code
	opPing                  // flags
	opPingFlood             // count (×4)
	opHugeSettings          // count (×16) of settings in one frame
	opTruncated             // a frame header promising more than follows, then the connection is closed
	opGarbage               // length, bytes: written raw
	opSleep                 // tens of ms (0-7)
	opClose                 // close the connection
	opPushPromise           // stream
	opUnknownFrame          // type, length
	opWaitRequest           // wait (up to 200 ms) for one more request than waited for so far
	opRespond               // stream (when every request is answered): a small answer to the oldest request not answered
	opStopReading           // stop reading the client's frames
	opStall                 // answer nothing more until the client leaves
	numOps
)

// script reads a fuzz input: past its end every byte is 0.
type script struct {
	b []byte
	i int
}

func (s *script) next() byte {
	if s.i >= len(s.b) {
		s.i++
		return 0
	}
	s.i++
	return s.b[s.i-1]
}

func (s *script) done() bool { return s.i >= len(s.b) }

func (s *script) u16() int { return int(s.next())<<8 | int(s.next()) }

// setup is what the input's first two bytes choose: the client's body cap
// and receive windows, how many calls run at once and what they send.
type setup struct {
	bodyCap      int64
	streamWindow int32
	connWindow   int32
	calls        int
	payload      int
	closeAtEnd   bool // when the script ends: close the connection, or keep it silent
}

func readSetup(s *script) setup {
	a, b := s.next(), s.next()
	return setup{
		bodyCap:      []int64{512, 4 << 10, 20 << 10, 70 << 10}[a&3],
		streamWindow: []int32{16 << 10, initialWindow, 256 << 10, defaultStreamWindow}[a>>2&3],
		connWindow:   []int32{initialWindow, 128 << 10, defaultConnWindow, defaultConnWindow}[a>>4&3],
		calls:        1 + int(b&3)%3,
		payload:      []int{0, 30, 100 << 10, 0}[b>>2&3],
		closeAtEnd:   b&16 != 0,
	}
}

func playHostile(t *testing.T, input []byte) {
	s := &script{b: input}
	cfg := readSetup(s)
	ops := input[min(2, len(input)):]

	stop := make(chan struct{})
	addr := loopback.Serve(t, func(nc net.Conn, n int) {
		defer nc.Close()
		if n >= 4 { // retries dial again; a few connections are enough
			return
		}
		g := newGateway(nc, stop)
		if g == nil {
			return
		}
		defer g.wait()
		g.run(&script{b: ops}, cfg.closeAtEnd)
	})
	t.Cleanup(func() { close(stop) }) // before the server's cleanup: stalls end

	tr := New(Config{MaxBodyBytes: cfg.bodyCap})
	tr.streamWindow, tr.connWindow = cfg.streamWindow, cfg.connWindow
	tr.writeStall = 300 * time.Millisecond
	u := &url.URL{Scheme: "http", Host: addr, Path: "/v1/completions"}
	payload := make([]byte, cfg.payload)

	type outcome struct {
		r    result
		late time.Duration
	}
	outs := make(chan outcome, cfg.calls)
	for range cfg.calls {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			dl, _ := ctx.Deadline()
			r := call(ctx, tr, u, jsonHeaders, payload)
			outs <- outcome{r, time.Since(dl)}
		}()
	}
	timeout := time.After(callTimeout + deadlockAfter)
	for range cfg.calls {
		select {
		case o := <-outs:
			if o.late > deadlineMargin {
				t.Errorf("a call returned %v after its deadline (%v)", o.late, o.r.err)
			}
			if o.r.err == nil && int64(len(o.r.body)) > cfg.bodyCap {
				t.Errorf("a body of %d bytes read whole past the cap of %d", len(o.r.body), cfg.bodyCap)
			}
		case <-timeout:
			t.Fatalf("calls still running %v after their deadline:\n%s", deadlockAfter, stacks())
		}
	}
	if p := tr.peakBuffer.Load(); p > cfg.bodyCap || p > int64(cfg.streamWindow) {
		t.Errorf("a body buffer of %d bytes (cap %d, stream window %d)", p, cfg.bodyCap, cfg.streamWindow)
	}
	if !connsEnd(tr, deadlockAfter) {
		t.Fatalf("closing the idle connections and ending their goroutines took over %v after the calls ended:\n%s", deadlockAfter, stacks())
	}
}

func stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// gateway is the server side of one connection of the fuzz test: a reader
// that notes the requests, and the script, which writes.
type gateway struct {
	nc   net.Conn
	fr   *http2.Framer // writing only
	stop <-chan struct{}
	henc *hpack.Encoder
	hbuf []byte

	mu       sync.Mutex
	requests []uint32      // stream IDs of the requests seen, in order
	arrived  chan struct{} // signalled when a request arrives
	waited   int           // requests opWaitRequest has waited for
	answered int           // requests opRespond has answered in order
	stopRead chan struct{} // closed to stop reading
	readDone chan struct{}
	stopOnce sync.Once
}

func newGateway(nc net.Conn, stop <-chan struct{}) *gateway {
	_ = nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(nc, preface); err != nil || string(preface) != http2.ClientPreface {
		return nil
	}
	_ = nc.SetReadDeadline(time.Time{})
	g := &gateway{nc: nc, fr: http2.NewFramer(nc, nil), stop: stop,
		arrived: make(chan struct{}, 1), stopRead: make(chan struct{}), readDone: make(chan struct{})}
	g.fr.AllowIllegalWrites = true
	g.henc = hpack.NewEncoder(&hpackBuf{g})
	go g.read()
	return g
}

// hpackBuf appends the encoder's output to the gateway's buffer.
type hpackBuf struct{ g *gateway }

func (b *hpackBuf) Write(p []byte) (int, error) {
	b.g.hbuf = append(b.g.hbuf, p...)
	return len(p), nil
}

// read reads the client's frames until the connection ends or the script
// stops it, and notes the requests.
func (g *gateway) read() {
	defer close(g.readDone)
	fr := http2.NewFramer(nil, g.nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for {
		select {
		case <-g.stopRead:
			<-g.stop // read nothing more until the input ends
			return
		default:
		}
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				continue
			}
			return
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.PseudoValue("method") != "" {
			g.mu.Lock()
			g.requests = append(g.requests, h.StreamID)
			g.mu.Unlock()
			select {
			case g.arrived <- struct{}{}:
			default:
			}
		}
	}
}

// wait ends the reader once the connection is closed.
func (g *gateway) wait() {
	_ = g.nc.Close()
	<-g.readDone
}

// stream picks the stream an op targets: mostly the newest request's.
func (g *gateway) stream(c byte) uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	latest, oldest := uint32(1), uint32(1)
	if n := len(g.requests); n > 0 {
		latest, oldest = g.requests[n-1], g.requests[0]
	}
	switch {
	case c < 170:
		return latest
	case c < 200:
		return oldest
	case c < 215:
		return 0
	case c < 235:
		return latest + 2 // never opened
	}
	return 2 // server-initiated
}

func (g *gateway) block(kv ...string) []byte {
	g.hbuf = g.hbuf[:0]
	for i := 0; i+1 < len(kv); i += 2 {
		_ = g.henc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return g.hbuf
}

// Value choices for the ops' arguments.
var (
	settingValues = []uint32{0, 1, 100, 16 << 10, initialWindow, initialWindow + 1, 1<<24 - 1, 1 << 24,
		1<<31 - 1, 1 << 31, 1<<32 - 1}
	increments = []uint32{0, 1, 1000, initialWindow, 1<<31 - 1 - initialWindow, 1<<31 - 1, 1 << 20}
	statuses   = []string{"200", "200", "204", "429", "503", "100", "103", "", "abc", "99", "1000", "2000000000"}
	lengths    = []string{"", "", "0", "5", "100000", "-1", "x"}
	dataSizes  = []int{0, 1, 100, 1000, 16<<10 - 1, 16 << 10}
)

// run plays the script; the gateway stops when the script ends (closing the
// connection or keeping it silent), when a write fails, or when the input
// ends.
func (g *gateway) run(s *script, closeAtEnd bool) {
	for !s.done() {
		_ = g.nc.SetWriteDeadline(time.Now().Add(serverWrite))
		if !g.op(s) {
			return
		}
	}
	if !closeAtEnd {
		g.stall()
	}
}

func (g *gateway) stall() {
	select {
	case <-g.stop:
	case <-g.readDone: // the client closed the connection
	}
}

// op plays one op; it reports whether to go on.
func (g *gateway) op(s *script) bool {
	var err error
	switch s.next() % numOps {
	case opSettings:
		var set []http2.Setting
		for n := s.next() % 4; n > 0; n-- {
			set = append(set, http2.Setting{ID: http2.SettingID(s.next() % 8),
				Val: settingValues[int(s.next())%len(settingValues)]})
		}
		err = g.fr.WriteSettings(set...)
	case opSettingsAck:
		err = g.fr.WriteSettingsAck()
	case opHeaders:
		id, status, flags, cl := g.stream(s.next()), statuses[int(s.next())%len(statuses)], s.next(), lengths[int(s.next())%len(lengths)]
		kv := []string{}
		if status != "" {
			kv = append(kv, ":status", status)
		}
		if cl != "" {
			kv = append(kv, "content-length", cl)
		}
		kv = append(kv, "content-type", "application/json")
		err = g.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: g.block(kv...),
			EndStream: flags&1 != 0, EndHeaders: flags&2 == 0})
	case opContinuation:
		id, flags, n := g.stream(s.next()), s.next(), int(s.next()%32)
		frag := make([]byte, n)
		for i := range frag {
			frag[i] = s.next()
		}
		err = g.fr.WriteContinuation(id, flags&1 != 0, frag)
	case opContinuationFl:
		id, n, end := g.stream(s.next()), int(s.next())*8, s.next()&1 != 0
		err = g.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: g.block(":status", "200")})
		for ; n > 0 && err == nil; n-- {
			err = g.fr.WriteContinuation(id, false, nil)
		}
		if err == nil && end {
			err = g.fr.WriteContinuation(id, true, nil)
		}
	case opData:
		id, size, flags := g.stream(s.next()), dataSizes[int(s.next())%len(dataSizes)], s.next()
		if flags&2 != 0 && size > 0 {
			// The frame's size is kept: a pad-length byte, data and padding.
			pad := make([]byte, min(int(s.next()), size-1))
			err = g.fr.WriteDataPadded(id, flags&1 != 0, make([]byte, size-1-len(pad)), pad)
		} else {
			err = g.fr.WriteData(id, flags&1 != 0, make([]byte, size))
		}
	case opDataBurst:
		id, n := g.stream(s.next()), int(s.next()%80)
		chunk := make([]byte, 16<<10)
		for ; n > 0 && err == nil; n-- {
			err = g.fr.WriteData(id, false, chunk)
		}
	case opWindowUpdate:
		err = g.fr.WriteWindowUpdate(g.stream(s.next()), increments[int(s.next())%len(increments)])
	case opRSTStream:
		err = g.fr.WriteRSTStream(g.stream(s.next()), http2.ErrCode(s.next()%14))
	case opGoAway:
		last := []uint32{0, g.stream(0), 1, 1<<31 - 1}[s.next()%4]
		err = g.fr.WriteGoAway(last, http2.ErrCode(s.next()%14), nil)
	case opPing:
		err = g.fr.WritePing(s.next()&1 != 0, [8]byte{1, 2, 3})
	case opPingFlood:
		for n := int(s.next()) * 4; n > 0 && err == nil; n-- {
			err = g.fr.WritePing(false, [8]byte{byte(n)})
		}
	case opHugeSettings:
		n := min(int(s.next())*16, (16<<10)/6)
		set := make([]http2.Setting, n)
		for i := range set {
			set[i] = http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(100 + i)}
		}
		err = g.fr.WriteSettings(set...)
	case opTruncated:
		var hdr [9]byte
		n := s.u16() % (16 << 10)
		hdr[0], hdr[1], hdr[2] = byte(n>>16), byte(n>>8), byte(n)
		hdr[3] = s.next() % 10 // a frame type
		binary.BigEndian.PutUint32(hdr[5:], g.stream(0))
		_, _ = g.nc.Write(append(hdr[:], make([]byte, n/2)...))
		return false
	case opGarbage:
		b := make([]byte, s.next()%64)
		for i := range b {
			b[i] = s.next()
		}
		_, err = g.nc.Write(b)
	case opSleep:
		select {
		case <-time.After(time.Duration(s.next()%8) * 10 * time.Millisecond):
		case <-g.stop:
			return false
		}
	case opClose:
		return false
	case opPushPromise:
		err = g.fr.WritePushPromise(http2.PushPromiseParam{StreamID: g.stream(s.next()), PromiseID: 2, EndHeaders: true,
			BlockFragment: g.block(":method", "GET", ":path", "/", ":scheme", "http", ":authority", "gw")})
	case opUnknownFrame:
		err = g.fr.WriteRawFrame(http2.FrameType(0x20+s.next()%16), 0, g.stream(0), make([]byte, s.next()))
	case opWaitRequest:
		timeout := time.After(200 * time.Millisecond)
		for {
			g.mu.Lock()
			seen := len(g.requests) > g.waited
			g.mu.Unlock()
			if seen {
				g.waited++
				break
			}
			select {
			case <-g.arrived:
				continue
			case <-timeout:
			case <-g.stop:
				return false
			}
			break
		}
	case opRespond:
		id := g.stream(s.next())
		g.mu.Lock()
		if g.answered < len(g.requests) {
			id = g.requests[g.answered] // the oldest request not answered yet
			g.answered++
		}
		g.mu.Unlock()
		body := `{"ok":true}`
		err = g.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
			BlockFragment: g.block(":status", "200", "content-length", strconv.Itoa(len(body)))})
		if err == nil {
			err = g.fr.WriteData(id, true, []byte(body))
		}
	case opStopReading:
		g.stopOnce.Do(func() { close(g.stopRead) })
	case opStall:
		g.stall()
		return false
	}
	return err == nil
}

// seedScript builds a seed: the setup bytes, then ops with their arguments.
func seedScript(a, b byte, ops ...[]byte) []byte {
	out := []byte{a, b}
	for _, op := range ops {
		out = append(out, op...)
	}
	return out
}

func op(code byte, args ...byte) []byte { return append([]byte{code}, args...) }

// seeds are the adversarial cases the fuzz test starts from (and the plain
// test runs). Setup byte a: cap (bits 0-1), stream window (2-3), connection
// window (4-5); byte b: calls (bits 0-1), payload (2-3), close at the end (4).
func seeds() [][]byte {
	hello := op(opSettings, 0)         // the server's SETTINGS
	wait := op(opWaitRequest)          // until a request arrives
	ok200 := op(opHeaders, 0, 0, 0, 0) // 200, no length, END_HEADERS, no END_STREAM
	const (
		capSmall   = 0      // 512 bytes
		capLarge   = 3      // 70 KiB
		win16K     = 0      // stream window 16 KiB
		win4M      = 3 << 2 // stream window 4 MiB
		connSmall  = 0      // connection window 65,535
		connLarge  = 2 << 4 // 64 MiB
		oneCall    = 0
		threeCalls = 2
		bigBody    = 2 << 2 // 100 KiB request body
		closeEnd   = 16
	)
	return [][]byte{
		// A well-behaved answer.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opRespond, 0)),
		// Three calls, each answered.
		seedScript(capLarge|win4M|connLarge, threeCalls, hello, wait, wait, wait, op(opRespond, 0), op(opRespond, 0), op(opRespond, 0)),
		// DATA past the stream's window (cap above it).
		seedScript(capLarge|win16K|connLarge, oneCall, hello, wait, ok200, op(opDataBurst, 0, 2), op(opStall)),
		// DATA past the connection's window.
		seedScript(capLarge|win4M|connSmall, oneCall, hello, wait, ok200, op(opDataBurst, 0, 5), op(opStall)),
		// A body past the cap, fast and in small frames.
		seedScript(capSmall|win4M|connLarge, oneCall, hello, wait, ok200, op(opDataBurst, 0, 40)),
		seedScript(capSmall|win4M|connLarge, threeCalls, hello, wait, ok200, op(opData, 0, 2, 0), op(opData, 0, 2, 0), op(opData, 0, 3, 1)),
		// WINDOW_UPDATE overflow on the stream and on the connection, and of 0.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opWindowUpdate, 0, 5), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opWindowUpdate, 210, 5), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opWindowUpdate, 0, 0), op(opWindowUpdate, 210, 0), op(opStall)),
		// SETTINGS: a window past 2^31-1, a frame size out of range, push on,
		// no streams allowed, then a huge frame of them.
		seedScript(capLarge|win4M|connLarge, oneCall|bigBody, op(opSettings, 1, 4, 9), wait, op(opRespond, 0)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opSettings, 1, 5, 0), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opSettings, 1, 2, 1), op(opStall)),
		seedScript(capLarge|win4M|connLarge, threeCalls, op(opSettings, 1, 3, 0), wait, op(opSettings, 1, 3, 2), wait, op(opRespond, 0)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, op(opHugeSettings, 255), wait, op(opRespond, 0)),
		// Headers without :status, with a bad one, 1xx floods, DATA first.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opHeaders, 0, 7, 0, 0), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opHeaders, 0, 8, 1, 3), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opHeaders, 0, 5, 0, 0), op(opHeaders, 0, 6, 0, 0), op(opRespond, 0)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opData, 0, 2, 0), op(opStall)),
		// CONTINUATION floods, ended and not.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opContinuationFl, 0, 255, 1), op(opData, 0, 1, 1)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opContinuationFl, 0, 255, 0), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opHeaders, 0, 0, 2, 0), op(opContinuation, 0, 1, 5, 1, 2, 3, 4, 5)),
		// RST_STREAM before the answer, after part of the body, refused.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opRSTStream, 0, 8), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, ok200, op(opData, 0, 3, 0), op(opRSTStream, 0, 2), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall|closeEnd, hello, wait, op(opRSTStream, 0, 7), wait, op(opRSTStream, 0, 7), wait, op(opRespond, 0)),
		// GOAWAY refusing everything, and GOAWAY in the middle of a body.
		seedScript(capLarge|win4M|connLarge, threeCalls|closeEnd, hello, wait, op(opGoAway, 0, 0)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, ok200, op(opData, 0, 2, 0), op(opGoAway, 1, 2), op(opData, 0, 2, 1)),
		// Pings, a flood of them, PUSH_PROMISE, unknown frames.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, op(opPing, 0), op(opPingFlood, 255), wait, op(opRespond, 0)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opPushPromise, 0), op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, op(opUnknownFrame, 1, 200), wait, op(opRespond, 0)),
		// Frames on streams never opened.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opData, 220, 2, 0), op(opStall)),
		// A truncated frame; garbage; a first frame that is not SETTINGS.
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opTruncated, 0x10, 0, 0)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, op(opGarbage, 9, 0, 0, 4, 0, 0, 0, 0, 0, 1)),
		seedScript(capLarge|win4M|connLarge, oneCall|closeEnd, op(opPing, 0), wait),
		// Stalls: silence until the deadline, slow answers, a gateway that
		// stops reading a large request body.
		seedScript(capLarge|win4M|connLarge, threeCalls, hello, wait, op(opStall)),
		seedScript(capLarge|win4M|connLarge, oneCall, hello, wait, ok200, op(opSleep, 7), op(opData, 0, 2, 0), op(opSleep, 7), op(opData, 0, 2, 1)),
		seedScript(capLarge|win4M|connLarge, oneCall|bigBody, op(opSettings, 1, 4, 6), op(opStopReading), op(opWindowUpdate, 210, 5), op(opStall)),
		// Closed at once.
		seedScript(capLarge|win4M|connLarge, oneCall|closeEnd, hello, wait),
	}
}
