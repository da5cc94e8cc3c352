package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/internal/testenv"
)

// upstreamEnvelopeLine is a request as upstream's producer marshals it
// (api.InternalRequest: internal, request_kind, data; empty fields omitted).
func upstreamEnvelopeLine(id, queue string, deadline int64) string {
	return fmt.Sprintf(`{"internal":{"queue_id":"pool-a","request_token":"0123456789abcdef0123456789abcdef","request_queue_name":%q,"result_queue_name":"result-list"},`+
		`"request_kind":"redis","data":{"id":%q,"created":1700000000,"deadline":%d,"payload":{"model":"m","prompt":"p"},"request_queue_name":%q,"result_queue_name":"result-list"}}`,
		queue, id, deadline, queue)
}

// dumpKeys renders the keys matching pattern with their contents.
func dumpKeys(t *testing.T, c *redis.Client, pattern string) string {
	t.Helper()
	ctx := context.Background()
	ks, err := c.Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		switch c.Type(ctx, k).Val() {
		case "zset":
			fmt.Fprintln(&b, k, c.ZRangeWithScores(ctx, k, 0, -1).Val())
		case "hash":
			fmt.Fprintln(&b, k, c.HGetAll(ctx, k).Val())
		case "list":
			fmt.Fprintln(&b, k, c.LRange(ctx, k, 0, -1).Val())
		default:
			fmt.Fprintln(&b, k, c.Get(ctx, k).Val())
		}
	}
	return b.String()
}

// TestMigrateCommand drives `sluice migrate` against a real redis-server on
// state written in sluice's layout: a dry run changes nothing, --to-upstream
// refuses while a lease is renewed and otherwise produces upstream's shapes,
// a second run moves nothing, and --from-upstream adopts the retry set back
// into the delay set a transport config names.
func TestMigrateCommand(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	t.Setenv("REDIS_URL", r.URL)
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	const q = "llm-d-async:requests:pool-a"
	dl := time.Now().Add(time.Hour).Unix()
	due := time.Now().Add(30 * time.Minute).UnixMilli()
	a, b := upstreamEnvelopeLine("a", q, dl), upstreamEnvelopeLine("b", q, dl)
	flat := fmt.Sprintf(`{"_sluice":"00000000000000000001/","id":"c","deadline":%d,"payload":{}}`, dl)
	score := strconv.FormatInt(dl, 10)
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, q+":leases", redis.Z{Score: 1000, Member: "dead-replica:1:1"}) // expired long ago
		p.HSet(ctx, q+":leased", "dead-replica:1:1", score+"|1|"+a)
		p.ZAdd(ctx, q+":delayed", redis.Z{Score: float64(due), Member: score + "|" + b})
		p.ZAdd(ctx, q+":delayed", redis.Z{Score: float64(due), Member: score + "|" + flat})
		p.LPush(ctx, q+":dead", "x")
		// A queue a replica still serves: its lease expires in an hour.
		p.ZAdd(ctx, "busy:leases", redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "live:1:1"})
		p.HSet(ctx, "busy:leased", "live:1:1", score+"|1|"+upstreamEnvelopeLine("d", "busy", dl))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^llm-d-async:requests:pool-a\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$`)
	counts := func(out string) string {
		m := row.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no summary row in:\n%s", out)
		}
		return strings.Join(m[1:], " ")
	}

	before := dumpKeys(t, c, "*")
	out, _, err := runCLI(t, ctx, "", "migrate", "--to-upstream", "--dry-run", "--pool", "pool-a")
	if err != nil || !strings.Contains(out, "dry run") || counts(out) != "1 1 1 0 1 0" {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	if after := dumpKeys(t, c, "*"); after != before {
		t.Fatalf("the dry run wrote:\n%s\nwas:\n%s", after, before)
	}

	_, _, err = runCLI(t, ctx, "", "migrate", "--to-upstream", "--queue", q, "--queue", "busy")
	if err == nil || !strings.Contains(err.Error(), "busy: 1 lease(s) still being renewed") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("with a live lease: %v", err)
	}
	if after := dumpKeys(t, c, "*"); after != before {
		t.Fatalf("a refused migration wrote:\n%s\nwas:\n%s", after, before)
	}

	out, _, err = runCLI(t, ctx, "", "migrate", "--to-upstream", "--pool", "pool-a")
	if err != nil || counts(out) != "1 1 1 0 1 1" || !strings.Contains(out, "left in place: dead-letter lists") {
		t.Fatalf("migration: %v\n%s", err, out)
	}
	for member, key := range map[string]string{a: q, flat: q, b: "retry-sortedset"} {
		s, err := c.ZScore(ctx, key, member).Result()
		if err != nil {
			t.Fatalf("%s not in %s: %v", member, key, err)
		}
		want := float64(dl)
		if key == "retry-sortedset" {
			want = float64(due) / 1000
		}
		if s != want {
			t.Errorf("%s in %s: score %v, want %v", member, key, s, want)
		}
	}
	if n := c.Exists(ctx, q+":leases", q+":leased", q+":delayed").Val(); n != 0 {
		t.Errorf("%d of sluice's lease and delay keys left", n)
	}
	before = dumpKeys(t, c, "*")
	out, _, err = runCLI(t, ctx, "", "migrate", "--to-upstream", "--pool", "pool-a")
	if err != nil || counts(out) != "0 0 0 0 1 1" {
		t.Fatalf("second run: %v\n%s", err, out)
	}
	if after := dumpKeys(t, c, "*"); after != before {
		t.Fatalf("the second run wrote:\n%s\nwas:\n%s", after, before)
	}

	// Back to sluice, with upstream's flat retry_queue_name in the config:
	// sluice's delay set is then <queue>:retry-sortedset.
	cfg := filepath.Join(t.TempDir(), "queues.json")
	if err := os.WriteFile(cfg, []byte(`{"retry_queue_name":"retry-sortedset","result_queue_name":"result-list",
		"queues":[{"id":"pool-a","queue_name":"`+q+`","igw_base_url":"http://gw"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err = runCLI(t, ctx, "", "migrate", "--from-upstream", "--transport-config-file", cfg)
	if err != nil || !regexp.MustCompile(`(?m)^llm-d-async:requests:pool-a\s+1\s+0\s+0, 0$`).MatchString(out) || !strings.Contains(out, "left in retry-sortedset: 0") {
		t.Fatalf("--from-upstream: %v\n%s", err, out)
	}
	if s, err := c.ZScore(ctx, q+":retry-sortedset", score+"|"+b).Result(); err != nil || int64(s) != due {
		t.Errorf("b in the delay set: %v %v, want due %d", s, err, due)
	}
}

// TestMigrateCommandErrors checks the command's refusals of bad input.
func TestMigrateCommandErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--queue", "q"}, "exactly one of --to-upstream and --from-upstream"},
		{[]string{"migrate", "--to-upstream", "--from-upstream", "--queue", "q"}, "exactly one of"},
		{[]string{"migrate", "--from-upstream", "--force", "--queue", "q"}, "--force goes with --to-upstream"},
		{[]string{"migrate", "--to-upstream", "--redis.url", "redis://127.0.0.1:1"}, "no queue to migrate"},
		{[]string{"migrate", "--to-upstream", "--transport-config", `{"queues":[],"lease_ms":"x"}`}, "lease_ms"},
	} {
		_, _, err := runCLI(t, ctx, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}
