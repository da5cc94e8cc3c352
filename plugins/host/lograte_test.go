package host

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
)

// The lines go-plugin v1.6 logs above their worth go to debug, and nothing
// else moves: an info line, an error of the same message with another
// cause, and the lines of a logger got from Named or With.
func TestQuietLogger(t *testing.T) {
	var buf bytes.Buffer
	l := quietLogger{newLogger("plugin", &buf)}
	closed := &fs.PathError{Op: "read", Path: "|0", Err: os.ErrClosed}
	l.Info("configuring client automatic mTLS")
	l.Named("testplugin").Info("configuring server automatic mTLS", "timestamp", "t")
	l.Error("error encountered while scanning stdout", "error", closed)
	l.With("k", "v").Named("x").Error("error encountered while scanning stdout", "error", closed)
	if buf.Len() != 0 {
		t.Errorf("demoted lines logged at info:\n%s", buf.String())
	}
	l.Info("plugin process exited")
	l.Named("testplugin").Error("error encountered while scanning stdout", "error", errors.New("read |0: input/output error"))
	l.Error("reading plugin stderr", "error", closed)
	out := buf.String()
	for _, want := range []string{
		"[INFO]  plugin: plugin process exited",
		`[ERROR] plugin.testplugin: error encountered while scanning stdout: error="read |0: input/output error"`,
		`[ERROR] plugin: reading plugin stderr: error="read |0: file already closed"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
