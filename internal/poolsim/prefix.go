package poolsim

// The engine's prefix cache (EngineConfig.PrefixCaching), after vLLM V1's
// automatic prefix caching: the KV blocks a sequence held stay cached when
// it leaves the engine (it finished, was cancelled or preempted) and count
// as free; a later sequence whose text starts with a cached sequence's
// text takes those blocks over and counts their tokens as already
// computed (vLLM's get_computed_blocks); a block needed for new tokens is
// taken from the never-cached free blocks first, then by evicting cached
// entries, least recently cached first.
//
// Simplifications, each on the side of fewer hits: a sequence's blocks are
// cached and evicted as one entry, a hit takes one entry (the longest
// common prefix), and a text is compared byte by byte with four bytes to a
// token (as estimateTokens reads a prompt), so a prompt of token ids
// (not text) is never cached. What this serves in sluice's benchmarks is a
// resumed request (core/resume): its prompt is the evicted call's prompt
// and the text it had made, so it finds that call's blocks if they were
// not reused meanwhile and it reaches the same pod.

// cacheEntry is one released sequence's cached blocks.
type cacheEntry struct {
	key    string // its prompt text and the text it generated
	tokens int    // cached tokens: its computed tokens in whole blocks
	blocks int
}

// release caches what s computed when it leaves the engine (its blocks
// already freed).
func (e *engine) release(s *seq) {
	if !e.cfg.PrefixCaching || s.key == "" {
		return
	}
	full := s.computed / e.cfg.BlockSize
	if full == 0 {
		return
	}
	key := s.key + completionText(s.output)
	e.cache = append(e.cache, cacheEntry{key: key, tokens: full * e.cfg.BlockSize, blocks: full})
	e.cachedBlocks += full
}

// evictFor evicts cached entries, oldest first, until n blocks are free
// outside the cache (or the cache is empty).
func (e *engine) evictFor(n int) {
	for n > e.freeBlocks-e.cachedBlocks && len(e.cache) > 0 {
		e.cachedBlocks -= e.cache[0].blocks
		e.cache[0] = cacheEntry{}
		e.cache = e.cache[1:]
	}
}

// lookup gives s, about to be admitted with nothing computed, the longest
// cached prefix of its text: the entry's blocks become s's and their
// tokens computed, at most all of s's tokens but one (the step must
// compute at least one to sample). It counts the query and the hit.
func (e *engine) lookup(s *seq) {
	if !e.cfg.PrefixCaching || s.key == "" || s.computed != 0 || s.looked {
		return
	}
	s.looked = true // once per admission: a head-of-line wait does not query again
	e.prefixQueries += uint64(s.numTokens())
	best, bestTokens := -1, 0
	for i := range e.cache {
		n := commonPrefix(e.cache[i].key, s.key) / 4
		n = min(n, e.cache[i].tokens, s.numTokens()-1) / e.cfg.BlockSize * e.cfg.BlockSize
		if n > bestTokens {
			best, bestTokens = i, n
		}
	}
	if best < 0 {
		return
	}
	hit := e.cache[best]
	e.cache = append(e.cache[:best], e.cache[best+1:]...)
	e.cachedBlocks -= hit.blocks
	blocks := bestTokens / e.cfg.BlockSize
	e.freeBlocks -= blocks
	s.blocks += blocks
	s.computed = bestTokens
	e.prefixHits += uint64(bestTokens)
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
