package poolsim

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	var c Config
	c.SetDefaults()
	e, f := c.Engine, c.Front
	if c.Pods != 2 || e.MaxNumSeqs != 16 || e.MaxNumBatchedTokens != 2048 || e.BlockSize != 16 || e.KVTokens != 12288 ||
		e.ITL != 10*time.Millisecond || e.LoadFactor != 2 || e.PrefillPerToken != 50*time.Microsecond || e.PrefillOverhead != 10*time.Millisecond {
		t.Fatalf("defaults %+v are not the pool of the design notes (2 × 16 seats, 2048 tokens, 16-token blocks, 12,288 KV tokens, 10 ms, 2.0, 50 µs, 10 ms)", c)
	}
	if f.QueueDepthThreshold != 5 || f.KVCacheUtilThreshold != 0.8 || f.StalenessThreshold != 200*time.Millisecond ||
		f.RefreshInterval != 50*time.Millisecond || f.FlushInterval != 5*time.Second {
		t.Fatalf("front defaults %+v are not the EPP's", f)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config invalid: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"negative pods", func(c *Config) { c.Pods = -1 }, "pods is -1"},
		{"bad policy", func(c *Config) { c.Engine.Policy = "lifo" }, "scheduling-policy"},
		{"seat preemption without priority", func(c *Config) { c.Engine.SeatPreempt = true }, "seat-preempt needs"},
		{"prefix-aware routing without a prefix cache", func(c *Config) { c.Front.PrefixAware = true }, "prefix-aware-routing needs"},
		{"model len beyond KV", func(c *Config) { c.Engine.KVTokens = 1024; c.Engine.MaxModelLen = 2048 }, "exceeds the KV capacity"},
		{"load factor below 1", func(c *Config) { c.Engine.LoadFactor = 0.5 }, "time-factor-under-load"},
		{"jitter 1", func(c *Config) { c.Engine.StepJitter = 1 }, "step-jitter"},
		{"no chunking, model len above budget", func(c *Config) { c.Engine.DisableChunkedPrefill = true }, "chunked prefill off"},
		{"bad mode", func(c *Config) { c.Front.Mode = "gated" }, "mode is"},
		{"bad detector", func(c *Config) { c.Front.Detector = "kv" }, "detector is"},
		{"kv threshold above 1", func(c *Config) { c.Front.KVCacheUtilThreshold = 1.5 }, "kv-cache-util-threshold"},
		{"refresh slower than staleness", func(c *Config) { c.Front.RefreshInterval = time.Second }, "every pod reads stale"},
		{"holdback above ceiling", func(c *Config) { c.Front.HoldbackMin = 2 }, "holdback-min"},
		{"bad output length", func(c *Config) { c.Engine.OutputLength = "long" }, "output-length"},
		{"negative ttl", func(c *Config) { c.Front.RequestTTL = -time.Second }, "request-ttl"},
		{"bad objective class", func(c *Config) { c.Front.Objectives = map[string]Objective{"x": {Class: 7}} }, "class 7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error mentioning %q", err, tc.want)
			}
			if _, err := New(c); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestFlags(t *testing.T) {
	var c Config
	c.SetDefaults()
	fs := flag.NewFlagSet("simulate-pool", flag.ContinueOnError)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"--pods=3", "--max-num-seqs=8", "--scheduling-policy=priority", "--itl=12ms",
		"--mode=flow-control", "--objective=gold=50", "--objective=bulk=-5:batch", "--retry-after=2s"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Pods != 3 || c.Engine.MaxNumSeqs != 8 || c.Engine.Policy != PolicyPriority || c.Engine.ITL != 12*time.Millisecond ||
		c.Front.Mode != ModeFlowControl || c.Front.RetryAfter != 2*time.Second {
		t.Fatalf("flags not applied: %+v", c)
	}
	want := map[string]Objective{"gold": {50, ClassInteractive}, "bulk": {-5, ClassBatch}}
	if len(c.Front.Objectives) != 2 || c.Front.Objectives["gold"] != want["gold"] || c.Front.Objectives["bulk"] != want["bulk"] {
		t.Fatalf("objectives %v, want %v (the first --objective replaces the defaults)", c.Front.Objectives, want)
	}
	for _, bad := range []string{"--objective=gold", "--objective=gold=high", "--objective=gold=1:vip"} {
		fs := flag.NewFlagSet("simulate-pool", flag.ContinueOnError)
		fs.SetOutput(new(strings.Builder))
		var c Config
		c.RegisterFlags(fs)
		if err := fs.Parse([]string{bad}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
