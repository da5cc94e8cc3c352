package host

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// newLogger returns the hclog logger, at level info, of name writing to w.
func newLogger(name string, w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Info, Output: w})
}

// rateWriter passes at most rate writes (log lines: hclog writes one line
// per call) per second to out and drops the rest, counting them; the first
// line passed after a drop, or flush, reports how many were dropped. rate
// 0 drops nothing.
type rateWriter struct {
	out  io.Writer
	rate int
	name string

	mu          sync.Mutex
	window      time.Time // start of the current one-second window
	n           int       // lines passed in it
	dropped     int       // lines dropped since the last report
	droppedEver atomic.Int64
}

func newRateWriter(out io.Writer, rate int, name string) *rateWriter {
	return &rateWriter{out: out, rate: rate, name: name}
}

// Write implements io.Writer.
func (w *rateWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.rate > 0 {
		now := time.Now()
		if now.Sub(w.window) >= time.Second {
			w.window, w.n = now, 0
		}
		if w.n >= w.rate {
			w.dropped++
			w.droppedEver.Add(1)
			return len(p), nil
		}
		w.n++
	}
	w.reportLocked()
	return w.out.Write(p)
}

// reportLocked writes how many lines were dropped since the last report.
func (w *rateWriter) reportLocked() {
	if w.dropped == 0 {
		return
	}
	_, _ = fmt.Fprintf(w.out, "%s [WARN]  %s: %d plugin log lines suppressed (log_rate %d lines/s)\n",
		time.Now().Format("2006-01-02T15:04:05.000Z0700"), w.name, w.dropped, w.rate)
	w.dropped = 0
}

// flush reports lines dropped and not yet reported.
func (w *rateWriter) flush() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.reportLocked()
	w.mu.Unlock()
}

// suppressedTotal is the number of lines dropped since the start.
func (w *rateWriter) suppressedTotal() int64 { return w.droppedEver.Load() }
