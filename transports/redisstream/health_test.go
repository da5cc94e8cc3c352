package redisstream_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// CheckHealth PINGs Redis: healthy with the server up, an error naming the
// ping while it is down, healthy again once it is back on the same address.
func TestCheckHealthFollowsRedis(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	port, err := strconv.Atoi(r.Addr[strings.LastIndexByte(r.Addr, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	tp, err := redisstream.New(redisstream.Options{URL: r.URL}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Close() })
	var hc transport.HealthChecker = tp
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return hc.CheckHealth(ctx, []transport.Queue{{Name: "q"}})
	}
	if err := check(); err != nil {
		t.Fatalf("redis up: %v", err)
	}
	r.Stop()
	start := time.Now()
	err = check()
	if err == nil || !strings.Contains(err.Error(), "redis ping") {
		t.Fatalf("redis down: %v, want a ping error", err)
	}
	if el := time.Since(start); el > 3500*time.Millisecond {
		t.Errorf("check took %s with redis down", el)
	}
	testenv.StartRedis(t, testenv.RedisOptions{Port: port, Dir: r.Dir()})
	if err := check(); err != nil {
		t.Fatalf("redis back: %v", err)
	}
}
