package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/internal/poolsim"
)

func newSimulatePool() *cobra.Command {
	var cfg poolsim.Config
	cfg.SetDefaults()
	var addr string
	var lagEvery time.Duration
	var timeline string
	preset := poolsim.PresetStress
	cmd := &cobra.Command{
		Use:   "simulate-pool",
		Short: "Run a simulated inference pool: vLLM-like engine pods behind an EPP-like front",
		Long: `Serve a pool of simulated vLLM engines (continuous batching with a token budget
per step, chunked prefill, paged KV with preemption, FCFS or priority queue,
step time growing with load) behind an EPP-like front on --addr:
/v1/completions and /v1/chat/completions (streamed or not), /metrics with the
EPP's series (pool saturation, flow-control queue, inference_pool_* averages)
and every pod's vLLM series labelled by pod, and /pods/{i}/metrics and
/pods/{i}/v1/... per pod. The front routes, detects saturation and runs in
passthrough, legacy-admission or flow-control mode. --preset chooses the pool
(stress, the default; vllm-8b-h100; vllm-8b-h100-16); the other flags given
override the preset's values. See docs/simulate-pool.md.`,
		Example: "  sluice simulate-pool --addr 127.0.0.1:8000 --mode legacy-admission --seed 1\n  sluice simulate-pool --preset vllm-8b-h100-16 --report-every 5s",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := presetConfig(cmd, preset, cfg)
			if err != nil {
				return err
			}
			pool, err := poolsim.New(cfg)
			if err != nil {
				return err
			}
			if err := pool.Start(cmd.Context()); err != nil {
				return err
			}
			url, err := pool.Listen(addr)
			if err != nil {
				_ = pool.Close()
				return err
			}
			if timeline != "" {
				f, err := os.Create(timeline)
				if err != nil {
					_ = pool.Close()
					return fmt.Errorf("--timeline: %w", err)
				}
				defer f.Close()
				stopTimeline := writeTimeline(pool, json.NewEncoder(f))
				defer stopTimeline()
			}
			c := pool.Config()
			fmt.Fprintf(cmd.OutOrStdout(), "pool simulator listening on %s (preset %s: %d pods x %d seats, mode %s, detector %s)\n",
				url, preset, c.Pods, c.Engine.MaxNumSeqs, c.Front.Mode, c.Front.Detector)
			if lagEvery > 0 {
				t := time.NewTicker(lagEvery)
				defer t.Stop()
				for {
					select {
					case <-cmd.Context().Done():
						return pool.Close()
					case <-t.C:
						l := pool.StepLag()
						fmt.Fprintf(cmd.OutOrStdout(), "steps=%d step_lag_p50_ms=%.2f step_lag_p99_ms=%.2f step_lag_max_ms=%.2f saturation=%.2f\n",
							l.Steps, ms(l.P50), ms(l.P99), ms(l.Max), pool.Saturation())
					}
				}
			}
			<-cmd.Context().Done()
			return pool.Close()
		},
	}
	gofs := flag.NewFlagSet("simulate-pool", flag.ContinueOnError)
	cfg.RegisterFlags(gofs)
	cmd.Flags().AddGoFlagSet(gofs)
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8000", "listen address of the front")
	cmd.Flags().StringVar(&preset, "preset", preset, "the pool: "+strings.Join(poolsim.PresetNames(), ", ")+" (docs/simulate-pool.md, Calibration); the other pool flags given override it")
	cmd.Flags().DurationVar(&lagEvery, "report-every", 0, "print the step lag and saturation at this interval (0: never)")
	cmd.Flags().StringVar(&timeline, "timeline", "", "write one JSON line a second to this file: saturation, KV usage, and per class running, waiting and cumulative counts")
	return cmd
}

// presetConfig is the named preset's pool with every pool flag the command
// line set applied over it (flags parsed into parsed). The stress preset is
// the flags' own defaults, so parsed is returned as it is.
func presetConfig(cmd *cobra.Command, name string, parsed poolsim.Config) (poolsim.Config, error) {
	p, err := poolsim.PresetByName(name)
	if err != nil {
		return poolsim.Config{}, fmt.Errorf("--preset: %w", err)
	}
	if name == poolsim.PresetStress {
		return parsed, nil
	}
	cfg := p.Config
	cfg.SetDefaults()
	over := flag.NewFlagSet("preset", flag.ContinueOnError)
	cfg.RegisterFlags(over)
	var setErr error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if setErr != nil || over.Lookup(f.Name) == nil {
			return
		}
		if f.Name == "objective" { // repeatable: its parsed map as a whole
			cfg.Front.Objectives = parsed.Front.Objectives
			return
		}
		if err := over.Set(f.Name, f.Value.String()); err != nil {
			setErr = fmt.Errorf("--%s over preset %s: %w", f.Name, name, err)
		}
	})
	return cfg, setErr
}

// writeTimeline encodes a pool sample every second until the returned stop
// is called.
func writeTimeline(pool *poolsim.Pool, enc *json.Encoder) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := enc.Encode(pool.Sample()); err != nil {
					fmt.Fprintln(os.Stderr, "simulate-pool: --timeline:", err)
					return
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
