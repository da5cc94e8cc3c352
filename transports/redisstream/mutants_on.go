//go:build sluice_mutants

package redisstream

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/mutant"
)

// mutatedScript returns the planted-bug variant of a script for mutant n
// (internal/mutant), or nil when n has none.
func mutatedScript(n mutant.Name) *redis.Script {
	if n == mutant.StreamAckUnowned {
		return redis.NewScript(resultBody + ackTail) // no ownership check
	}
	return nil
}
