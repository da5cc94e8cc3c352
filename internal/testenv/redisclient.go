package testenv

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// RedisClient returns a client for the Redis URL (as Redis.URL gives it),
// closed when the test ends. A URL that does not parse fails the test.
func RedisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redis url %q: %v", url, err)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
