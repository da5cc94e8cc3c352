package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/internal/simulator"
)

// batchDemoOptions are `sluice batch demo`'s flags.
type batchDemoOptions struct {
	lines    int
	dir      string
	latency  time.Duration
	interval time.Duration
}

func newBatchDemo() *cobra.Command {
	var o batchDemoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run one small OpenAI batch through an embedded sluice; print where its output is",
		Long: `Start an embedded sluice (memory queue) with the Batch API on a free local
port and a gateway simulator, write a JSONL file of --lines chat completions,
submit it with OpenAI's Go client as "sluice batch submit --wait" does, and
print where the output file is. No server is needed; everything it wrote is
in --dir (default: a new temporary directory).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBatchDemo(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.lines, "lines", 20, "how many requests the batch holds (1 to 50000)")
	fs.StringVar(&o.dir, "dir", "", "where the input, output, state and files go (default: a new temporary directory)")
	fs.DurationVar(&o.latency, "latency", 100*time.Millisecond, "the simulated gateway's latency per request")
	fs.DurationVar(&o.interval, "interval", 250*time.Millisecond, "how often to poll the batch")
	return cmd
}

// runBatchDemo is `sluice batch demo`.
func runBatchDemo(ctx context.Context, o batchDemoOptions, out, errw io.Writer) error {
	switch {
	case o.lines < 1 || o.lines > 50000:
		return fmt.Errorf("--lines %d: want 1 to 50000", o.lines)
	case o.latency < 0:
		return fmt.Errorf("--latency %s: must not be negative", o.latency)
	case o.interval <= 0:
		return fmt.Errorf("--interval %s: must be positive", o.interval)
	}
	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "sluice-batch-demo-")
		if err != nil {
			return err
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--dir: %w", err)
	}
	sim, err := simulator.New(simulator.Config{Latency: simulator.Fixed(o.latency)})
	if err != nil {
		return err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("gateway simulator: %w", err)
	}
	defer func() { _ = sim.Close() }()

	doc := map[string]any{
		"transport":    "memory",
		"concurrency":  4,
		"metrics_port": -1,
		"health_port":  -1,
		"transport_config": map[string]any{
			"result_queue_name": "results",
			"queues":            []any{map[string]any{"id": "batch", "queue_name": "batch", "igw_base_url": gw}},
		},
		"batch_api": map[string]any{
			"enabled": true,
			"listen":  "127.0.0.1:0",
			"queue":   "batch",
			"files":   map[string]any{"store": "disk", "dir": filepath.Join(dir, "files")},
			"state":   map[string]any{"store": "bolt", "path": filepath.Join(dir, "state.db")},
		},
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	cfg, err := config.Parse(raw, "batch demo config")
	if err != nil {
		return err
	}
	ad, err := adapters()
	if err != nil {
		return err
	}
	if err := app.Check(cfg, ad); err != nil {
		return err
	}
	log := app.NewLogger(config.Log{Level: "error", Format: "text"}, os.Stderr)
	opts := app.Options{Adapters: ad, Logger: log, Version: version}
	fr, tr, err := newFronts(cfg, ad, log)
	if err != nil {
		return err
	}
	opts.Transport = tr
	a, err := app.New(cfg, opts)
	if err != nil {
		fr.close()
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- runWithFronts(runCtx, a, fr) }()
	stopServe := func() error {
		stop()
		return <-served
	}

	api := "http://" + fr.batch.ln.Addr().String()
	input := filepath.Join(dir, "input.jsonl")
	var b bytes.Buffer
	for i := range o.lines {
		fmt.Fprintf(&b, `{"custom_id":"request-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"demo-model","messages":[{"role":"user","content":"Say hello to number %d."}],"max_tokens":16}}`+"\n", i+1, i+1)
	}
	if err := os.WriteFile(input, b.Bytes(), 0o644); err != nil {
		_ = stopServe()
		return err
	}
	fmt.Fprintf(out, "sluice batch demo: an embedded sluice (memory queue, gateway simulator at %s) serving the Batch API at %s\n", gw, api)
	fmt.Fprintf(out, "input: %s (%d chat completions)\n", input, o.lines)
	c, err := newBatchClient(api)
	if err != nil {
		_ = stopServe()
		return err
	}
	start := time.Now()
	job, err := c.submit(ctx, input, "/v1/chat/completions", "24h", map[string]string{"made_by": "sluice batch demo"})
	if err == nil {
		fmt.Fprintln(out, "batch:", job.ID)
		err = c.waitAndDownload(ctx, job, dir, o.interval, out, errw)
	}
	if serr := stopServe(); err == nil && serr != nil {
		err = fmt.Errorf("embedded sluice: %w", serr)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "done in %.1fs; the output is in %s (the same with your own file: sluice serve --config examples/batch-api/sluice.json, then sluice batch submit FILE --wait)\n",
		time.Since(start).Seconds(), filepath.Join(dir, job.ID+"_output.jsonl"))
	return nil
}
