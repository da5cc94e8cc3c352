package simulator

import (
	"flag"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; empty means valid
	}{
		{"zero", Config{}, ""},
		{"full", Config{Latency: LogNormal(100*time.Millisecond, time.Second), Rate429: 0.5, Rate5xx: 0.25, RateReset: 0.25,
			RetryAfter: 3 * time.Second, Status5xx: 500, Capacity: 8, Seed: 1}, ""},
		{"rate above one", Config{Rate429: 1.5}, "rate-429 is 1.5"},
		{"negative rate", Config{Rate5xx: -0.1}, "rate-5xx is -0.1"},
		{"NaN rate", Config{RateReset: math.NaN()}, "rate-reset is NaN"},
		{"sum above one", Config{Rate429: 0.5, Rate5xx: 0.4, RateReset: 0.2}, "at most 1"},
		{"negative retry-after", Config{RetryAfter: -time.Second}, "retry-after is -1s"},
		{"bad 5xx status", Config{Status5xx: 404}, "status-5xx is 404"},
		{"negative capacity", Config{Capacity: -1}, "capacity is -1"},
		{"negative fixed latency", Config{Latency: Fixed(-time.Millisecond)}, "fixed latency -1ms is negative"},
		{"uniform below zero", Config{Latency: Uniform(-time.Millisecond, time.Millisecond)}, "jitter larger"},
		{"uniform reversed", Config{Latency: Uniform(2*time.Millisecond, time.Millisecond)}, "below its minimum"},
		{"lognormal zero median", Config{Latency: LogNormal(0, time.Second)}, "median 0s must be positive"},
		{"lognormal p99 below median", Config{Latency: LogNormal(time.Second, time.Millisecond)}, "p99 1ms is below"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tt.want)
			}
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
}

func TestConfigValidateReportsAll(t *testing.T) {
	err := (&Config{Rate429: 2, Capacity: -1}).Validate()
	if err == nil || !strings.Contains(err.Error(), "rate-429") || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("Validate = %v, want both problems", err)
	}
}

func TestNewDefaults(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config()
	if c.RetryAfter != DefaultRetryAfter || c.Capacity != DefaultCapacity || c.Status5xx != DefaultStatus5xx ||
		c.MaxBodyBytes != DefaultMaxBodyBytes || c.ShutdownTimeout != DefaultShutdownTimeout {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if s.seed == 0 {
		t.Fatal("a zero seed was not replaced by a random one")
	}
}

func TestRegisterFlags(t *testing.T) {
	tests := []struct {
		args []string
		want LatencyDist
	}{
		{nil, LatencyDist{}},
		{[]string{"--latency=50ms"}, Fixed(50 * time.Millisecond)},
		{[]string{"--latency=50ms", "--latency-jitter=10ms"}, Uniform(40*time.Millisecond, 60*time.Millisecond)},
		{[]string{"--latency-jitter=10ms", "--latency=50ms"}, Uniform(40*time.Millisecond, 60*time.Millisecond)},
		{[]string{"--latency-jitter=10ms"}, Uniform(-10*time.Millisecond, 10*time.Millisecond)}, // Validate refuses it
		{[]string{"--latency=50ms", "--latency-jitter=10ms", "--latency-jitter=0s"}, Fixed(50 * time.Millisecond)},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var c Config
			fs := flag.NewFlagSet("simulate-gateway", flag.ContinueOnError)
			c.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if c.Latency != tt.want {
				t.Fatalf("Latency = %v, want %v", c.Latency, tt.want)
			}
		})
	}

	var c Config
	fs := flag.NewFlagSet("simulate-gateway", flag.ContinueOnError)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"--rate-429=0.1", "--retry-after=3s", "--rate-5xx=0.2", "--rate-reset=0.05",
		"--capacity=16", "--seed=7"})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Rate429: 0.1, RetryAfter: 3 * time.Second, Rate5xx: 0.2, RateReset: 0.05, Capacity: 16, Seed: 7}
	if c != want {
		t.Fatalf("parsed %+v, want %+v", c, want)
	}

	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		names = append(names, f.Name)
		if f.Usage == "" {
			t.Errorf("flag --%s has no help text", f.Name)
		}
	})
	wantNames := []string{"capacity", "latency", "latency-jitter", "rate-429", "rate-5xx", "rate-reset", "retry-after", "seed"}
	if !slices.Equal(names, wantNames) {
		t.Fatalf("flags %v, want %v", names, wantNames)
	}

	fs = flag.NewFlagSet("simulate-gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	(&Config{}).RegisterFlags(fs)
	for _, bad := range []string{"--latency=soon", "--latency-jitter=-1ms", "--rate-429=x"} {
		if err := fs.Parse([]string{bad}); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
	fs.PrintDefaults() // must not panic on the zero flag values
}

func TestLatencySample(t *testing.T) {
	const n = 20000
	draw := func(l LatencyDist) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			r := newRNG(1, uint64(i))
			out[i] = l.sample(&r)
		}
		slices.Sort(out)
		return out
	}
	if d := draw(LatencyDist{}); d[n-1] != 0 {
		t.Fatalf("zero distribution drew %v", d[n-1])
	}
	if d := draw(Fixed(7 * time.Millisecond)); d[0] != 7*time.Millisecond || d[n-1] != 7*time.Millisecond {
		t.Fatalf("fixed drew %v..%v", d[0], d[n-1])
	}
	d := draw(Uniform(10*time.Millisecond, 20*time.Millisecond))
	if d[0] < 10*time.Millisecond || d[n-1] > 20*time.Millisecond {
		t.Fatalf("uniform drew %v..%v outside its range", d[0], d[n-1])
	}
	if med := d[n/2]; med < 14*time.Millisecond || med > 16*time.Millisecond {
		t.Fatalf("uniform median %v, want about 15ms", med)
	}
	d = draw(LogNormal(100*time.Millisecond, time.Second))
	if med := d[n/2]; med < 90*time.Millisecond || med > 110*time.Millisecond {
		t.Fatalf("log-normal median %v, want about 100ms", med)
	}
	if p99 := d[n*99/100]; p99 < 800*time.Millisecond || p99 > 1250*time.Millisecond {
		t.Fatalf("log-normal p99 %v, want about 1s", p99)
	}
	if d[0] <= 0 {
		t.Fatalf("log-normal drew %v", d[0])
	}
}

func TestLatencyString(t *testing.T) {
	for l, want := range map[LatencyDist]string{
		{}:                             "none",
		Fixed(time.Second):             "fixed(1s)",
		Uniform(time.Millisecond, 2e6): "uniform(1ms,2ms)",
		LogNormal(time.Second, 2e9):    "lognormal(median=1s,p99=2s)",
	} {
		if got := l.String(); got != want {
			t.Errorf("String = %q, want %q", got, want)
		}
	}
}
