package poolsim

import (
	"strings"
	"testing"
	"time"
)

// textSeq is a sequence with a text prompt of n tokens (4 bytes each).
func textSeq(id uint64, text string, maxTokens int) *seq {
	s := mkSeq(id, len(text)/4, maxTokens, 0, 0)
	s.key = text
	return s
}

func drain(t *testing.T, e *engine, now time.Time) time.Time {
	t.Helper()
	for i := 0; e.hasWork(); i++ {
		if i > 10_000 {
			t.Fatal("engine never drained")
		}
		st := runStep(e, now)
		now = now.Add(st.duration)
	}
	return now
}

// A continuation (prompt + the text made) finds the blocks of the request
// it continues and prefills only the rest; its blocks are accounted once.
func TestPrefixCacheServesAContinuation(t *testing.T) {
	e := testEngine(func(c *EngineConfig) { c.PrefixCaching = true })
	prompt := strings.Repeat(" wab", 96) // 96 tokens: 6 blocks of 16
	first := textSeq(1, prompt, 40)
	e.add(first)
	now := drain(t, e, t0)
	// its 96 + 39 computed tokens (the last sampled token is not yet
	// computed) are 8 whole blocks: 128 tokens cached
	if len(e.cache) != 1 || e.cache[0].tokens != 128 || e.cachedBlocks != 8 || e.freeBlocks != e.numBlocks {
		t.Fatalf("after the first: cache %+v, cached blocks %d, free %d of %d", e.cache, e.cachedBlocks, e.freeBlocks, e.numBlocks)
	}
	cont := prompt + completionText(40)
	next := textSeq(2, cont, 10)
	e.add(next)
	st := runStep(e, now)
	if next.blocks < 8 || st.prefillTokens != next.prompt-128 {
		t.Fatalf("continuation: prefill %d tokens, want %d (128 cached); blocks %d", st.prefillTokens, next.prompt-128, next.blocks)
	}
	if want := uint64(96 + next.prompt); e.prefixHits != 128 || e.prefixQueries != want {
		t.Fatalf("hits %d queries %d, want 128 and %d (both prompts)", e.prefixHits, e.prefixQueries, want)
	}
	if used := e.numBlocks - e.freeBlocks; used != next.blocks {
		t.Fatalf("%d blocks in use, the only running sequence holds %d", used, next.blocks)
	}
	drain(t, e, now)

	// A request with another text finds nothing.
	other := textSeq(3, strings.Repeat(" wcd", 96), 4)
	e.add(other)
	if st := runStep(e, now); st.prefillTokens != 96 {
		t.Fatalf("unrelated text: prefill %d tokens, want all 96", st.prefillTokens)
	}
}

// Cached blocks count as free and are evicted, oldest first, when new
// tokens need them: a continuation then finds nothing.
func TestPrefixCacheEvicts(t *testing.T) {
	e := testEngine(func(c *EngineConfig) { c.PrefixCaching = true; c.KVTokens = 256; c.MaxModelLen = 256 })
	prompt := strings.Repeat(" wab", 96)
	first := textSeq(1, prompt, 40)
	e.add(first)
	now := drain(t, e, t0)
	big := textSeq(2, strings.Repeat(" wxy", 200), 40) // needs more than the never-cached free blocks
	e.add(big)
	now = drain(t, e, now)
	if e.cachedBlocks > e.freeBlocks {
		t.Fatalf("%d cached blocks but %d free", e.cachedBlocks, e.freeBlocks)
	}
	next := textSeq(3, prompt+completionText(40), 4)
	e.add(next)
	if st := runStep(e, now); st.prefillTokens != next.prompt {
		t.Fatalf("after eviction: prefill %d tokens, want all %d", st.prefillTokens, next.prompt)
	}
}

// Off (the default) nothing is cached.
func TestPrefixCacheOff(t *testing.T) {
	e := testEngine(nil)
	prompt := strings.Repeat(" wab", 96)
	e.add(textSeq(1, prompt, 40))
	now := drain(t, e, t0)
	next := textSeq(2, prompt+completionText(40), 4)
	e.add(next)
	if st := runStep(e, now); st.prefillTokens != next.prompt || len(e.cache) != 0 {
		t.Fatalf("prefix caching off: prefill %d of %d, cache %v", st.prefillTokens, next.prompt, e.cache)
	}
}
