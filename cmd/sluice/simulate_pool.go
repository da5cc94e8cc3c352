package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/poolsim"
)

func newSimulatePool() *cobra.Command {
	var cfg poolsim.Config
	cfg.SetDefaults()
	var addr string
	var lagEvery time.Duration
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
passthrough, legacy-admission or flow-control mode. See docs/simulate-pool.md.`,
		Example: "  sluice simulate-pool --addr 127.0.0.1:8000 --mode legacy-admission --seed 1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			c := pool.Config()
			fmt.Fprintf(cmd.OutOrStdout(), "pool simulator listening on %s (%d pods x %d seats, mode %s, detector %s)\n",
				url, c.Pods, c.Engine.MaxNumSeqs, c.Front.Mode, c.Front.Detector)
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
	cmd.Flags().DurationVar(&lagEvery, "report-every", 0, "print the step lag and saturation at this interval (0: never)")
	return cmd
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
