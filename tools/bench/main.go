// Command bench runs sluice's benchmark scenarios and prints one line per
// scenario: `BENCH <scenario> key=value ...`. `make bench` runs them all;
// `go run ./tools/bench -only core,redis-sortedset` runs some.
//
// Each scenario declares its targets beside it (targets.go has the types):
// after a scenario's BENCH line the bench prints one
// `MISS <scenario> key=value target=<op><bound>` line per figure that missed
// its target, and exits non-zero when any figure missed (unless -no-fail) or
// any scenario failed.
//
// Figures are medians where a scenario repeats (see -runs); this machine is
// small and noisy, so compare ratios measured in the same run, not absolute
// numbers across runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-io/sluice/tools/internal/names"
)

// scenario is one benchmark scenario. run returns its figures; targets
// are what its figures must be (or, marked reported, a figure held to no
// bound, said so explicitly).
type scenario struct {
	name    string
	run     func(ctx context.Context, o options) (figures, error)
	targets []target
}

// figures are a scenario's results, printed in key order.
type figures map[string]float64

// options are the flags every scenario may read.
type options struct {
	runs int
}

// scenarios lists every scenario, in the order `make bench` runs them.
// Add a scenario by adding a line here (explicit registration), with its
// targets declared beside it in its own file.
func scenarios() []scenario {
	all := []scenario{
		{"core", runCore, coreTargets()},
		{"memory", runMemory, memoryTargets()},
		{"redis-sortedset", runRedisSortedSet, redisSortedSetTargets()},
		{"redis-sortedset-envelope", runRedisEnvelope, redisEnvelopeTargets()},
		{"redis-instructions", runRedisInstructions, redisInstructionsTargets()},
		{"redis-cluster", runRedisCluster, redisClusterTargets()},
		{"overhead", runOverhead, overheadTargets()},
	}
	all = append(all, transportScenarios()...)
	all = append(all, brokerScenarios()...)
	return append(all,
		scenario{"gate-reaction", runGateReaction, gateReactionTargets()},
		scenario{"no-herd", runNoHerd, noHerdTargets()},
		scenario{"concurrency", runConcurrency, concurrencyTargets()},
		scenario{"concurrency-h2c", runConcurrencyH2C, concurrencyH2CTargets()},
		scenario{"concurrency-auto", runConcurrencyAuto, concurrencyH2CTargets()},
		scenario{"flow-control", runFlowControl, flowControlTargets()},
		scenario{ipScenario, runInteractiveProtection, ipTargets()},
		scenario{frontierScenario, runInteractiveFrontier, frontierTargets()},
		scenario{"ordering", runOrdering, orderingTargets()},
		scenario{"plugin-gate", runPluginGate, pluginGateTargets()},
		scenario{"binary", runBinary, binaryTargets()},
		scenario{"batch-api", runBatchAPI, batchAPITargets()},
	)
}

const usage = `usage: go run ./tools/bench [flags]

Runs sluice's benchmark scenarios (all of them, or those -only names) and
prints one line per scenario:

  BENCH <scenario> key=value ...

then, for each figure that missed the target the scenario declares,

  MISS <scenario> key=value target=<op><bound>

(value "absent" when the scenario did not print the figure; bound is the
number compared with, another figure's value for targets such as
max_inflight <= limit). A scenario that fails prints BENCH <scenario>
error="..." and counts as a failure, never as a skip.

Exit status: 1 when any scenario failed, or any figure missed its target
(unless -no-fail); 2 for bad flags; 0 otherwise.

Flags:
`

func main() {
	if spec := os.Getenv(gatewayChildEnv); spec != "" {
		if err := runGatewayChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench gateway:", err)
			os.Exit(1)
		}
		return
	}
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), usage)
		flag.PrintDefaults()
	}
	only := flag.String("only", "", "comma-separated scenarios to run (default all)")
	runs := flag.Int("runs", 3, "repetitions per scenario where it repeats (median reported; at least 1)")
	timeout := flag.Duration("timeout", 30*time.Minute, "give up after this long")
	list := flag.Bool("list", false, "list the scenarios and exit")
	listTargets := flag.Bool("targets", false, "print every scenario's targets as docs/benchmarks.md's table and exit")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof), to find per-message costs")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole run to this file at the end (go tool pprof -sample_index=alloc_space), to find per-message allocations")
	noFail := flag.Bool("no-fail", false, "print MISS lines but exit 0 when figures miss their targets (exploratory runs); a scenario that fails still exits 1")
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintf(os.Stderr, "bench: -runs %d: want at least 1\n", *runs)
		os.Exit(2)
	}
	if *timeout <= 0 {
		fmt.Fprintf(os.Stderr, "bench: -timeout %s: want a positive duration\n", *timeout)
		os.Exit(2)
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "bench: unexpected arguments %q (use -only)\n", flag.Args())
		os.Exit(2)
	}

	stopProfile := func() {}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: -cpuprofile: %v\n", err)
			os.Exit(2)
		}
		defer stop() // the early returns; os.Exit below skips defers
		stopProfile = stop
	}
	if *memProfile != "" {
		runtime.MemProfileRate = 4096 // finer than the default, for per-message counts
		stopCPU := stopProfile
		stopProfile = sync.OnceFunc(func() {
			stopCPU()
			if err := writeHeapProfile(*memProfile); err != nil {
				fmt.Fprintf(os.Stderr, "bench: -memprofile: %v\n", err)
			}
		})
		defer stopProfile() // the early returns; os.Exit below skips defers
	}
	all := scenarios()
	if *list {
		for _, s := range all {
			fmt.Println(s.name)
		}
		return
	}
	if *listTargets {
		fmt.Print(targetsTable(all))
		return
	}
	want := names.Set(*only)
	known := make([]string, len(all))
	for i, s := range all {
		known[i] = s.name
	}
	if u := names.Unknown(want, known); len(u) > 0 {
		fmt.Fprintf(os.Stderr, "bench: unknown scenario %q (use -list)\n", u[0])
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	// A child process of the concurrency scenarios measures one side of
	// one run: its figures are the parent's to check.
	child := os.Getenv(childEnv) != ""
	failed, misses := runScenarios(ctx, os.Stdout, os.Stderr, all, want, options{runs: *runs}, !child)
	if !child {
		fmt.Fprintf(os.Stderr, "bench: %d failed, %d missed their targets\n", failed, misses)
	}
	stopProfile()
	os.Exit(exitCode(failed, misses, *noFail))
}

// runScenarios runs the scenarios of all that want names (every one when
// want is empty), printing each one's BENCH line to out and, when check is
// set, its MISS lines; progress goes to log. It returns how many scenarios
// failed and how many figures missed their targets.
func runScenarios(ctx context.Context, out, log io.Writer, all []scenario, want map[string]bool, o options, check bool) (failed, misses int) {
	for _, s := range all {
		if len(want) > 0 && !want[s.name] {
			continue
		}
		start := time.Now()
		f, err := s.run(ctx, o)
		if err != nil {
			failed++
			fmt.Fprintf(out, "BENCH %s error=%q\n", s.name, err.Error())
			continue
		}
		fmt.Fprintln(out, format(s.name, f))
		if check {
			misses += report(out, s.name, s.targets, f)
		}
		fmt.Fprintf(log, "bench: %s took %s\n", s.name, time.Since(start).Round(time.Millisecond))
	}
	return failed, misses
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
		b.WriteString(formatValue(f[k]))
	}
	return b.String()
}

// median returns the median of xs (0 when empty; xs is not changed, so
// that runs stay paired by index for medianRatio).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
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

// startCPUProfile profiles the process into path until stop is called.
// writeHeapProfile writes the allocations so far (alloc_space and
// alloc_objects count every allocation of the run, freed or not).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
