package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The example runs to the end over its own broker and prints one answer of
// the gateway per request.
func TestEmbedBroker(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want := `req-0 200 {"echo":{"prompt":"hello 0"}}
req-1 200 {"echo":{"prompt":"hello 1"}}
req-2 200 {"echo":{"prompt":"hello 2"}}`
	if got := strings.TrimSpace(out.String()); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
}
