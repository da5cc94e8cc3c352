package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/cmd/sluice/demo"
	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
)

func newDemo() *cobra.Command {
	var o demo.Options
	var asJSON, verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the embedded demo: memory queue, gateway simulator, constant gate",
		Long: `Enqueue a sample of requests with mixed deadlines (most ordinary, some already
expired, some invalid, some whose gateway call outlives their deadline, some
meeting the simulator's 429s and 5xx) into the in-memory queue, run sluice
against the built-in gateway simulator until every request has its result,
and print a summary. No server is needed.`,
		Example: "  sluice demo\n  sluice demo --requests 5000 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var progress io.Writer = cmd.ErrOrStderr()
			if asJSON {
				progress = nil
			}
			o.Progress = progress
			if verbose {
				o.Logger = app.NewLogger(config.Log{Level: "info", Format: "text"}, os.Stderr)
			}
			sum, err := demo.Run(cmd.Context(), o)
			out := cmd.OutOrStdout()
			if asJSON {
				b, _ := json.Marshal(sum)
				fmt.Fprintln(out, string(b))
			} else {
				printSummary(out, sum)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Requests, "requests", 1000, "how many requests to enqueue")
	fs.IntVar(&o.Concurrency, "concurrency", 64, "in-flight limit")
	fs.DurationVar(&o.RetryBase, "retry-base", 500*time.Millisecond, "first retry backoff (the serve default is 2s; shorter keeps the demo quick)")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.BoolVar(&asJSON, "json", false, "print the summary as one JSON object (no progress lines)")
	fs.BoolVar(&verbose, "verbose", false, "print sluice's logs")
	return cmd
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
