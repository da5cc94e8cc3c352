package host

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
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

// lines is an io.Writer that hands each complete line it is written,
// without its newline, to line, one at a time (under its lock); a line
// longer than maxLine is handed on in pieces.
type lines struct {
	line func(b []byte)

	mu  sync.Mutex
	buf []byte
}

// maxLine bounds a line kept waiting for its newline.
const maxLine = 64 << 10

// Write implements io.Writer.
func (w *lines) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			if len(w.buf) > maxLine {
				w.line(w.buf)
				w.buf = w.buf[:0]
			}
			return len(p), nil
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

// lineRelay logs what a plugin writes to os.Stderr after go-plugin's Serve
// took it over (go-plugin streams it to the host's SyncStderr, in chunks):
// line by line, a line in hclog's JSON format at its level, any other line
// at debug, as go-plugin relays the process's own stderr.
func lineRelay(log hclog.Logger) io.Writer {
	return &lines{line: func(b []byte) {
		var entry map[string]any
		if json.Unmarshal(b, &entry) != nil {
			log.Debug(string(b))
			return
		}
		msg, _ := entry["@message"].(string)
		lvl, _ := entry["@level"].(string)
		args := make([]any, 0, 2*len(entry))
		for k, v := range entry {
			if !strings.HasPrefix(k, "@") {
				args = append(args, k, v)
			}
		}
		level := hclog.LevelFromString(lvl)
		if level == hclog.NoLevel {
			level = hclog.Debug
		}
		log.Log(level, msg, args...)
	}}
}

// crashRelay is go-plugin's ClientConfig.Stderr: it receives the lines the
// plugin process writes to its own stderr (file descriptor 2, not the
// os.Stderr that Serve redirects), one Write per line and one per newline.
// go-plugin logs those lines at debug, below the info level of the host's
// logger, and the Go runtime writes a panic or a fatal error there: from
// the first line that opens one ("panic: ", "fatal error: "), crashRelay
// logs every line at error, so that the reason a plugin died reaches the
// log. (go-plugin v1.7 does this itself; v1.6, which sluice uses because
// its later releases import the testing package into the host, does not.)
func crashRelay(log hclog.Logger) io.Writer {
	crashed := false // guarded by the lock of lines
	return &lines{line: func(b []byte) {
		s := string(b)
		if !crashed && (strings.HasPrefix(s, "panic: ") || strings.HasPrefix(s, "fatal error: ")) {
			crashed = true
		}
		if crashed {
			log.Error(s)
		}
	}}
}

// quietLogger is the logger handed to go-plugin's client. It logs as its
// hclog.Logger does, but for the lines go-plugin v1.6 logs above what they
// are worth, which its later releases (see crashRelay for why sluice holds
// v1.6) log at debug or no longer at all: the "configuring ... automatic
// mTLS" line of the client and of the plugin on every start (info), and
// the error of the stdout scanner that loses a race with the exited
// process's pipe closing (os.ErrClosed: the process exit is logged anyway).
type quietLogger struct{ hclog.Logger }

// Info implements hclog.Logger.
func (l quietLogger) Info(msg string, args ...any) {
	if strings.HasPrefix(msg, "configuring ") && strings.HasSuffix(msg, " automatic mTLS") {
		l.Logger.Debug(msg, args...)
		return
	}
	l.Logger.Info(msg, args...)
}

// Error implements hclog.Logger.
func (l quietLogger) Error(msg string, args ...any) {
	if msg == "error encountered while scanning stdout" && len(args) == 2 {
		if err, ok := args[1].(error); ok && errors.Is(err, os.ErrClosed) {
			l.Logger.Debug(msg, args...)
			return
		}
	}
	l.Logger.Error(msg, args...)
}

// Named implements hclog.Logger.
func (l quietLogger) Named(name string) hclog.Logger { return quietLogger{l.Logger.Named(name)} }

// ResetNamed implements hclog.Logger.
func (l quietLogger) ResetNamed(name string) hclog.Logger {
	return quietLogger{l.Logger.ResetNamed(name)}
}

// With implements hclog.Logger.
func (l quietLogger) With(args ...any) hclog.Logger { return quietLogger{l.Logger.With(args...)} }
