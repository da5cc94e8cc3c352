package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/testenv"
)

// redisInstructionsTargets: the scenario is an instrument, not a target of
// its own (issue 26 item 9(c) names the per-message costs; the throughput
// target is redis-sortedset-envelope's).
func redisInstructionsTargets() []target {
	return []target{
		reportedOnly("redis_instructions_per_req", "instructions the Redis server executes per request for sluice's side (callgrind; runs of one build agree within about 1 %)"),
		reportedOnly("baseline_redis_instructions_per_req", "the same for the plain loop"),
		reportedOnly("redis_instructions_ratio", "sluice's Redis instructions per request against the loop's"),
	}
}

// instrRequests is how many envelopes each side drains under callgrind
// (about 50 times slower than a plain server).
const instrRequests = 10000

// runRedisInstructions counts the instructions the Redis server executes
// per request of the envelope path, for sluice's side and the plain loop's,
// the workload of redis-sortedset-envelope. Each side gets a fresh
// redis-server run under valgrind's callgrind, with collection on inside
// processCommand (the execution of every command, scripts included; the
// networking is not counted). The counters are zeroed after the queue is
// written and dumped once every result is in (callgrind_control), so the
// figure is the drain's alone.
//
// Unlike the wall-clock figures, an instruction count does not move with
// the machine's load: runs of the same build agree to about 1%, so a
// change to the scripts shows in one run. Under callgrind Redis runs
// slower than the two sides, so more requests gather into each claim and
// settle than at full speed: the per-call costs weigh a little less here.
func runRedisInstructions(ctx context.Context, o options) (figures, error) {
	valgrind, err := exec.LookPath("valgrind")
	if err != nil {
		return nil, errors.New("valgrind not found in PATH: install the Debian package \"valgrind\" (apt-get install -y valgrind)")
	}
	control, err := exec.LookPath("callgrind_control")
	if err != nil {
		return nil, errors.New("callgrind_control not found in PATH: install the Debian package \"valgrind\" (apt-get install -y valgrind)")
	}
	gw, stopGW, err := envelopeGateway()
	if err != nil {
		return nil, err
	}
	defer stopGW()
	w := newEnvelopeWorkload(instrRequests, gw)
	var sl, base []float64
	err = alternate(ctx, o.runs,
		func(ctx context.Context, _ int) error {
			ir, err := countRedisInstructions(ctx, valgrind, control, w, func(ctx context.Context, url string) (func(context.Context) error, error) {
				a, err := w.sluice(url)
				if err != nil {
					return nil, err
				}
				return a.Run, nil
			})
			if err != nil {
				return fmt.Errorf("sluice: %w", err)
			}
			sl = append(sl, ir)
			return nil
		},
		func(ctx context.Context, _ int) error {
			ir, err := countRedisInstructions(ctx, valgrind, control, w, func(ctx context.Context, url string) (func(context.Context) error, error) {
				_, pc, err := benchProducer(url)
				if err != nil {
					return nil, err
				}
				return func(ctx context.Context) error {
					defer pc.Close()
					return w.loop(ctx, pc)
				}, nil
			})
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			base = append(base, ir)
			return nil
		})
	if err != nil {
		return nil, err
	}
	return figures{
		"requests":                            instrRequests,
		"redis_instructions_per_req":          median(sl),
		"baseline_redis_instructions_per_req": median(base),
		"redis_instructions_ratio":            medianRatio(sl, base),
	}, nil
}

// countRedisInstructions drains w with the side side starts on a fresh
// redis-server under callgrind and returns the instructions executed in
// processCommand per request.
func countRedisInstructions(ctx context.Context, valgrind, control string, w envelopeWorkload,
	side func(ctx context.Context, url string) (func(context.Context) error, error)) (float64, error) {
	dir, err := os.MkdirTemp("", "sluice-callgrind-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "callgrind.out")
	r, err := testenv.StartRedisProcess(testenv.RedisOptions{Wrap: []string{valgrind, "--tool=callgrind",
		"--toggle-collect=processCommand", "--callgrind-out-file=" + out}})
	if err != nil {
		return 0, err
	}
	defer r.Stop()
	_, pc, err := benchProducer(r.URL)
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	if err := w.fill(ctx, pc); err != nil {
		return 0, err
	}
	pid := strconv.Itoa(r.PID())
	if b, err := exec.CommandContext(ctx, control, "-z", pid).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("callgrind_control -z: %v: %s", err, b)
	}
	launch, err := side(ctx, r.URL)
	if err != nil {
		return 0, err
	}
	s, err := timeRedisSide(ctx, pc, []string{w.results}, len(w.reqs), launch)
	if err != nil {
		return 0, err
	}
	if s.failed > 0 {
		return 0, fmt.Errorf("%d of %d requests failed", s.failed, len(w.reqs))
	}
	if b, err := exec.CommandContext(ctx, control, "-d", pid).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("callgrind_control -d: %v: %s", err, b)
	}
	// the first dump is out.1; its totals line is the instructions since the zeroing
	total, err := callgrindTotal(out+".1", 10*time.Second)
	if err != nil {
		return 0, err
	}
	return total / float64(len(w.reqs)), nil
}

// callgrindTotal reads the "totals:" line of a callgrind dump, waiting up
// to within for the dump to be written.
func callgrindTotal(path string, within time.Duration) (float64, error) {
	deadline := time.Now().Add(within)
	for {
		f, err := os.Open(path)
		if err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if v, ok := strings.CutPrefix(sc.Text(), "totals: "); ok {
					f.Close()
					return strconv.ParseFloat(strings.Fields(v)[0], 64)
				}
			}
			f.Close()
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no totals in callgrind dump %s", path)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
