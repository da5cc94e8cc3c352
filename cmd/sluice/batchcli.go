package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
)

// defaultBatchAPI is where `sluice batch` looks for the Batch API: the
// batch_api section's default listen address.
const defaultBatchAPI = "http://127.0.0.1:8090"

// submitOptions are `sluice batch submit`'s flags.
type submitOptions struct {
	wait     bool
	endpoint string
	window   string
	metadata []string
	out      string
	interval time.Duration
}

func newBatchCmd() *cobra.Command {
	var api string
	cmd := &cobra.Command{
		Use:   "batch",
		Short: "Submit, watch, cancel and download OpenAI batches on a running Batch API",
		Long: `Talk to the OpenAI Batch API that "sluice serve" serves when its batch_api
section is enabled (docs/batch.md), or any OpenAI Batch API. --api is its
base URL (default ` + defaultBatchAPI + `, batch_api.listen's default).

"sluice batch demo" needs no server: it starts an embedded sluice with the
Batch API and a gateway simulator and runs one small batch through it.`,
		Example: `  sluice batch submit requests.jsonl --wait
  sluice batch status batch_0123
  sluice batch list
  sluice batch download batch_0123 --out results/
  sluice batch demo`,
	}
	cmd.PersistentFlags().StringVar(&api, "api", defaultBatchAPI, "the Batch API's base URL")
	client := func() (*batchClient, error) { return newBatchClient(api) }
	cmd.AddCommand(newBatchSubmit(client), newBatchStatus(client), newBatchCancel(client), newBatchDownload(client), newBatchList(client), newBatchDemo())
	return cmd
}

func newBatchSubmit(client func() (*batchClient, error)) *cobra.Command {
	var o submitOptions
	cmd := &cobra.Command{
		Use:   "submit FILE",
		Short: "Upload a JSONL file of requests and create a batch; print its id",
		Long: `Upload FILE (purpose=batch: one {"custom_id","method","url","body"} line per
request) and create a batch of it; print the batch id. With --wait, follow the
batch to its end (a progress bar with ETA on a terminal, a progress line every
few seconds otherwise, on stderr), download its output and error files next to
FILE (or into --out) and print their paths. The exit status is 1 when the batch
failed, expired or was cancelled (the partial output is downloaded first).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			meta, err := parseMetadata(o.metadata)
			if err != nil {
				return err
			}
			if o.interval <= 0 {
				return fmt.Errorf("--interval %s: must be positive", o.interval)
			}
			c, err := client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			b, err := c.submit(ctx, args[0], o.endpoint, o.window, meta)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), b.ID)
			if !o.wait {
				return nil
			}
			out := o.out
			if out == "" {
				out = filepath.Dir(args[0])
			}
			return c.waitAndDownload(ctx, b, out, o.interval, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	fs.BoolVar(&o.wait, "wait", false, "wait for the batch to end, then download its output and error files")
	fs.StringVar(&o.endpoint, "endpoint", "/v1/chat/completions", "the batch's endpoint: every line's url")
	fs.StringVar(&o.window, "completion-window", "24h", "the batch's completion window (one of batch_api.completion_windows)")
	fs.StringArrayVar(&o.metadata, "metadata", nil, "a metadata pair key=value (repeatable, at most 16)")
	fs.StringVar(&o.out, "out", "", "--wait: the directory for the output and error files (default: FILE's)")
	fs.DurationVar(&o.interval, "interval", time.Second, "--wait: how often to poll the batch")
	return cmd
}

// parseMetadata reads --metadata key=value pairs.
func parseMetadata(pairs []string) (map[string]string, error) {
	if len(pairs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--metadata %q: want key=value", p)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("--metadata: key %q given twice", k)
		}
		m[k] = v
	}
	return m, nil
}

// submit uploads path and creates a batch of it.
func (c *batchClient) submit(ctx context.Context, path, endpoint, window string, meta map[string]string) (*batchObject, error) {
	fileID, err := c.uploadFile(ctx, path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return nil, err
		}
		return nil, c.explain("upload "+path, err)
	}
	b, err := c.createBatch(ctx, fileID, endpoint, window, meta)
	if err != nil {
		return nil, c.explain("create batch", err)
	}
	return b, nil
}

// finalStatus reports whether a batch with status s has ended.
func finalStatus(s string) bool {
	switch s {
	case batchCompleted, batchFailed, batchExpired, batchCancelled:
		return true
	}
	return false
}

// waitAndDownload polls b until it ends, showing its progress on errw,
// downloads its files into dir, prints their paths on out, and returns an
// error unless it completed.
func (c *batchClient) waitAndDownload(ctx context.Context, b *batchObject, dir string, interval time.Duration, out, errw io.Writer) error {
	pr := newProgress(errw)
	t := time.NewTicker(interval)
	defer t.Stop()
	for !finalStatus(b.Status) {
		pr.show(b)
		select {
		case <-ctx.Done():
			pr.done()
			return fmt.Errorf("stopped waiting for %s (%s): %w; it goes on, see `sluice batch status %s`", b.ID, b.Status, ctx.Err(), b.ID)
		case <-t.C:
		}
		nb, err := c.getBatch(ctx, b.ID)
		if err != nil {
			pr.done()
			return c.explain("get batch "+b.ID, err)
		}
		b = nb
	}
	pr.show(b)
	pr.done()
	if err := c.download(ctx, b, dir, out); err != nil {
		return err
	}
	return batchOutcome(b)
}

// batchOutcome is nil for a completed batch and says why otherwise.
func batchOutcome(b *batchObject) error {
	rc := b.RequestCounts
	switch b.Status {
	case batchCompleted:
		return nil
	case batchFailed:
		var why []string
		for i, e := range b.Errors.Data {
			if i == 5 {
				why = append(why, fmt.Sprintf("… %d more", len(b.Errors.Data)-i))
				break
			}
			s := e.Code + ": " + e.Message
			if e.Line > 0 {
				s = fmt.Sprintf("line %d: %s", e.Line, s)
			}
			why = append(why, s)
		}
		if len(why) == 0 {
			return fmt.Errorf("batch %s failed", b.ID)
		}
		return fmt.Errorf("batch %s failed:\n  %s", b.ID, strings.Join(why, "\n  "))
	case batchExpired:
		return fmt.Errorf("batch %s expired: %d of %d requests answered in its %s window (the partial output is downloaded)", b.ID, rc.Completed, rc.Total, b.CompletionWindow)
	case batchCancelled:
		return fmt.Errorf("batch %s was cancelled: %d of %d requests answered (the partial output is downloaded)", b.ID, rc.Completed, rc.Total)
	}
	return fmt.Errorf("batch %s is %s", b.ID, b.Status)
}

// download writes b's output and error files into dir as
// <batch id>_output.jsonl and <batch id>_error.jsonl and prints their paths.
func (c *batchClient) download(ctx context.Context, b *batchObject, dir string, out io.Writer) error {
	if !finalStatus(b.Status) && b.OutputFileID == "" && b.ErrorFileID == "" {
		return fmt.Errorf("batch %s is %s: no output yet (`sluice batch submit --wait` waits for it)", b.ID, b.Status)
	}
	if b.OutputFileID == "" && b.ErrorFileID == "" {
		fmt.Fprintf(out, "batch %s (%s) has no output file\n", b.ID, b.Status)
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	for _, f := range []struct{ id, name string }{{b.OutputFileID, "output"}, {b.ErrorFileID, "error"}} {
		if f.id == "" {
			continue
		}
		path := filepath.Join(dir, b.ID+"_"+f.name+".jsonl")
		n, err := c.fetch(ctx, f.id, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s file: %s (%d lines)\n", f.name, path, n)
	}
	return nil
}

// fetch writes the content of file id to path (through a temporary file,
// so no half file is left under path) and returns its line count.
func (c *batchClient) fetch(ctx context.Context, id, path string) (int, error) {
	body, err := c.fileContent(ctx, id)
	if err != nil {
		return 0, c.explain("download "+id, err)
	}
	defer body.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return 0, err
	}
	lc := &lineCounter{w: tmp}
	_, err = io.Copy(lc, body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return 0, fmt.Errorf("download %s to %s: %w", id, path, err)
	}
	return lc.n, nil
}

// lineCounter counts the newlines written through it.
type lineCounter struct {
	w io.Writer
	n int
}

func (l *lineCounter) Write(p []byte) (int, error) {
	for _, c := range p {
		if c == '\n' {
			l.n++
		}
	}
	return l.w.Write(p)
}

// progress shows a batch's progress: a redrawn bar with an ETA on a
// terminal, a plain line on a change of status or at most every
// plainEvery otherwise.
type progress struct {
	w        io.Writer
	tty      bool
	start    time.Time // when the batch was first seen in progress
	done0    int64     // lines answered then
	lastLine time.Time
	last     string
	drawn    bool
}

// plainEvery is how often a plain progress line repeats without a status change.
const plainEvery = 5 * time.Second

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))}
}

func (p *progress) show(b *batchObject) {
	rc := b.RequestCounts
	answered := rc.Completed + rc.Failed
	now := time.Now()
	if b.Status == batchInProgress && p.start.IsZero() {
		p.start, p.done0 = now, answered
	}
	eta := ""
	if b.Status == batchInProgress && rc.Total > 0 {
		eta = "ETA ?"
		if el := now.Sub(p.start); answered > p.done0 && el > 0 {
			rate := float64(answered-p.done0) / el.Seconds()
			left := time.Duration(float64(rc.Total-answered) / rate * float64(time.Second))
			eta = "ETA " + left.Round(time.Second).String()
			if left < time.Second {
				eta = "ETA <1s"
			}
		}
	}
	failed := ""
	if rc.Failed > 0 {
		failed = fmt.Sprintf(", %d failed", rc.Failed)
	}
	if p.tty {
		const width = 30
		fill := 0
		pct := 0.0
		if rc.Total > 0 {
			pct = float64(answered) / float64(rc.Total)
			fill = int(pct * width)
		}
		line := fmt.Sprintf("%s [%s%s] %d/%d%s %3.0f%% %s %s", b.ID, strings.Repeat("#", fill), strings.Repeat(".", width-fill), answered, rc.Total, failed, pct*100, b.Status, eta)
		fmt.Fprintf(p.w, "\r%s\x1b[K", line)
		p.drawn = true
		return
	}
	key := b.Status
	if key == p.last && now.Sub(p.lastLine) < plainEvery {
		return
	}
	line := fmt.Sprintf("%s %s: %d/%d answered%s", b.ID, b.Status, answered, rc.Total, failed)
	if eta != "" {
		line += ", " + eta
	}
	fmt.Fprintln(p.w, line)
	p.last, p.lastLine = key, now
}

// done ends a drawn bar's line.
func (p *progress) done() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

func newBatchStatus(client func() (*batchClient, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status ID",
		Short: "Print a batch's status, progress and files",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			b, err := c.getBatch(cmd.Context(), args[0])
			if err != nil {
				return c.explain("get batch "+args[0], err)
			}
			if asJSON {
				fmt.Fprintln(cmd.OutOrStdout(), string(b.raw))
				return nil
			}
			printBatch(cmd.OutOrStdout(), b)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the Batch object as the API returned it")
	return cmd
}

// printBatch writes b for a reader, one field a line.
func printBatch(w io.Writer, b *batchObject) {
	rc := b.RequestCounts
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%s\n", b.ID)
	fmt.Fprintf(tw, "status\t%s\n", b.Status)
	fmt.Fprintf(tw, "requests\t%d total, %d completed, %d failed\n", rc.Total, rc.Completed, rc.Failed)
	fmt.Fprintf(tw, "endpoint\t%s\n", b.Endpoint)
	fmt.Fprintf(tw, "input file\t%s\n", b.InputFileID)
	if b.OutputFileID != "" {
		fmt.Fprintf(tw, "output file\t%s\n", b.OutputFileID)
	}
	if b.ErrorFileID != "" {
		fmt.Fprintf(tw, "error file\t%s\n", b.ErrorFileID)
	}
	stamp := func(name string, t int64) {
		if t > 0 {
			fmt.Fprintf(tw, "%s\t%s\n", name, time.Unix(t, 0).UTC().Format(time.RFC3339))
		}
	}
	stamp("created", b.CreatedAt)
	stamp("in progress", b.InProgressAt)
	stamp("finalizing", b.FinalizingAt)
	stamp("completed", b.CompletedAt)
	stamp("failed", b.FailedAt)
	stamp("cancelling", b.CancellingAt)
	stamp("cancelled", b.CancelledAt)
	stamp("expired", b.ExpiredAt)
	stamp("expires", b.ExpiresAt)
	for _, k := range slices.Sorted(maps.Keys(b.Metadata)) {
		fmt.Fprintf(tw, "metadata\t%s=%s\n", k, b.Metadata[k])
	}
	for _, e := range b.Errors.Data {
		fmt.Fprintf(tw, "error\tline %d: %s: %s\n", e.Line, e.Code, e.Message)
	}
	_ = tw.Flush()
}

func newBatchCancel(client func() (*batchClient, error)) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a batch: queued requests are removed, those in flight aborted",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			b, err := c.cancelBatch(cmd.Context(), args[0])
			if err != nil {
				return c.explain("cancel batch "+args[0], err)
			}
			rc := b.RequestCounts
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %d of %d requests answered; `sluice batch download %s` once it is cancelled\n",
				b.ID, b.Status, rc.Completed+rc.Failed, rc.Total, b.ID)
			return nil
		},
	}
}

func newBatchDownload(client func() (*batchClient, error)) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "download ID",
		Short: "Download a finished batch's output and error files",
		Long: `Download the output and error files of batch ID into --out as
<ID>_output.jsonl and <ID>_error.jsonl, and print their paths.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			b, err := c.getBatch(cmd.Context(), args[0])
			if err != nil {
				return c.explain("get batch "+args[0], err)
			}
			return c.download(cmd.Context(), b, out, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&out, "out", ".", "the directory to write the files into")
	return cmd
}

func newBatchList(client func() (*batchClient, error)) *cobra.Command {
	var limit int64
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the newest batches with their progress",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 100 {
				return fmt.Errorf("--limit %d: want 1 to 100", limit)
			}
			c, err := client()
			if err != nil {
				return err
			}
			batches, err := c.listBatches(cmd.Context(), limit)
			if err != nil {
				return c.explain("list batches", err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tDONE/TOTAL\tFAILED\tCREATED\tENDPOINT")
			for _, b := range batches {
				rc := b.RequestCounts
				fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%s\t%s\n", b.ID, b.Status, rc.Completed+rc.Failed, rc.Total, rc.Failed,
					time.Unix(b.CreatedAt, 0).UTC().Format(time.RFC3339), b.Endpoint)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().Int64Var(&limit, "limit", 20, "how many batches, newest first (1 to 100)")
	return cmd
}
