package redisquota

import (
	"strconv"
	"sync"

	"github.com/sluice-io/sluice/internal/redisclient"
)

// Key layout. The tenant key (the counter, or the rate-limit set) is
// upstream's in both modes: prefix + attribute + ":" + value. Only the lease
// set of concurrency mode, which the scripts touch together with the
// counter, is named differently in a cluster, so that both land in the
// counter's hash slot (a script's keys must share one slot):
//
//   - single node: key + LeaseSuffix;
//   - cluster, key with a hash tag of its own ({...} with something between
//     the braces): key + LeaseSuffix, as on a single node (same tag);
//   - cluster, key without a hash tag: "{" + key + "}" + LeaseSuffix (the
//     braces make the whole counter name the tag);
//   - cluster, key without a hash tag that contains "}" (a tenant named
//     "a}b", say), which cannot be put inside braces: "{" + t + "}" + key +
//     LeaseSuffix, where t is the first of 0, 1, 2, ... (base 36) whose
//     slot is the key's. Every replica computes the same t.

// keySpace computes lease set names; it caches the slot tags it searched.
type keySpace struct {
	cluster bool

	mu   sync.Mutex
	tags map[int]string // slot → the first base-36 number in it
}

// leaseSet returns the lease set of the tenant key key.
func (ks *keySpace) leaseSet(key string) string {
	if !ks.cluster {
		return key + LeaseSuffix
	}
	if p, err := redisclient.Tagged(key); err == nil {
		return p + LeaseSuffix
	}
	return "{" + ks.slotTag(redisclient.Slot(key)) + "}" + key + LeaseSuffix
}

// slotTag returns the first base-36 number (as text) whose hash slot is
// slot. Every slot has one below 36^4 (TestSlotTagsCoverEverySlot).
func (ks *keySpace) slotTag(slot int) string {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if t, ok := ks.tags[slot]; ok {
		return t
	}
	t := searchSlotTag(slot)
	if ks.tags == nil {
		ks.tags = map[int]string{}
	}
	ks.tags[slot] = t
	return t
}

func searchSlotTag(slot int) string {
	for n := uint64(0); ; n++ {
		if s := formatTag(n); redisclient.Slot(s) == slot {
			return s
		}
	}
}

func formatTag(n uint64) string { return strconv.FormatUint(n, 36) }
