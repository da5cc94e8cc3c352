package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/cmd/sluice/demo"
	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/internal/poolsim"
)

func newDemo() *cobra.Command {
	var o demo.Options
	var po demo.PoolOptions
	var asJSON, verbose bool
	var mode string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the embedded demo: a batch through sluice beside interactive traffic on a simulated pool",
		Long: `With no flags (--mode purpose): what sluice is for. A simulated inference pool
(two vLLM-like pods of 16 seats behind an EPP-like front) serves interactive
traffic, first alone (its floor), then in bursts while sluice sends a batch
through the pool-headroom gate with evict and resume: it reads every pod's
own gauges each 50 ms, keeps 4 seats free, takes batch requests back when
a burst eats them and, while a burst is on, lets the batch grow by at most
one request per reading; a request taken back continues later from the
tokens it had made. One line a
second shows interactive TTFT p99 against the floor, the batch's progress and
sluice's in-flight limit; a table closes the run. --ungated runs the same
batch without a gate, to show what the gate prevents.

--preset chooses the pool, as sluice simulate-pool --preset does: stress
(the default, above), vllm-8b-h100 (vLLM's defaults on an H100: 1,024
seats a pod, 8,192 tokens a step; what make run shows) or vllm-8b-h100-16.
On the vLLM presets the interactive rates scale with the pool (×20, ×3.8)
and the gate dispatches to the pods itself (dispatch "pods": every rule
per pod, no batch placed where an interactive request waits) with
kv_limit 0.7; the live line and the table then say, per pod, what the
batch holds (in flight / limit).

--mode mechanics: enqueue a sample of requests with mixed deadlines (most
ordinary, some already expired, some invalid, some whose gateway call
outlives their deadline, some meeting the simulator's 429s and 5xx) into the
in-memory queue, run sluice against the fixed-latency gateway simulator until
every request has its result, and print a summary.

No server is needed for either.`,
		Example: "  sluice demo\n  sluice demo --preset vllm-8b-h100\n  sluice demo --ungated\n  sluice demo --mode mechanics --requests 5000 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var progress io.Writer = cmd.ErrOrStderr()
			if asJSON {
				progress = nil
			}
			var logger *slog.Logger
			if verbose {
				logger = app.NewLogger(config.Log{Level: "info", Format: "text"}, os.Stderr)
			}
			out := cmd.OutOrStdout()
			switch mode {
			case "purpose":
				if _, err := poolsim.PresetByName(po.Preset); err != nil {
					return fmt.Errorf("--preset: %w", err)
				}
				po.Progress, po.Logger = progress, logger
				sum, err := demo.RunPool(cmd.Context(), po)
				if asJSON {
					b, _ := json.Marshal(sum)
					fmt.Fprintln(out, string(b))
				} else {
					printPoolSummary(out, sum)
				}
				return err
			case "mechanics":
				o.Progress, o.Logger = progress, logger
				sum, err := demo.Run(cmd.Context(), o)
				if asJSON {
					b, _ := json.Marshal(sum)
					fmt.Fprintln(out, string(b))
				} else {
					printSummary(out, sum)
				}
				return err
			}
			return fmt.Errorf("--mode %q: want purpose or mechanics", mode)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&mode, "mode", "purpose", "purpose (a batch beside interactive traffic on a simulated pool) or mechanics (mixed deadlines, retries, exactly one result each)")
	fs.StringVar(&po.Preset, "preset", poolsim.PresetStress, "purpose: the simulated pool: "+strings.Join(poolsim.PresetNames(), ", ")+" (as simulate-pool --preset)")
	fs.IntVar(&po.Batch, "batch", 0, "purpose: how many batch requests (0: 160, or 600 on the vLLM presets)")
	fs.BoolVar(&po.Ungated, "ungated", false, "purpose: send the batch without a gate (constant budget 1)")
	fs.IntVar(&o.Requests, "requests", 1000, "mechanics: how many requests to enqueue")
	fs.IntVar(&o.Concurrency, "concurrency", 64, "mechanics: in-flight limit")
	fs.DurationVar(&o.RetryBase, "retry-base", 500*time.Millisecond, "mechanics: first retry backoff (the serve default is 2s; shorter keeps the demo quick)")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "mechanics: give up after this long")
	fs.BoolVar(&asJSON, "json", false, "print the summary as one JSON object (no progress lines)")
	fs.BoolVar(&verbose, "verbose", false, "print sluice's logs")
	return cmd
}

func printPoolSummary(w io.Writer, s demo.PoolSummary) {
	fmt.Fprintf(w, "\nsluice demo: a batch beside interactive traffic (pool %s, %d pods × %d seats; gate %s)\n", s.Preset, s.Pods, s.SeatsPerPod, s.Gate)
	fmt.Fprintf(w, "  %-34s %9s %9s %8s\n", "interactive TTFT", "p50", "p99", "p99/floor")
	fmt.Fprintf(w, "  %-34s %6.0f ms %6.0f ms %7.1f×\n", "alone (the floor)", s.FloorP50Ms, s.FloorP99Ms, 1.0)
	fmt.Fprintf(w, "  %-34s %6.0f ms %6.0f ms %7.1f×\n", "in bursts, beside the batch", s.BurstP50Ms, s.BurstP99Ms, s.P99Ratio)
	fmt.Fprintf(w, "  interactive requests that failed   %d\n", s.InteractiveErrors)
	rate := 0.0
	if s.BatchSeconds > 0 {
		rate = float64(s.BatchTokens) / s.BatchSeconds
	}
	fmt.Fprintf(w, "  batch: %d requests, %d ok, %d failed, %d missing, %d duplicated; %d tokens in %.1fs (%.0f tokens/s)\n",
		s.Batch, s.BatchOK, s.BatchFailed, s.Missing, s.Duplicates, s.BatchTokens, s.BatchSeconds, rate)
	fmt.Fprintf(w, "  sluice took back %d batch calls for the gate (evicted: aborted, re-queued, resumed from the tokens they had made; %d tokens kept, %d prompt tokens served by the pods' prefix caches)\n", s.Evicted, s.ResumedTokens, s.PrefixHitTokens)
	if len(s.PerPod) > 0 {
		fmt.Fprintf(w, "  batch per pod (the gate's readings each second: in flight / limit, means)\n")
		fmt.Fprintf(w, "  %-34s %15s %15s %8s\n", "pod", "in bursts", "between them", "most")
		for _, p := range s.PerPod {
			fmt.Fprintf(w, "  %-34s %7.1f / %-5.0f %7.1f / %-5.0f %8d\n", p.Pod, p.BurstInFlight, p.BurstLimit, p.IdleInFlight, p.IdleLimit, p.MaxInFlight)
		}
	}
	if s.Rejections > 0 {
		fmt.Fprintf(w, "  front refused %d batch requests (429 rejected-saturated; each came back after backoff)\n", s.Rejections)
	}
	if s.StepLagP99Ms > 20 {
		fmt.Fprintf(w, "  note: the simulator's steps ran up to %.0f ms late (p99): this machine was busy, so the TTFT figures are pessimistic\n", s.StepLagP99Ms)
	}
}

func printSummary(w io.Writer, s demo.Summary) {
	fmt.Fprintf(w, "\nsluice demo: %d requests, %d results in %.2fs (%.0f results/s)\n", s.Requests, s.Results, s.Seconds, s.Throughput)
	fmt.Fprintf(w, "  succeeded          %6d\n", s.Succeeded)
	fmt.Fprintf(w, "  deadline exceeded  %6d  (expired in the queue, or the gateway outlived the deadline)\n", s.DeadlineExceeded)
	fmt.Fprintf(w, "  invalid            %6d  (INVALID_REQUEST results)\n", s.Invalid)
	fmt.Fprintf(w, "  failed             %6d\n", s.Failed)
	fmt.Fprintf(w, "  retries            %6d  (gateway answered %d × 429 and %d × 5xx)\n", s.Retries, s.Gateway429, s.Gateway5xx)
	fmt.Fprintf(w, "  missing/duplicate  %6d / %d\n", s.Missing, s.Duplicates)
}
