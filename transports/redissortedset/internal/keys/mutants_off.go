//go:build !sluice_mutants

package keys

import (
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/mutant"
)

// Mutated returns nil: planted-bug scripts exist only in a build with the
// sluice_mutants tag (internal/mutant).
func Mutated(mutant.Name) *redis.Script { return nil }
