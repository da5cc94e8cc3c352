package batch

import (
	"bufio"
	"encoding/json"
	"io"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// lineWriter writes JSONL through a buffer.
type lineWriter struct{ w *bufio.Writer }

func newLineWriter(w io.Writer) *lineWriter { return &lineWriter{w: bufio.NewWriterSize(w, 64<<10)} }

func (l *lineWriter) line(b []byte) error {
	if _, err := l.w.Write(b); err != nil {
		return err
	}
	return l.w.WriteByte('\n')
}

func (l *lineWriter) flush() error { return l.w.Flush() }
