package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// migrateFlags are the flags of migrate.
type migrateFlags struct {
	redis                     redisFlags
	toUpstream, fromUpstream  bool
	queues, pools             []string
	configFile, configInline  string
	retryQueue, upstreamRetry string
	dryRun, force             bool
}

func newMigrate() *cobra.Command {
	f := &migrateFlags{}
	cmd := &cobra.Command{
		Use:   "migrate --to-upstream | --from-upstream",
		Short: "Move sorted-set queue state between sluice's and upstream llm-d-async's key layout",
		Long: `Move the state of redis-sortedset queues between sluice and upstream llm-d-async,
for a rollback or a cut-over. Waiting requests need nothing: both read the same
sorted sets.

Claims are shared: sluice writes upstream's claim keys (<queue>:claimed,
:claim-owners, :claims-idx), and replicas of either kind return each other's
expired claims; both directions also return expired claims at once.

--to-upstream (rollback to upstream): expired claims of any replica, and leases
of earlier sluice versions (<queue>:leased), go back into the queue at
upstream's score (deadline plus enqueue sequence), and delayed retries
(<queue>:delayed, or the delay set retry_queue_name names) go into upstream's
retry set (member: the message; score: the due time in Unix seconds). A retry
whose message does not name its queue in internal.request_queue_name goes back
into the queue at once instead, since upstream's retry mover would send it to
its first queue (or drop it, when it is not an envelope). Stop every sluice
replica first: while any claim of a sluice replica is still being renewed the
command refuses, before moving anything (live claims of upstream replicas are
left to them), unless --force (a running replica's result is
then discarded as late and upstream answers the request). Dead-letter lists, redelivery counts, stats, job indexes
and cancellations are left in place: upstream has no such keys, and they serve
a later cut-over back to sluice.

--from-upstream (cut-over to sluice, optional): entries of upstream's retry
set that belong to the given queues (by internal.request_queue_name, else
internal.queue_id) move into each queue's delay set, keeping their due time,
and expired claims (of upstream replicas that died) go back into the queue.
A running sluice does this for due entries on its own; this is the explicit,
one-time form. Entries of other queues are left.

Every move is atomic and happens only if its entry is still there, so the
command is safe to re-run: a second run moves nothing. --dry-run counts what
would move and writes nothing.

The queues come from --queue, --pool, and the queues of --transport-config-file
(or --transport-config), whose options (prefix, retry_queue_name, url) apply.`,
		Example: `  sluice migrate --to-upstream --dry-run --transport-config-file queues.json
  sluice migrate --to-upstream --pool pool-a --pool pool-b
  sluice migrate --from-upstream --queue request-sortedset`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	fs := cmd.Flags()
	f.redis.register(fs)
	fs.BoolVar(&f.toUpstream, "to-upstream", false, "move sluice's state into upstream's shapes (rollback)")
	fs.BoolVar(&f.fromUpstream, "from-upstream", false, "adopt upstream's retry set into sluice's delay sets")
	fs.StringArrayVar(&f.queues, "queue", nil, "request queue (sorted set) name; repeatable")
	fs.StringArrayVar(&f.pools, "pool", nil, "pool whose request queue (<prefix>:requests:<pool>) to migrate; repeatable")
	fs.StringVar(&f.configFile, "transport-config-file", "", "transport config file (JSON object, or upstream's bare array of queues): its queues and options")
	fs.StringVar(&f.configFile, "redis.ss.queues-config-file", "", "same as --transport-config-file (upstream's flag)")
	fs.StringVar(&f.configInline, "transport-config", "", "transport config as inline JSON")
	fs.StringVar(&f.retryQueue, "retry-queue-name", "", "sluice's retry_queue_name option, if the config does not give it (default {queue}:delayed)")
	fs.StringVar(&f.upstreamRetry, "upstream-retry-queue-name", "", "upstream's retry set (default: a flat retry_queue_name, else "+rss.DefaultUpstreamRetryQueueName+")")
	fs.BoolVar(&f.dryRun, "dry-run", false, "count what would move; write nothing")
	fs.BoolVar(&f.force, "force", false, "with --to-upstream: also move leases still being renewed (a sluice replica still runs)")
	return cmd
}

// load returns the transport options and the queues to migrate.
func (f *migrateFlags) load() (rss.Options, []transport.Queue, error) {
	var o rss.Options
	var tc config.TransportConfig
	data, where := []byte(f.configInline), "--transport-config"
	if f.configFile != "" {
		if f.configInline != "" {
			return o, nil, errors.New("give --transport-config-file or --transport-config, not both")
		}
		b, err := os.ReadFile(f.configFile)
		if err != nil {
			return o, nil, fmt.Errorf("transport config: %w", err)
		}
		data, where = b, f.configFile
	}
	if strings.TrimSpace(string(data)) != "" {
		var err error
		if tc, err = config.ParseQueues(data, where); err != nil {
			return o, nil, err
		}
		if err := transport.DecodeOptions(tc.Options, &o); err != nil {
			return o, nil, fmt.Errorf("%s: %w", where, err)
		}
	}
	if f.retryQueue != "" {
		o.RetryQueueName = f.retryQueue
	}
	o.SetDefaults()
	if f.upstreamRetry != "" {
		o.UpstreamRetryQueueName = f.upstreamRetry
	}
	var qs []transport.Queue
	for _, q := range tc.Queues {
		qs = append(qs, q.Queue)
	}
	return o, qs, nil
}

func (f *migrateFlags) run(cmd *cobra.Command) error {
	if f.toUpstream == f.fromUpstream {
		return errors.New("give exactly one of --to-upstream and --from-upstream")
	}
	if f.force && !f.toUpstream {
		return errors.New("--force goes with --to-upstream")
	}
	o, queues, err := f.load()
	if err != nil {
		return err
	}
	if f.redis.url == "" && f.redis.urlFile == "" && o.URL != "" {
		f.redis.url = o.URL
	}
	if f.redis.prefix == "" {
		f.redis.prefix = o.Prefix
	}
	if f.redis.mode == "" && len(f.redis.addrs) == 0 && f.redis.masterName == "" {
		// The transport config's topology, as sluice serve reads it.
		f.redis.mode, f.redis.addrs, f.redis.masterName = o.Mode, o.Addrs, o.MasterName
	}
	o.Prefix = f.redis.prefix
	p, err := f.redis.dial()
	if err != nil {
		return err
	}
	defer p.Close()
	for _, name := range f.queues {
		queues = append(queues, transport.Queue{Name: name})
	}
	for _, pool := range f.pools {
		queues = append(queues, transport.Queue{Name: p.Names().RequestQueue(pool)})
	}
	queues = uniqueQueues(queues)
	if len(queues) == 0 {
		return errors.New("no queue to migrate: give --queue, --pool or a transport config with queues")
	}
	m, err := rss.NewMigrator(p.Client(), o)
	if err != nil {
		return err
	}
	m.DryRun, m.Force = f.dryRun, f.force
	out := cmd.OutOrStdout()
	if f.dryRun {
		fmt.Fprintln(out, "dry run: nothing is written")
	}
	if f.toUpstream {
		return toUpstream(cmd, m, queues, out)
	}
	return fromUpstream(cmd, m, queues, out)
}

// uniqueQueues drops repeated names, keeping the first (which carries the
// config's id) and defaulting ids to names.
func uniqueQueues(qs []transport.Queue) []transport.Queue {
	seen := map[string]bool{}
	out := qs[:0]
	for _, q := range qs {
		if seen[q.Name] {
			continue
		}
		seen[q.Name] = true
		if q.ID == "" {
			q.ID = q.Name
		}
		out = append(out, q)
	}
	return out
}

func toUpstream(cmd *cobra.Command, m *rss.Migrator, queues []transport.Queue, out io.Writer) error {
	ctx := cmd.Context()
	if !m.Force {
		var live []error
		for _, q := range queues {
			if err := m.CheckLeases(ctx, q.Name); err != nil {
				var le *rss.LiveLeasesError
				if !errors.As(err, &le) {
					return err
				}
				live = append(live, err)
			}
		}
		if len(live) > 0 {
			return fmt.Errorf("refusing to migrate, nothing was moved: a sluice replica still serves these queues:\n%w", errors.Join(live...))
		}
	}
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "QUEUE\tCLAIMS->QUEUE\tRETRIES->%s\tRETRIES->QUEUE\tUPSTREAM CLAIMS (LEFT)\tDEAD-LETTERED (LEFT)\tREDELIVERY COUNTS (LEFT)\n", m.UpstreamRetrySet())
	var errs []error
	for _, q := range queues {
		r, err := m.ToUpstream(ctx, q.Name)
		leased := fmt.Sprint(r.Leased)
		if r.LiveLeases > 0 {
			leased += fmt.Sprintf(" (%d live)", r.LiveLeases)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\n", q.Name, leased, r.Retries, r.RetriesToQueue, r.UpstreamClaims, r.DeadLettered, r.Redeliveries)
		if r.RetriesLeft > 0 {
			errs = append(errs, fmt.Errorf("%s: %d delay-set entries not in sluice's format were left", q.Name, r.RetriesLeft))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "left in place: dead-letter lists, redelivery counts, stats, job indexes and cancellations (sluice-only keys, unused by upstream; kept for a cut-over back to sluice)")
	return errors.Join(errs...)
}

func fromUpstream(cmd *cobra.Command, m *rss.Migrator, queues []transport.Queue, out io.Writer) error {
	moved, left, err := m.FromUpstream(cmd.Context(), queues)
	w := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintf(w, "QUEUE\t%s->DELAY SET\tEXPIRED CLAIMS->QUEUE\tLIVE CLAIMS (UPSTREAM, SLUICE)\n", m.UpstreamRetrySet())
	names := make([]string, 0, len(queues))
	for _, q := range queues {
		names = append(names, q.Name)
	}
	sort.Strings(names)
	for _, n := range names {
		cr, cerr := m.ReturnClaims(cmd.Context(), n)
		err = errors.Join(err, cerr)
		fmt.Fprintf(w, "%s\t%d\t%d\t%d, %d\n", n, moved[n], cr.Returned, cr.LiveUpstream, cr.LiveSluice)
	}
	if ferr := w.Flush(); ferr != nil {
		return ferr
	}
	fmt.Fprintf(out, "left in %s: %d (they belong to no queue given)\n", m.UpstreamRetrySet(), left)
	return err
}
