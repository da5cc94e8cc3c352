package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// redisEnvelopeTargets: issue 26 item 9(c), the path deployments use.
func redisEnvelopeTargets() []target {
	return []target{
		minimum("ratio", 0.70, "upstream envelopes with request tokens, sluice as upstream's flags start it, against the plain batched loop at equal in-flight"),
		maximum("cpu_ratio", 1.5, "this process's CPU per request (user+system) against the plain loop's"),
		noFailures("failed"),
		noFailures("baseline_failed"),
	}
}

// envelopeRequests is the scenario's queue size: half the sorted-set
// scenario's, since each side's results are read back and decoded.
const envelopeRequests = 50_000

// runRedisEnvelope is the redis-sortedset scenario on the message form
// today's deployments put on the queue: upstream's producer (main after
// v0.10) writes tagged envelopes with a fresh request_token, the request
// and result queue names and internal.enqueue_seq, scored deadline +
// seq/2^21 (sluice's producer in Envelope mode writes exactly that). sluice
// runs as upstream's flags configure it: the result list is the
// deployment's default and each message's own result_queue_name wins
// (ResultFromMessage), so every result is routed by its message, carries
// the request_token, and the claim stamps the routing fields into the
// envelope as upstream does.
//
// The baseline is the plain loop of redissortedset_baseline.go at the same
// in-flight as sluice (64 workers, sluice's default concurrency, each
// claiming up to 32), decoding the same envelopes with the same decoder
// and writing each result, with its request_token, to the message's own
// result list. It does not rewrite the envelope with the routing stamps
// (work sluice does for upstream's consumers), so it is the faster side.
//
// cpu_ratio compares this process's CPU time (getrusage, user+system) per
// request between the two sides; the in-process gateway's share is in
// both. Redis's CPU is not counted.
func runRedisEnvelope(ctx context.Context, o options) (figures, error) {
	const n = envelopeRequests
	r, err := testenv.StartRedisProcess(testenv.RedisOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	gw, stopGW, err := envelopeGateway()
	if err != nil {
		return nil, err
	}
	defer stopGW()
	w := newEnvelopeWorkload(n, gw)
	_, pc, err := benchProducer(r.URL)
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	fill := func(ctx context.Context) error { return w.fill(ctx, pc) }
	lists := []string{w.results}
	var sl, base samples
	var slCPU, baseCPU, slRedis, baseRedis []float64
	err = alternate(ctx, o.runs,
		func(ctx context.Context, _ int) error {
			if err := fill(ctx); err != nil {
				return err
			}
			a, err := w.sluice(r.URL)
			if err != nil {
				return err
			}
			c0, r0, cs0 := cpuNow(), redisCPU(ctx, pc), commandStats(ctx, pc)
			s, err := timeRedisSide(ctx, pc, lists, n, labelled("sluice", a.Run))
			slRedis = appendRedisCPU(slRedis, r0, redisCPU(ctx, pc), n)
			printCommandStats("sluice", cs0, commandStats(ctx, pc), n)
			if err != nil {
				return fmt.Errorf("sluice: %w", err)
			}
			slCPU = append(slCPU, (cpuNow()-c0).Seconds()*1e6/n)
			sl = append(sl, s)
			return nil
		},
		func(ctx context.Context, _ int) error {
			if err := fill(ctx); err != nil {
				return err
			}
			c0, r0, cs0 := cpuNow(), redisCPU(ctx, pc), commandStats(ctx, pc)
			s, err := timeRedisSide(ctx, pc, lists, n, labelled("baseline", func(ctx context.Context) error {
				return w.loop(ctx, pc)
			}))
			baseRedis = appendRedisCPU(baseRedis, r0, redisCPU(ctx, pc), n)
			printCommandStats("baseline", cs0, commandStats(ctx, pc), n)
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			baseCPU = append(baseCPU, (cpuNow()-c0).Seconds()*1e6/n)
			base = append(base, s)
			return nil
		})
	if err != nil {
		return nil, err
	}
	f := pairFigures("redis-sortedset-envelope", sl, base)
	f["requests"], f["rss_mb"] = n, rssMB()
	f["cpu_us_per_req"], f["baseline_cpu_us_per_req"] = median(slCPU), median(baseCPU)
	f["cpu_ratio"] = medianRatio(slCPU, baseCPU)
	if len(slRedis) > 0 && len(baseRedis) > 0 {
		f["redis_cpu_us_per_req"], f["baseline_redis_cpu_us_per_req"] = median(slRedis), median(baseRedis)
	}
	return f, nil
}

// envelopeConcurrency is the in-flight limit of both sides of the envelope
// scenarios (sluice's default concurrency).
const envelopeConcurrency = 64

// envelopeGateway starts the envelope scenarios' 0-ms gateway.
func envelopeGateway() (url string, stop func(), err error) {
	sim, err := simulator.New(simulator.Config{Capacity: envelopeConcurrency})
	if err != nil {
		return "", nil, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	return gw, func() { _ = sim.Close() }, nil
}

// envelopeWorkload is the envelope scenarios' work: n requests written as
// upstream's producer writes them, and the two sides that drain them.
type envelopeWorkload struct {
	queue, results, gw string
	reqs               []*wire.Request
}

func newEnvelopeWorkload(n int, gw string) envelopeWorkload {
	w := envelopeWorkload{queue: rss.RequestQueueName("bench"), results: rss.ResultQueueName("bench", ""), gw: gw,
		reqs: make([]*wire.Request, n)}
	dl := time.Now().Add(time.Hour)
	for i := range w.reqs {
		w.reqs[i] = &wire.Request{ID: "e-" + strconv.Itoa(i), Deadline: dl, Created: time.Now(),
			Payload:  json.RawMessage(`{"model":"m","prompt":"What is 2+2?","max_tokens":16}`),
			Metadata: map[string]string{"job_id": "bench", "request_index": strconv.Itoa(i)}}
	}
	return w
}

// fill empties the database and writes the requests.
func (w envelopeWorkload) fill(ctx context.Context, c redis.UniversalClient) error {
	if err := c.FlushDB(ctx).Err(); err != nil {
		return err
	}
	return producer.New(c, producer.Config{Envelope: true, ResultQueueName: w.results}).EnqueueMany(ctx, w.queue, w.reqs)
}

// sluice is a deployment as upstream's flags start it on the queue.
func (w envelopeWorkload) sluice(redisURL string) (*app.App, error) {
	return newApp(&config.Config{
		Transport: rss.Name,
		TransportConfig: config.TransportConfig{ResultQueueName: w.results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: w.queue}, IGWBaseURL: w.gw}}},
		MetricsPort: -1, HealthPort: -1, RedisURL: redisURL, Concurrency: envelopeConcurrency,
	}, app.Options{})
}

// loop is the plain loop at the same in-flight.
func (w envelopeWorkload) loop(ctx context.Context, c redis.UniversalClient) error {
	return envelopeBaseline(ctx, c, w.gw, w.queue, envelopeConcurrency, baseBatch)
}

// cpuNow is this process's CPU time so far (user + system).
func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// labelled runs f under the CPU profile label side=<side>, which every
// goroutine f starts inherits: `go tool pprof -tagfocus side=sluice` shows
// one side's own CPU without the gateway's or the other side's.
func labelled(side string, f func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) (err error) {
		pprof.Do(ctx, pprof.Labels("side", side), func(ctx context.Context) { err = f(ctx) })
		return err
	}
}

// commandStats is the Redis server's time per command so far (INFO
// commandstats: usec, and calls), read only when SLUICE_BENCH_COMMANDSTATS
// is set; nil otherwise or when it cannot be read.
func commandStats(ctx context.Context, c redis.UniversalClient) map[string][2]float64 {
	if os.Getenv("SLUICE_BENCH_COMMANDSTATS") == "" {
		return nil
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil
	}
	out := map[string][2]float64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		var calls, usec float64
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseFloat(v, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(v, 64)
			}
		}
		out[name] = [2]float64{usec, calls}
	}
	return out
}

// printCommandStats prints, on stderr, the Redis time per request of each
// command one side ran between two commandStats readings, largest first
// (the time of a script's calls is in evalsha's and again in each call's).
func printCommandStats(side string, before, after map[string][2]float64, n float64) {
	if before == nil || after == nil {
		return
	}
	type row struct {
		name        string
		usec, calls float64
	}
	var rows []row
	for k, a := range after {
		b := before[k]
		if d := (row{k, a[0] - b[0], a[1] - b[1]}); d.calls > 0 {
			rows = append(rows, d)
		}
	}
	slices.SortFunc(rows, func(x, y row) int { return cmp.Compare(y.usec, x.usec) })
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, " %s=%.2fus/req(%.2f calls/req)", r.name, r.usec/n, r.calls/n)
	}
	fmt.Fprintf(os.Stderr, "bench: redis-sortedset-envelope %s commandstats:%s\n", side, sb.String())
}

// redisCPU is the Redis server's CPU time so far (INFO cpu: used_cpu_user
// + used_cpu_sys); -1 when it cannot be read.
func redisCPU(ctx context.Context, c redis.UniversalClient) time.Duration {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return -1
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return -1
			}
			total += f
			found++
		}
	}
	if found != 2 {
		return -1
	}
	return time.Duration(total * float64(time.Second))
}

// appendRedisCPU appends the Redis CPU per request between two readings
// (µs), unless either could not be read: a missing sample leaves the figure
// to the other runs (no samples: the figure is absent, not 0).
func appendRedisCPU(into []float64, before, after time.Duration, n int) []float64 {
	if before < 0 || after < 0 {
		return into
	}
	return append(into, (after-before).Seconds()*1e6/float64(n))
}

// envelopeBaseline drains queue as benchBaselineRedisQueue does, each
// result written, with the envelope's request_token, to the list the
// envelope names (internal.result_queue_name).
func envelopeBaseline(ctx context.Context, c redis.UniversalClient, gw, q string, workers, batch int) error {
	return baselineLoop(ctx, c, gw, q, workers, batch, envelopeCall)
}

// envelopeCall is baselineCall for an envelope: it also returns the
// result's list and adds the request_token to the result.
func envelopeCall(ctx context.Context, client *http.Client, url, token string, member []byte) (list string, result []byte) {
	list = rss.ResultQueueName("bench", "")
	req, err := wire.Decode(member)
	if err != nil {
		return list, wire.ErrorResult(&wire.Request{ID: token}, wire.CodeInvalidRequest, err.Error()).Marshal()
	}
	if req.ResultQueueName != "" {
		list = req.ResultQueueName
	}
	res := baselinePost(ctx, client, url, req)
	if req.Token != "" && len(res) > 0 && res[len(res)-1] == '}' {
		tok, _ := json.Marshal(req.Token)
		res = append(append(append(res[:len(res)-1], `,"request_token":`...), tok...), '}')
	}
	return list, res
}
