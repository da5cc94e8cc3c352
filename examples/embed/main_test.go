package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// The example runs to the end and prints one result per request: two
// answers of the gateway and one DEADLINE_EXCEEDED.
func TestEmbed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (one result per request):\n%s", len(lines), out.String())
	}
	for i, want := range []string{
		`{"id":"req-0","status_code":200,"payload":"{\"echo\":{\"prompt\":\"hello 0\"}}"}`,
		`{"id":"req-1","status_code":200,"payload":"{\"echo\":{\"prompt\":\"hello 1\"}}"}`,
		`{"id":"req-2",`,
	} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d = %s\nwant it to start with %s", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[2], `"error_code":"DEADLINE_EXCEEDED"`) {
		t.Errorf("expired request: %s", lines[2])
	}
}
