package redisstream_test

import (
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/transports/redisstream"
)

func TestRefusesClusterMode(t *testing.T) {
	_, err := redisstream.Factory([]byte(`{}`), transport.Env{RedisURL: "redis://127.0.0.1:1", RedisMode: "cluster"})
	if err == nil || !strings.Contains(err.Error(), "Redis Cluster") {
		t.Fatalf("redis_mode cluster: %v, want an error saying redis-stream does not run on a Redis Cluster", err)
	}
}
