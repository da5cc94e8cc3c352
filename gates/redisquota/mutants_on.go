//go:build sluice_mutants

package redisquota

import "github.com/sluice-io/sluice/internal/mutant"

// mutatedScript returns the planted-bug variant of a script for mutant n
// (internal/mutant), or nil when n has none.
func mutatedScript(n mutant.Name) *script {
	if n == mutant.QuotaReleaseTwice {
		// The release without its guard: it decrements whether or not the
		// lease was still held.
		return newScript(`
redis.call('ZREM', KEYS[2], ARGV[2])
` + leasePrelude + `
if not cur then return 0 end
if cur > 0 then
  cur = redis.call('DECR', KEYS[1])
  if cur > 0 then keep(tonumber(ARGV[1]) * 1000, false) end
end
return 1
`)
	}
	return nil
}
