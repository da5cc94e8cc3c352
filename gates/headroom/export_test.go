package headroom

import "time"

// RedisAccount returns the Redis account of a, the replicas' order
// rotating every turn (tests: a turn longer than the test keeps it).
func RedisAccount(a AccountConfig, turn time.Duration) (Account, error) {
	return newRedisAccount(a, turn)
}
