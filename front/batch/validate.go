package batch

import (
	"context"
	"errors"
	"io"
	"runtime"
)

// errTooManyLines stops validateLines at the line past Config.MaxLines.
var errTooManyLines = errors.New("too many lines")

// checkChunkLines is how many lines one worker of validateLines checks at
// a time.
const checkChunkLines = 512

// checkChunk is a run of consecutive lines of a file, copied, and their
// checks once a worker made them (ready closes then).
type checkChunk struct {
	buf    []byte
	lines  []lineSpan
	checks []lineCheck
	ready  chan struct{}
}

type lineSpan struct{ n, from, to int }

// validateLines checks every non-blank line of r against endpoint and
// calls accept with each line's check in file order, from this goroutine.
// The lines are checked in parallel (checkLine keeps no state), by up to
// GOMAXPROCS workers, so the checks against the lines before (accept's,
// in order) are all that runs in series: a 50,000-line file took 50 ms on
// one core, most of the wait between creating a batch and enqueueing its
// first chunk. It returns errTooManyLines at the line past maxLines, or
// the error reading r; the lines checked up to then were passed to accept.
func validateLines(ctx context.Context, r io.Reader, endpoint string, maxLines int, accept func(lineCheck)) error {
	workers := min(runtime.GOMAXPROCS(0), 4)
	work := make(chan *checkChunk, workers)
	order := make(chan *checkChunk, 2*workers) // bounds the chunks read ahead
	for range workers {
		go func() {
			for ch := range work {
				ch.checks = make([]lineCheck, len(ch.lines))
				for i, l := range ch.lines {
					ch.checks[i] = checkLine(endpoint, l.n, ch.buf[l.from:l.to])
				}
				close(ch.ready)
			}
		}()
	}
	readErr := make(chan error, 1)
	go func() {
		defer close(order)
		defer close(work)
		var ch *checkChunk
		send := func() {
			if ch != nil && len(ch.lines) > 0 {
				work <- ch
				order <- ch
			}
			ch = nil
		}
		count := 0
		err := eachLine(r, func(n int, b []byte) error {
			if count == maxLines {
				return errTooManyLines
			}
			count++
			if ch == nil {
				if err := ctx.Err(); err != nil {
					return err
				}
				ch = &checkChunk{buf: make([]byte, 0, 64<<10), lines: make([]lineSpan, 0, checkChunkLines), ready: make(chan struct{})}
			}
			from := len(ch.buf)
			ch.buf = append(ch.buf, b...)
			ch.lines = append(ch.lines, lineSpan{n: n, from: from, to: len(ch.buf)})
			if len(ch.lines) == checkChunkLines {
				send()
			}
			return nil
		})
		send()
		readErr <- err
	}()
	for ch := range order {
		<-ch.ready
		for _, lc := range ch.checks {
			accept(lc)
		}
	}
	return <-readErr
}
