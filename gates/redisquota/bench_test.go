package redisquota

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/internal/redisconn"
	"github.com/sluice-io/sluice/internal/testenv"
)

// admitters is how many goroutines admit at once in the benchmarks (the
// handler goroutines of a busy queue).
const admitters = 64

// BenchmarkAdmit measures admissions per second with 64 concurrent
// admitters against a real redis-server, and the Redis round trips each
// costs: through the gate (scripts of concurrent callers share pipelines)
// and, as the baseline, the plain loop of one EVALSHA per script from 64
// goroutines over a pool of 64 connections, running the same scripts on
// the same keys. In concurrency mode each admission is followed by its
// release (two scripts). For reference, go-redis' own (experimental)
// AutoPipeline runs the same loop too.
//
//	go test -run '^$' -bench BenchmarkAdmit -benchtime 3s -count 5 ./gates/redisquota/
func BenchmarkAdmit(b *testing.B) {
	rs := testenv.StartRedis(b, testenv.RedisOptions{})
	admin := testenv.RedisClient(b, rs.URL)
	flush := func(b *testing.B) {
		if err := admin.FlushAll(context.Background()).Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, mode := range []Mode{RateLimit, Concurrency} {
		b.Run("mode="+string(mode)+"/gate", func(b *testing.B) { flush(b); benchGate(b, rs.Addr, mode) })
		for _, pool := range []int{admitters, 16} {
			b.Run("mode="+string(mode)+"/baseline-evalsha-pool="+strconv.Itoa(pool), func(b *testing.B) {
				flush(b)
				benchBaseline(b, rs.Addr, mode, pool, false)
			})
		}
		b.Run("mode="+string(mode)+"/reference-goredis-autopipeline", func(b *testing.B) {
			flush(b)
			benchBaseline(b, rs.Addr, mode, 16, true)
		})
	}
}

func parallel(b *testing.B, body func(tenant string, pb *testing.PB)) {
	b.SetParallelism((admitters + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body("t"+strconv.FormatInt(n.Add(1), 10), pb)
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admits/s")
}

func benchGate(b *testing.B, addr string, mode Mode) {
	g, err := New(Config{Redis: redisconn.Config{Address: addr}, Mode: mode, Limit: 1 << 30, Window: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	if _, err := g.Admit(ctx, &wire.Request{Metadata: map[string]string{"userid": "warm"}}); err != nil {
		b.Fatal(err) // loads the scripts
	}
	p0, s0 := g.pipelines()
	parallel(b, func(tenant string, pb *testing.PB) {
		req := &wire.Request{ID: tenant, Deadline: time.Now().Add(time.Hour), Metadata: map[string]string{"userid": tenant}}
		for pb.Next() {
			d, err := g.Admit(ctx, req)
			if err != nil || d.Verdict != gate.Admit {
				b.Errorf("Admit = %v, %v", d.Verdict, err)
				return
			}
			if d.Release != nil {
				d.Release()
			}
		}
	})
	p1, s1 := g.pipelines()
	b.ReportMetric(float64(p1-p0)/float64(b.N), "roundtrips/admit")
	b.ReportMetric(float64(s1-s0)/float64(p1-p0), "scripts/roundtrip")
}

func benchBaseline(b *testing.B, addr string, mode Mode, pool int, auto bool) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	for _, s := range allScripts {
		if err := c.ScriptLoad(ctx, s.src).Err(); err != nil {
			b.Fatal(err)
		}
	}
	var do redis.Scripter = c
	if auto {
		ap, err := c.AutoPipeline()
		if err != nil {
			b.Fatal(err)
		}
		defer ap.Close()
		do = ap
	}
	const ttl = 60
	window := time.Second
	var ids atomic.Int64
	parallel(b, func(tenant string, pb *testing.PB) {
		key := DefaultPrefix + DefaultAttribute + ":" + tenant
		keys := []string{key, key + LeaseSuffix}
		for pb.Next() {
			id := "b-" + strconv.FormatInt(ids.Add(1), 36)
			if mode == RateLimit {
				if err := do.EvalSha(ctx, rateLimitScript.sha, keys[:1],
					1<<30, int64(window/time.Microsecond), 0, 2, id).Err(); err != nil {
					b.Error(err)
					return
				}
				continue
			}
			if err := do.EvalSha(ctx, acquireScript.sha, keys, 1<<30, ttl, id, 30000).Err(); err != nil {
				b.Error(err)
				return
			}
			if err := do.EvalSha(ctx, releaseScript.sha, keys, ttl, id).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	per := 1.0
	if mode == Concurrency {
		per = 2
	}
	if !auto { // the autopipeliner's round trips are not counted
		b.ReportMetric(per, "roundtrips/admit")
		b.ReportMetric(1, "scripts/roundtrip")
	}
}

// TestSharedConnection: gates from one factory with equal connection
// settings share one connection (and its pipelines), which closes with the
// last of them.
func TestSharedConnection(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	f := NewFactory()
	params := func(extra string) gate.Params {
		return gate.NewParams(map[string]string{"address": rs.Addr, "limit": "2", "mode": extra})
	}
	g1, err := f(params("rate-limit"), gate.Env{})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := f(params("concurrency"), gate.Env{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f(gate.NewParams(map[string]string{"address": rs.URL, "limit": "2"}), gate.Env{})
	if err != nil {
		t.Fatal(err)
	}
	a, b, o := g1.(*Gate), g2.(*Gate), other.(*Gate)
	if a.c != b.c || a.c == o.c {
		t.Fatalf("connections: same settings share (%p, %p), different ones do not (%p)", a.c, b.c, o.c)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	req := &wire.Request{ID: "r", Deadline: time.Now().Add(time.Minute), Metadata: map[string]string{"userid": "u"}}
	d, err := b.Admit(context.Background(), req)
	if err != nil || d.Verdict != gate.Admit {
		t.Fatalf("Admit through the shared connection after the other gate closed = %v, %v", d.Verdict, err)
	}
	d.Release()
	for _, g := range []*Gate{b, o} {
		if err := g.Close(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-b.c.done:
	default:
		t.Fatal("the shared connection's loop still runs after its last gate closed")
	}
}

// TestConcurrentAdmitsShareRoundTrips: admissions that arrive while a
// pipeline is in flight go out together in the next one.
func TestConcurrentAdmitsShareRoundTrips(t *testing.T) {
	rs := testenv.StartRedis(t, testenv.RedisOptions{})
	admin := testenv.RedisClient(t, rs.URL)
	g, err := New(Config{Redis: redisconn.Config{Address: rs.Addr}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx := context.Background()
	if _, err := g.Admit(ctx, &wire.Request{Metadata: map[string]string{"userid": "warm"}}); err != nil {
		t.Fatal(err)
	}
	p0, _ := g.pipelines()
	// Redis pauses: the first pipeline waits in it while the rest queue.
	if err := admin.Do(ctx, "CLIENT", "PAUSE", 200, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, admitters)
	for i := range admitters {
		go func() {
			req := &wire.Request{Metadata: map[string]string{"userid": "u" + strconv.Itoa(i)}}
			d, err := g.Admit(ctx, req)
			if err == nil && d.Verdict != gate.Admit {
				err = fmt.Errorf("verdict %v, want admit", d.Verdict)
			}
			errs <- err
		}()
	}
	for range admitters {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if p1, _ := g.pipelines(); p1-p0 > 4 {
		t.Fatalf("%d admissions took %d round trips; want them to share a few", admitters, p1-p0)
	}
}
