package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-io/sluice/core/wire"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// redisCommands are the tools of the Redis sorted-set transport.
func redisCommands() []*cobra.Command {
	return []*cobra.Command{newEnqueue(), newResults(), newCancel(), newQueues()}
}

// redisFlags are the connection flags shared by the Redis tools.
type redisFlags struct {
	url, urlFile, prefix, mode string
	addrs                      []string
	masterName                 string
}

func (f *redisFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.url, "redis.url", "", "Redis URL (default $REDIS_URL); redis://, rediss:// (TLS), with user:password for AUTH")
	fs.StringVar(&f.urlFile, "redis.url-file", "", "file holding the Redis URL (a mounted secret)")
	fs.StringVar(&f.prefix, "prefix", "", "key prefix (default llm-d-async)")
	fs.StringVar(&f.mode, "redis.mode", "", "single (default; standalone too), cluster (a Redis Cluster; URL redis://host:port?addr=host2:port2; pool names are hash-tagged: llm-d-async:requests:{pool}) or sentinel (the URL's host is a sentinel; with --redis.master-name)")
	fs.StringSliceVar(&f.addrs, "redis.addrs", nil, "more cluster nodes or sentinels beside the URL's host (host:port, comma-separated; cluster or sentinel mode)")
	fs.StringVar(&f.masterName, "redis.master-name", "", "the master the sentinels monitor (required with --redis.mode sentinel)")
}

func (f *redisFlags) dial() (*producer.Producer, error) {
	url := f.url
	if url == "" && f.urlFile != "" {
		b, err := os.ReadFile(f.urlFile)
		if err != nil {
			return nil, fmt.Errorf("--redis.url-file: %w", err)
		}
		url = strings.TrimSpace(string(b))
	}
	if url == "" {
		url = os.Getenv("REDIS_URL")
	}
	return producer.Dial(url, producer.Config{Prefix: f.prefix, TopologyOptions: rss.TopologyOptions{Mode: f.mode, Addrs: f.addrs, MasterName: f.masterName}})
}

// queueFlags name a request or result queue directly or by pool.
type queueFlags struct {
	queue, pool, tenant string
}

func (q *queueFlags) name(p *producer.Producer, result bool) (string, error) {
	switch {
	case q.queue != "" && q.pool != "":
		return "", errors.New("give --queue or --pool, not both")
	case q.queue != "":
		return q.queue, nil
	case q.pool != "" && result:
		return p.Names().ResultQueue(q.pool, q.tenant), nil
	case q.pool != "":
		return p.Names().RequestQueue(q.pool), nil
	}
	return "", errors.New("give --queue or --pool")
}

func newEnqueue() *cobra.Command {
	var rf redisFlags
	var qf queueFlags
	var file string
	var batch int
	var idempotent bool
	var retention time.Duration
	cmd := &cobra.Command{
		Use:   "enqueue",
		Short: "Enqueue requests (JSON lines) into a Redis sorted-set queue",
		Long: `Read requests, one JSON object per line (flat or envelope form), from --file or
stdin and enqueue them in the flat form, pipelined. Invalid lines are reported
with their line number and skipped; the exit status is 1 if there were any.
Progress goes to stderr.

With --idempotent each request is submitted under its id as idempotency key
(single node, flat form): running the command again on the same file, after a
crash or to be sure, queues nothing twice. A line whose id was already
submitted with the same request is counted as already submitted; with a
different request it is reported as a conflict (exit status 1). The records
are kept for --retention.`,
		Example: `  sluice enqueue --pool pool-a --file requests.jsonl
  cat requests.jsonl | REDIS_URL=redis://redis:6379 sluice enqueue --queue llm-d-async:requests:pool-a`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := rf.dial()
			if err != nil {
				return err
			}
			defer p.Close()
			q, err := qf.name(p, false)
			if err != nil {
				return err
			}
			in := cmd.InOrStdin()
			if file != "" && file != "-" {
				fh, err := os.Open(file)
				if err != nil {
					return err
				}
				defer fh.Close()
				in = fh
			}
			if idempotent {
				p.SetSubmissionRetention(retention)
			}
			return enqueueLines(cmd.Context(), p, q, in, cmd.ErrOrStderr(), max(batch, 1), idempotent)
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().StringVar(&qf.queue, "queue", "", "request queue (sorted set) name")
	cmd.Flags().StringVar(&qf.pool, "pool", "", "pool whose request queue to use (<prefix>:requests:<pool>)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "JSON lines file (default stdin)")
	cmd.Flags().IntVar(&batch, "batch", 1000, "requests per pipelined write")
	cmd.Flags().BoolVar(&idempotent, "idempotent", false, "submit each request under its id as idempotency key: nothing is queued twice")
	cmd.Flags().DurationVar(&retention, "retention", producer.DefaultSubmissionRetention, "with --idempotent, how long the submission records are kept")
	return cmd
}

func enqueueLines(ctx context.Context, p *producer.Producer, q string, in io.Reader, progress io.Writer, batch int, idempotent bool) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	var (
		pending      []*wire.Request
		lines        []int // the line of each pending request
		line, done   int
		invalid      int
		replayed     int
		start, shown = time.Now(), time.Now()
	)
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		if idempotent {
			keys := make([]string, len(pending))
			for i, r := range pending {
				keys[i] = r.ID
			}
			subs, err := p.SubmitIdempotentMany(ctx, q, pending, keys)
			if subs == nil && err != nil {
				return err
			}
			for i, s := range subs {
				switch {
				case s == nil:
					invalid++
					fmt.Fprintf(progress, "line %d: id %s was submitted before as a different request (conflict)\n", lines[i], pending[i].ID)
					done--
				case s.Replayed:
					replayed++
				}
			}
		} else if err := p.EnqueueMany(ctx, q, pending); err != nil {
			return err
		}
		done += len(pending)
		pending, lines = pending[:0], lines[:0]
		if time.Since(shown) >= time.Second {
			shown = time.Now()
			fmt.Fprintf(progress, "enqueued %d (%.0f/s)\n", done, float64(done)/time.Since(start).Seconds())
		}
		return nil
	}
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		r, err := wire.Decode(b)
		if err != nil {
			invalid++
			fmt.Fprintf(progress, "line %d: %v\n", line, err)
			continue
		}
		pending = append(pending, r)
		lines = append(lines, line)
		if len(pending) >= batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read line %d: %w", line+1, err)
	}
	if err := flush(); err != nil {
		return err
	}
	if idempotent {
		fmt.Fprintf(progress, "submitted %d request(s) to %s in %s (%d already submitted before, not queued again); %d invalid or conflicting line(s)\n",
			done, q, time.Since(start).Round(time.Millisecond), replayed, invalid)
	} else {
		fmt.Fprintf(progress, "enqueued %d request(s) to %s in %s; %d invalid line(s)\n", done, q, time.Since(start).Round(time.Millisecond), invalid)
	}
	if invalid > 0 {
		return exitError{1}
	}
	return nil
}

func newResults() *cobra.Command {
	var rf redisFlags
	var qf queueFlags
	var count int
	var follow bool
	var lease time.Duration
	cmd := &cobra.Command{
		Use:   "results",
		Short: "Print results (JSON lines) from a Redis result list, durably",
		Long: `Read results from a result list and print one JSON object per line on stdout,
oldest first. Each result is leased while it is printed and removed only after,
so a crash loses none (it is handed out again after --lease). Without --follow
the command stops when the list is empty; --count stops after that many.`,
		Example: `  sluice results --pool pool-a            # llm-d-async:results:pool-a:$batch
  sluice results --queue result-list --follow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := rf.dial()
			if err != nil {
				return err
			}
			defer p.Close()
			list, err := qf.name(p, true)
			if err != nil {
				return err
			}
			batch := 100
			if count > 0 {
				batch = min(batch, count)
			}
			r := p.Results(list, producer.ReaderOptions{Lease: lease, Batch: batch})
			out := bufio.NewWriter(cmd.OutOrStdout())
			defer out.Flush()
			ctx := cmd.Context()
			printed := 0
			for count <= 0 || printed < count {
				var ls []producer.ResultLease
				if follow {
					ls, err = r.Next(ctx)
					if errors.Is(err, context.Canceled) {
						return nil
					}
				} else {
					ls, err = r.TryNext(ctx)
				}
				if err != nil {
					return err
				}
				if len(ls) == 0 {
					return nil
				}
				for _, l := range ls {
					fmt.Fprintln(out, l.Raw)
				}
				if err := out.Flush(); err != nil {
					return err
				}
				if err := r.Ack(ctx, ls...); err != nil {
					return err
				}
				printed += len(ls)
			}
			return nil
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().StringVar(&qf.queue, "queue", "", "result list name")
	cmd.Flags().StringVar(&qf.pool, "pool", "", "pool whose result list to read (<prefix>:results:<pool>:<tenant>)")
	cmd.Flags().StringVar(&qf.tenant, "tenant", "", "tenant of --pool (default $batch)")
	cmd.Flags().IntVarP(&count, "count", "n", 0, "stop after this many results (0: no limit)")
	cmd.Flags().BoolVar(&follow, "follow", false, "wait for more results instead of stopping at an empty list")
	cmd.Flags().DurationVar(&lease, "lease", time.Minute, "how long a printed result stays reserved before it is handed out again")
	return cmd
}

func newCancel() *cobra.Command {
	var rf redisFlags
	var job, id string
	cmd := &cobra.Command{
		Use:   "cancel",
		Short: "Cancel a job (every request with metadata.job_id) or one request",
		Long: `Cancel a whole job or one request. Waiting requests of a job enqueued with the
producer library or 'sluice enqueue' are answered CANCELLED at once; requests in
flight have their HTTP call aborted and are answered CANCELLED; the rest are
answered CANCELLED when they come up.`,
		Example: `  sluice cancel --job batch_abc123
  sluice cancel --id batch_req_xyz`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if (job == "") == (id == "") {
				return errors.New("give exactly one of --job and --id")
			}
			p, err := rf.dial()
			if err != nil {
				return err
			}
			defer p.Close()
			if id != "" {
				if err := p.CancelRequest(cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "cancelled request %s\n", id)
				return nil
			}
			n, err := p.CancelJob(cmd.Context(), job)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "cancelled job %s (%d waiting request(s) moved to the front)\n", job, n)
			return nil
		},
	}
	rf.register(cmd.Flags())
	cmd.Flags().StringVar(&job, "job", "", "job id (metadata.job_id)")
	cmd.Flags().StringVar(&id, "id", "", "request id")
	return cmd
}

func newQueues() *cobra.Command {
	var rf redisFlags
	cmd := &cobra.Command{
		Use:   "queues [QUEUE...]",
		Short: "Show request queues: waiting, in flight, delayed, dead-lettered",
		Long: `Show, per request queue, how many requests wait, are in flight (leased),
wait for a retry, and were dead-lettered. Without arguments: every queue a
dispatcher or producer registered, plus the sorted sets named <prefix>:requests:*.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := rf.dial()
			if err != nil {
				return err
			}
			defer p.Close()
			ctx := cmd.Context()
			names := args
			if len(names) == 0 {
				if names, err = discoverQueues(ctx, p); err != nil {
					return err
				}
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "QUEUE\tWAITING\tIN FLIGHT\tDELAYED\tDEAD-LETTERED")
			for _, n := range names {
				d, err := rss.QueueDepth(ctx, p.Client(), p.Names(), n)
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\n", n, d.Waiting, d.InFlight, d.Delayed, d.DeadLettered)
			}
			return w.Flush()
		},
	}
	rf.register(cmd.Flags())
	return cmd
}

// discoverQueues lists the registered queues and the sorted sets named like
// request queues.
func discoverQueues(ctx context.Context, p *producer.Producer) ([]string, error) {
	c := p.Client()
	set := map[string]bool{}
	reg, err := c.SMembers(ctx, p.Names().Registry()).Result()
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	for _, n := range reg {
		set[n] = true
	}
	var mu sync.Mutex
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.ScanType(ctx, 0, p.Names().RequestQueue("*"), 1000, "zset").Iterator()
		for iter.Next(ctx) {
			n := iter.Val()
			// The queues' own sorted sets (claims, leases, delay sets) match the pattern too.
			if !strings.HasSuffix(n, ":claims-idx") && !strings.HasSuffix(n, ":leases") && !strings.HasSuffix(n, ":delayed") && !strings.HasSuffix(n, ":pending") {
				mu.Lock()
				set[n] = true
				mu.Unlock()
			}
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("scan queues: %w", err)
		}
		return nil
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		// SCAN sees one node's keys: ask every master.
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return scan(ctx, node) })
	} else {
		err = scan(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}
