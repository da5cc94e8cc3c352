//go:build !sluice_mutants

package redisstream

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/mutant"
)

// mutatedScript returns nil: planted-bug scripts exist only in a build with
// the sluice_mutants tag (internal/mutant).
func mutatedScript(mutant.Name) *redis.Script { return nil }
