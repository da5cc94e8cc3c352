// Package redishealth checks the health of the Redis transports against a
// redis-server it starts and stops. A test rig: only tests import it.
package redishealth

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
)

// Check checks a Redis transport's transport.HealthChecker against a
// real redis-server it starts: healthy with the server up; an error naming
// the ping, within the 3-s bound /readyz gives it, while the server is down;
// healthy again once the server is back on the same address. build makes the
// transport on the server's URL; the check closes it.
func Check(t *testing.T, build func(t *testing.T, url string) transport.Transport) {
	t.Helper()
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	port, err := strconv.Atoi(r.Addr[strings.LastIndexByte(r.Addr, ':')+1:])
	if err != nil {
		t.Fatal(err)
	}
	tp := build(t, r.URL)
	t.Cleanup(func() { _ = tp.Close() })
	hc, ok := tp.(transport.HealthChecker)
	if !ok {
		t.Fatalf("%T is not a transport.HealthChecker", tp)
	}
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
