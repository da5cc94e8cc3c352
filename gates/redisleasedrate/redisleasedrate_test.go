package redisleasedrate_test

import (
	"context"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/gates/redisleasedrate"
	"github.com/sluice-io/sluice/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// leases reads the drain_limit gauges the gate registers on
// gate.Env.PoolMetrics.
type leases struct {
	t   testing.TB
	reg *prometheus.Registry
}

func newLeases(t testing.TB) *leases { return &leases{t: t, reg: prometheus.NewRegistry()} }

// env is the gate's Env for pool, its PoolMetrics the registry read.
func (l *leases) env(pool string) gate.Env { return gate.Env{Pool: pool, PoolMetrics: l.reg} }

// get returns the gauges of the one pool they exist for, and n, the
// number of pools they exist for (each gauge must carry pool_name and no
// other label).
func (l *leases) get() (pool string, rps float64, valid bool, until time.Time, n int) {
	l.t.Helper()
	fams, err := l.reg.Gather()
	if err != nil {
		l.t.Fatal(err)
	}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "pool_name" {
				l.t.Fatalf("%s carries labels %v, want pool_name alone", f.GetName(), m.GetLabel())
			}
			pool = m.GetLabel()[0].GetValue()
			v := m.GetGauge().GetValue()
			switch f.GetName() {
			case "llm_d_async_async_drain_limit_rps":
				rps, n = v, n+1
			case "llm_d_async_async_drain_limit_lease_valid":
				valid = v == 1
			case "llm_d_async_async_drain_limit_valid_until_seconds":
				if v != 0 {
					until = time.UnixMilli(int64(math.Round(v * 1000)))
				}
			default:
				l.t.Fatalf("unexpected series %s", f.GetName())
			}
		}
	}
	return pool, rps, valid, until, n
}

func build(t testing.TB, params string, env gate.Env) (gate.Gate, error) {
	t.Helper()
	r := gate.NewRegistry()
	if err := r.Register(redisleasedrate.Type, redisleasedrate.Factory); err != nil {
		t.Fatal(err)
	}
	return gatetest.Build(t, r, redisleasedrate.Type, params, env)
}

func mustBuild(t testing.TB, params string, env gate.Env) gate.Gate {
	t.Helper()
	g, err := build(t, params, env)
	if err != nil {
		t.Fatalf("build %s: %v", params, err)
	}
	return g
}

// control writes the controller's hash.
func control(t testing.TB, c *redis.Client, key string, fields map[string]string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Del(ctx, key, key+":state").Err(); err != nil {
		t.Fatal(err)
	}
	if len(fields) == 0 {
		return
	}
	if err := c.HSet(ctx, key, fields).Err(); err != nil {
		t.Fatal(err)
	}
}

func validLease(rps string, until time.Time) map[string]string {
	return map[string]string{"api_version": redisleasedrate.APIVersion, "pool_id": "pool-a", "max_admission_rps": rps,
		"valid_until_unix_ms": strconv.FormatInt(until.UnixMilli(), 10), "decision_id": "d-1"}
}

func admit(t testing.TB, g gate.Gate) gate.Decision {
	t.Helper()
	d, err := g.(gate.Admitter).Admit(context.Background(), nil)
	if err != nil {
		t.Fatalf("Admit: %v (the gate fails closed with a deferral, never an error)", err)
	}
	return d
}

func startRedis(t *testing.T) (*testenv.Redis, *redis.Client) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return r, c
}

// A valid lease on a real redis-server: the bucket holds rate × burst
// tokens, refills at the rate on Redis' clock, and the state hash expires
// after the lease; the budget is 1 and the lease is recorded.
func TestTokenBucket(t *testing.T) {
	r, c := startRedis(t)
	rec := newLeases(t)
	g := mustBuild(t, `{"address":"`+r.URL+`","control_key":"ctl","burst_seconds":0.5}`, rec.env("pool-a"))
	if pool, rps, valid, until, n := rec.get(); n != 1 || pool != "pool-a" || rps != 0 || valid || !until.IsZero() {
		t.Fatalf("at construction the lease reads %s %v %v %v (%d pools), want pool-a 0 invalid none", pool, rps, valid, until, n)
	}
	until := time.Now().Add(time.Minute)
	control(t, c, "ctl", validLease("10", until))
	if b, err := gatetest.Query(t, g); err != nil || b != 1 {
		t.Fatalf("Budget = %v, %v; want 1", b, err)
	}
	admitted := 0
	for range 8 {
		if admit(t, g).Verdict == gate.Admit {
			admitted++
		}
	}
	if admitted != 5 { // capacity max(1, 10 × 0.5)
		t.Fatalf("%d of 8 admitted at once, want the bucket's 5", admitted)
	}
	d := admit(t, g)
	if d.Verdict != gate.Defer || d.Delay <= 0 || d.Delay > time.Second || d.Result != nil {
		t.Fatalf("empty bucket: %+v, want a deferral of about 1/rate", d)
	}
	time.Sleep(250 * time.Millisecond) // 2.5 tokens at 10/s
	admitted = 0
	for range 5 {
		if admit(t, g).Verdict == gate.Admit {
			admitted++
		}
	}
	if admitted < 2 || admitted > 3 {
		t.Fatalf("after 250 ms at 10/s, %d admitted, want 2", admitted)
	}
	pool, rps, valid, got, _ := rec.get()
	if pool != "pool-a" || rps != 10 || !valid || got.UnixMilli() != until.UnixMilli() {
		t.Fatalf("lease recorded %s %v %v %v, want pool-a 10 valid %v", pool, rps, valid, got, until)
	}
	ctx := context.Background()
	if ttl := c.PTTL(ctx, "ctl:state").Val(); ttl < 59*time.Second || ttl > 62*time.Second {
		t.Fatalf("state hash PTTL %v, want the lease's remaining minute + 1 s", ttl)
	}
	if tok, _ := strconv.ParseFloat(c.HGet(ctx, "ctl:state", "tokens").Val(), 64); !(tok >= 0 && tok < 1) {
		t.Fatalf("state tokens %v, want what is left below 1", tok)
	}
}

// Any lease that is not valid for this pool admits nothing, and its budget
// is 0; a paused lease is valid but admits nothing either.
func TestInvalidLeases(t *testing.T) {
	r, c := startRedis(t)
	rec := newLeases(t)
	g := mustBuild(t, `{"address":"`+r.URL+`","control_key":"ctl","pool_id":"pool-a"}`, rec.env("other"))
	future := time.Now().Add(time.Minute)
	with := func(k, v string) map[string]string {
		m := validLease("100", future)
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name      string
		fields    map[string]string
		wantValid bool
	}{
		{"no control hash", nil, false},
		{"another api_version", with("api_version", "llm-d.ai/v1"), false},
		{"another pool", with("pool_id", "pool-b"), false},
		{"no decision_id", with("decision_id", ""), false},
		{"no rate", with("max_admission_rps", ""), false},
		{"negative rate", with("max_admission_rps", "-1"), false},
		{"rate not a number", with("max_admission_rps", "fast"), false},
		{"rate infinite", with("max_admission_rps", "inf"), false},
		{"expired", with("valid_until_unix_ms", strconv.FormatInt(time.Now().Add(-time.Second).UnixMilli(), 10)), false},
		{"valid_until not an integer", with("valid_until_unix_ms", strconv.FormatInt(future.UnixMilli(), 10)+".5"), false},
		{"paused (rate 0)", with("max_admission_rps", "0"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			control(t, c, "ctl", tt.fields)
			if d := admit(t, g); d.Verdict != gate.Defer {
				t.Fatalf("Admit = %+v, want a deferral", d)
			}
			if _, rps, valid, _, _ := rec.get(); valid != tt.wantValid || rps != 0 {
				t.Fatalf("after Admit the lease reads rps %v valid %v, want 0 and %v", rps, valid, tt.wantValid)
			}
			if b, err := gatetest.Query(t, g); err != nil || b != 0 {
				t.Fatalf("Budget = %v, %v; want 0", b, err)
			}
			if _, _, valid, _, _ := rec.get(); valid != tt.wantValid {
				t.Fatalf("after Budget the lease reads valid %v, want %v", valid, tt.wantValid)
			}
		})
	}
	// The pool defaults to the gate's worker pool.
	g2 := mustBuild(t, `{"address":"`+r.URL+`","control_key":"ctl"}`, gate.Env{Pool: "pool-a"})
	control(t, c, "ctl", validLease("100", future))
	if d := admit(t, g2); d.Verdict != gate.Admit {
		t.Fatalf("pool_id from the worker pool: %+v, want Admit", d)
	}
}

// Without Redis the gate fails closed: a deferral (no error, no result) and
// a budget error under the closed failure policy.
func TestFailClosed(t *testing.T) {
	r, c := startRedis(t)
	g := mustBuild(t, `{"address":"`+r.URL+`","control_key":"ctl"}`, gate.Env{Pool: "pool-a"})
	control(t, c, "ctl", validLease("100", time.Now().Add(time.Minute)))
	if d := admit(t, g); d.Verdict != gate.Admit {
		t.Fatalf("with Redis: %+v", d)
	}
	r.Stop()
	if d := admit(t, g); d.Verdict != gate.Defer || d.Result != nil {
		t.Fatalf("Redis gone: %+v, want a deferral", d)
	}
	if _, err := gatetest.Query(t, g); err == nil {
		t.Fatal("Budget with Redis gone: no error")
	}
	if p := g.(gate.PolicyReporter).FailurePolicy(); p != gate.FailClosed {
		t.Fatalf("failure policy %v, want closed", p)
	}
}

func TestParams(t *testing.T) {
	tests := []struct {
		name, params, wantErr string
		env                   gate.Env
	}{
		{"minimal", `{"address":"127.0.0.1:1","control_key":"k"}`, "", gate.Env{Pool: "p"}},
		{"address from REDIS_URL", `{"control_key":"k","pool_id":"p"}`, "", gate.Env{RedisURL: "redis://127.0.0.1:1/0"}},
		{"no address", `{"control_key":"k","pool_id":"p"}`, "gate_params.address is required", gate.Env{}},
		{"no control key", `{"address":"127.0.0.1:1"}`, "gate_params.control_key is required", gate.Env{Pool: "p"}},
		{"no pool", `{"address":"127.0.0.1:1","control_key":"k"}`, "pool_id is empty", gate.Env{}},
		{"burst 0", `{"address":"127.0.0.1:1","control_key":"k","burst_seconds":0}`, "burst_seconds", gate.Env{Pool: "p"}},
		{"burst negative", `{"address":"127.0.0.1:1","control_key":"k","burst_seconds":-1}`, "burst_seconds", gate.Env{Pool: "p"}},
		{"burst text", `{"address":"127.0.0.1:1","control_key":"k","burst_seconds":"lots"}`, "burst_seconds", gate.Env{Pool: "p"}},
		{"cluster: keys in two slots", `{"address":"127.0.0.1:1","redis_mode":"cluster","control_key":"k"}`, "different hash slots", gate.Env{Pool: "p"}},
		{"cluster: one hash tag", `{"address":"127.0.0.1:1","redis_mode":"cluster","control_key":"{k}","state_key":"{k}:state"}`, "", gate.Env{Pool: "p"}},
		{"unknown param", `{"address":"127.0.0.1:1","control_key":"k","rate":5}`, "unknown gate_params: rate", gate.Env{Pool: "p"}},
		{"sentinel", `{"address":"127.0.0.1:1","redis_mode":"sentinel","redis_master_name":"m","redis_addrs":["127.0.0.1:2"],"control_key":"k"}`, "", gate.Env{Pool: "p"}},
		{"sentinel from the deployment", `{"control_key":"k"}`, "",
			gate.Env{Pool: "p", RedisURL: "redis://127.0.0.1:1/0", RedisMode: "sentinel", RedisMasterName: "m"}},
		{"sentinel without master name", `{"address":"127.0.0.1:1","redis_mode":"sentinel","control_key":"k"}`, "needs master_name", gate.Env{Pool: "p"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := build(t, tt.params, tt.env)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	r, c := startRedis(t)
	far := time.Now().Add(time.Hour)
	control(t, c, "conf", validLease("1000000", far))
	gatetest.Run(t, func(t testing.TB) gate.Gate {
		return mustBuild(t, `{"address":"`+r.URL+`","control_key":"conf"}`, gate.Env{Pool: "pool-a"})
	}, gatetest.Features{
		Levels: []float64{0, 1, 0, 1},
		Set: func(t testing.TB, b float64) {
			rps := "1000000"
			if b < 0.5 {
				rps = "0" // paused
			}
			if err := c.HSet(context.Background(), "conf", "max_admission_rps", rps).Err(); err != nil {
				t.Fatal(err)
			}
		},
		Failing: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"address":"127.0.0.1:`+strconv.Itoa(testenv.FreePort(t))+`","control_key":"conf"}`, gate.Env{Pool: "pool-a"})
		},
		Hanging: func(t testing.TB) gate.Gate {
			return mustBuild(t, `{"address":"`+silentServer(t)+`","control_key":"conf"}`, gate.Env{Pool: "pool-a"})
		},
	})
}

// silentServer accepts connections and never answers.
func silentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}
