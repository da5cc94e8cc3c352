// Command bench runs sluice's benchmark scenarios and prints one line per
// scenario: `BENCH <scenario> key=value ...`. `make bench` runs them all;
// `go run ./tools/bench -only core,redis-sortedset` runs some.
//
// Figures are medians where a scenario repeats (see -runs); this machine is
// small and noisy, so compare ratios measured in the same run, not absolute
// numbers across runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// scenario is one benchmark scenario. run returns its figures.
type scenario struct {
	name string
	run  func(ctx context.Context, o options) (figures, error)
}

// figures are a scenario's results, printed in key order.
type figures map[string]float64

// options are the flags every scenario may read.
type options struct {
	runs int
}

// scenarios lists every scenario, in the order `make bench` runs them.
// Add a scenario by adding a line here (explicit registration).
func scenarios() []scenario {
	all := []scenario{
		{"core", runCore},
		{"memory", runMemory},
		{"redis-sortedset", runRedisSortedSet},
		{"redis-cluster", runRedisCluster},
		{"overhead", runOverhead},
	}
	all = append(all, transportScenarios()...)
	all = append(all, brokerScenarios()...)
	return append(all,
		scenario{"gate-reaction", runGateReaction},
		scenario{"no-herd", runNoHerd},
		scenario{"concurrency", runConcurrency},
		scenario{"concurrency-h2c", runConcurrencyH2C},
		scenario{"concurrency-auto", runConcurrencyAuto},
		scenario{"flow-control", runFlowControl},
		scenario{ipScenario, runInteractiveProtection},
		scenario{"ordering", runOrdering},
		scenario{"plugin-gate", runPluginGate},
		scenario{"binary", runBinary},
	)
}

func main() {
	if spec := os.Getenv(gatewayChildEnv); spec != "" {
		if err := runGatewayChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench gateway:", err)
			os.Exit(1)
		}
		return
	}
	only := flag.String("only", "", "comma-separated scenarios to run (default all)")
	runs := flag.Int("runs", 3, "repetitions per scenario where it repeats (median reported)")
	timeout := flag.Duration("timeout", 30*time.Minute, "give up after this long")
	list := flag.Bool("list", false, "list the scenarios and exit")
	flag.Parse()

	all := scenarios()
	if *list {
		for _, s := range all {
			fmt.Println(s.name)
		}
		return
	}
	want := map[string]bool{}
	for _, n := range strings.Split(*only, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	for n := range want {
		found := false
		for _, s := range all {
			found = found || s.name == n
		}
		if !found {
			fmt.Fprintf(os.Stderr, "bench: unknown scenario %q (use -list)\n", n)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	failed := 0
	for _, s := range all {
		if len(want) > 0 && !want[s.name] {
			continue
		}
		start := time.Now()
		f, err := s.run(ctx, options{runs: max(1, *runs)})
		if err != nil {
			failed++
			fmt.Printf("BENCH %s error=%q\n", s.name, err.Error())
			continue
		}
		fmt.Println(format(s.name, f))
		fmt.Fprintf(os.Stderr, "bench: %s took %s\n", s.name, time.Since(start).Round(time.Millisecond))
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func format(name string, f figures) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("BENCH ")
	b.WriteString(name)
	for _, k := range keys {
		b.WriteString(" ")
		b.WriteString(k)
		b.WriteString("=")
		v := f[k]
		if v == float64(int64(v)) {
			b.WriteString(strconv.FormatInt(int64(v), 10))
		} else {
			b.WriteString(strconv.FormatFloat(v, 'f', 2, 64))
		}
	}
	return b.String()
}

// median returns the median of xs (xs is sorted in place).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// rssMB returns the process's peak resident set (VmHWM) in MiB, or 0.
// cpuSeconds is the user+system CPU time this process has used so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return tvSeconds(ru.Utime) + tvSeconds(ru.Stime)
}

// minorFaults is how many minor page faults this process has taken so far.
func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

func tvSeconds(t syscall.Timeval) float64 {
	return float64(t.Sec) + float64(t.Usec)/1e6
}

func rssMB() float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			fields := strings.Fields(line)
			if len(fields) >= 2 {
				kb, _ := strconv.ParseFloat(fields[1], 64)
				return kb / 1024
			}
		}
	}
	return 0
}
