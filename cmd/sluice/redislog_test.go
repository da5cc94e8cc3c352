package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/redact"
	"github.com/sluice-io/sluice/internal/testenv"
)

// TestRedisLogRedacted makes go-redis log a line of its own (its connection
// pool failing to dial, with a dial error naming a redis:// URL with a
// password) once setRedisLogger routed its logger through a logger writing
// to a buffer: the line must come out there, with the password masked.
func TestRedisLogRedacted(t *testing.T) {
	const secret = "hunter2-redis-pw"
	var buf testenv.Buffer
	setRedisLogger(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { setRedisLogger(nil) })

	c := redis.NewClient(&redis.Options{
		Addr:          "127.0.0.1:1",
		MaxRetries:    -1,
		DialerRetries: 1,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("dial redis://default:" + secret + "@127.0.0.1:1/0: connection refused")
		},
	})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err == nil {
		t.Fatal("ping succeeded through a dialer that always fails")
	}
	out := buf.String()
	if !strings.Contains(out, "failed to dial") {
		t.Fatalf("go-redis's pool line did not reach the logger; got:\n%s", out)
	}
	if strings.Contains(out, secret) {
		t.Errorf("the password is in the log:\n%s", out)
	}
	if !strings.Contains(out, "redis://default:"+redact.Mask+"@127.0.0.1:1/0") {
		t.Errorf("the URL is not there with its password masked:\n%s", out)
	}
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "component=go-redis") {
		t.Errorf("want a warning marked component=go-redis:\n%s", out)
	}
}
