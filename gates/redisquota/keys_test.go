package redisquota

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/redisclient"
)

// Every script's KEYS share one hash slot in cluster mode, for any tenant
// name (braces included) and prefix, and the single-node names are
// upstream's key + LeaseSuffix. The tenant key itself is never renamed.
func TestKeySlots(t *testing.T) {
	tenants := []string{"alice", "", "{", "}", "{}", "}{", "{a}", "a{b}c", "a}b", "a{}b", "{}x}", "x{y", "}x{y}",
		"{{}}", "a}{b}", "é{ü}", "tenant with spaces", strings.Repeat("}", 5)}
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "ab{}:x"
	for range 500 {
		b := make([]byte, 1+rng.IntN(8))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		tenants = append(tenants, string(b))
	}
	for _, prefix := range []string{DefaultPrefix, "{quota}:", "q}", "q{"} {
		for _, mode := range []redisclient.Mode{redisclient.Single, redisclient.Cluster} {
			g, err := New(Config{Redis: redisconn.Config{Address: "127.0.0.1:1", Mode: mode}, Limit: 1, Mode: Concurrency, Prefix: prefix})
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tenants {
				key, set := g.Key(v), g.LeaseSetKey(v)
				if key != prefix+DefaultAttribute+":"+v {
					t.Fatalf("%s: tenant %q: key %q renamed", mode, v, key)
				}
				if mode == redisclient.Single && set != key+LeaseSuffix {
					t.Fatalf("single: tenant %q: lease set %q, want %q", v, set, key+LeaseSuffix)
				}
				if mode == redisclient.Cluster && redisclient.Slot(set) != redisclient.Slot(key) {
					t.Fatalf("cluster: tenant %q: lease set %q in slot %d, key %q in %d",
						v, set, redisclient.Slot(set), key, redisclient.Slot(key))
				}
				if !strings.HasSuffix(set, LeaseSuffix) || set == key {
					t.Fatalf("%s: tenant %q: lease set %q", mode, v, set)
				}
			}
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The documented shapes.
	ks := &keySpace{cluster: true}
	for key, want := range map[string]string{
		"quota:userid:alice":   "{quota:userid:alice}:sluice-leases",
		"quota:userid:{a}":     "quota:userid:{a}:sluice-leases",
		"quota:userid:a}b":     "{" + searchSlotTag(redisclient.Slot("quota:userid:a}b")) + "}quota:userid:a}b:sluice-leases",
		"{quota}:userid:alice": "{quota}:userid:alice:sluice-leases",
	} {
		if got := ks.leaseSet(key); got != want {
			t.Errorf("lease set of %q = %q, want %q", key, got, want)
		}
	}
}

// searchSlotTag ends for every slot, with a short tag.
func TestSlotTagsCoverEverySlot(t *testing.T) {
	seen := make([]bool, redisclient.SlotCount)
	left := redisclient.SlotCount
	for n := uint64(0); n < 36*36*36*36 && left > 0; n++ {
		if s := redisclient.Slot(formatTag(n)); !seen[s] {
			seen[s] = true
			left--
		}
	}
	if left > 0 {
		t.Fatalf("%d slots have no base-36 tag below 36^4", left)
	}
}

// Every command a script sends names a key from KEYS (a cluster routes a
// script by its KEYS; a key built inside the script could live on another
// node), except TIME, which takes none.
func TestScriptsTouchOnlyTheirKeys(t *testing.T) {
	call := regexp.MustCompile(`redis\.call\('(\w+)'(?:,\s*([^,)]+))?`)
	for _, s := range allScripts {
		calls := call.FindAllStringSubmatch(s.src, -1)
		if len(calls) == 0 {
			t.Fatalf("script %s: no redis.call found", s.sha)
		}
		for _, m := range calls {
			if m[1] == "TIME" {
				continue
			}
			if !regexp.MustCompile(`^KEYS\[\w+\]$`).MatchString(strings.TrimSpace(m[2])) {
				t.Errorf("script %s: %s on %q, not a key from KEYS", s.sha, m[1], m[2])
			}
		}
	}
}

// go-redis asks a command whether it may be retried through its Cmder
// interface; a script command says no. (This stops compiling if go-redis
// drops NoRetry from Cmder, which would make noRetryCmd silently inert.)
func TestScriptCommandsAreNotRetried(t *testing.T) {
	o := &op{script: acquireScript, keys: []string{"k", "{k}:sluice-leases"}, args: []any{1, 2, "id", 3}}
	var c redis.Cmder = noRetryCmd{scriptCmd(context.Background(), o, false)}
	if !c.NoRetry() {
		t.Fatal("a script command may be retried")
	}
	want := []any{"evalsha", acquireScript.sha, 2, "k", "{k}:sluice-leases", 1, 2, "id", 3}
	if got := c.Args(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("args %v, want %v", got, want)
	}
}
