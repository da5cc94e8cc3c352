package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/producer"
)

// overheadTargets: the latency bounds at half load and at a
// trickle; the plain-ZADD loads show the fallback and are reported.
func overheadTargets() []target {
	return []target{
		maximum("half_p99_ms", 5, "write to gateway at half the calibrated throughput"),
		maximum("trickle_p99_ms", 10, "write to gateway at 500 req/s into an idle queue (producer library)"),
		reportedOnly("zadd_p99_ms", "plain ZADDs without keyspace events wait for the idle poll (up to poll_interval_ms)"),
		reportedOnly("zadd_keyspace_p99_ms", "plain ZADDs woken by keyspace events"),
	}
}

// runOverhead measures what sluice adds to a request's way: the time from
// the producer's write (just before the enqueue call) to the gateway
// receiving the POST, on the redis-sortedset transport at default settings.
//
// Each run starts a deployment, calibrates its throughput on a full queue
// of 20,000 requests (the redis-sortedset scenario's work: the producer
// library, a 0-ms gateway), then produces paced load:
//
//   - half: half the calibrated throughput for 3 s, written by the producer
//     library once a millisecond (the requests due by then, one pipeline);
//   - trickle: 500 req/s, one Enqueue each, into a queue that was idle long
//     enough for the claim loop to reach its longest idle wait;
//   - zadd: the trickle again, written with a plain ZADD (upstream's
//     producers: no wake-up), so the figures show the fallback (the poll);
//   - zadd_keyspace: the same with the server's keyspace notifications on
//     (notify-keyspace-events Kz), which wake the claim loop.
//
// Figures are p50/p99/max in ms per load, medians over the runs.
func runOverhead(ctx context.Context, o options) (figures, error) {
	r, err := testenv.StartRedisProcess(testenv.RedisOptions{})
	if err != nil {
		return nil, err
	}
	defer r.Stop()
	gw, err := startStampGateway()
	if err != nil {
		return nil, err
	}
	defer gw.close()
	p, pc, err := benchProducer(r.URL)
	if err != nil {
		return nil, err
	}
	defer pc.Close()

	per := map[string][]float64{}
	for range o.runs {
		f, err := overheadRun(ctx, r.URL, gw, p)
		if err != nil {
			return nil, err
		}
		for k, v := range f {
			per[k] = append(per[k], v)
		}
	}
	out := figures{}
	for k, vs := range per {
		out[k] = median(vs)
	}
	return out, nil
}

// Phases of an overhead run, carried in each request's payload.
const (
	phaseCalibrate = iota
	phaseHalf
	phaseTrickle
	phaseZadd
	phaseZaddKeyspace
	phases
)

// overheadRun is one run: calibrate, then the three paced loads.
func overheadRun(ctx context.Context, url string, gw *stampGateway, p *producer.Producer) (figures, error) {
	c := p.Client()
	if err := c.FlushDB(ctx).Err(); err != nil {
		return nil, err
	}
	gw.reset()
	q := rss.RequestQueueName("overhead")
	results := rss.ResultQueueName("overhead", "")
	cfg := &config.Config{
		Transport: rss.Name,
		TransportConfig: config.TransportConfig{ResultQueueName: results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: q}, IGWBaseURL: gw.url}}},
		MetricsPort: -1, HealthPort: -1, RedisURL: url,
	}
	a, err := newApp(cfg, app.Options{})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	stop := func() error {
		cancel()
		return <-done
	}

	// Calibrate: drain a full queue.
	const calN = 20_000
	reqs := make([]*wire.Request, calN)
	for i := range reqs {
		reqs[i] = stampRequest(phaseCalibrate, i, 0)
	}
	if err := p.EnqueueMany(ctx, q, reqs); err != nil {
		_ = stop()
		return nil, err
	}
	start := time.Now()
	if err := gw.wait(ctx, phaseCalibrate, calN, 2*time.Minute); err != nil {
		_ = stop()
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	rate := float64(calN) / time.Since(start).Seconds()

	f := figures{"calibrated_rps": rate}
	loads := []struct {
		name  string
		phase int
		rate  float64
		idle  time.Duration
		write func(ctx context.Context, rs []*wire.Request) error
	}{
		{"half", phaseHalf, rate / 2, 0, func(ctx context.Context, rs []*wire.Request) error { return p.EnqueueMany(ctx, q, rs) }},
		{"trickle", phaseTrickle, 500, 1500 * time.Millisecond, func(ctx context.Context, rs []*wire.Request) error { return p.EnqueueMany(ctx, q, rs) }},
		{"zadd", phaseZadd, 500, 1500 * time.Millisecond, func(ctx context.Context, rs []*wire.Request) error { return plainZadd(ctx, c, q, rs) }},
		{"zadd_keyspace", phaseZaddKeyspace, 500, 1500 * time.Millisecond, func(ctx context.Context, rs []*wire.Request) error { return plainZadd(ctx, c, q, rs) }},
	}
	defer c.ConfigSet(context.WithoutCancel(ctx), "notify-keyspace-events", "")
	for _, l := range loads {
		events := ""
		if l.phase == phaseZaddKeyspace {
			events = "Kz"
		}
		if err := c.ConfigSet(ctx, "notify-keyspace-events", events).Err(); err != nil {
			_ = stop()
			return nil, err
		}
		if !sleep(ctx, l.idle) {
			_ = stop()
			return nil, ctx.Err()
		}
		sent, err := pace(ctx, l.phase, l.rate, 3*time.Second, l.write)
		if err == nil {
			err = gw.wait(ctx, l.phase, sent, time.Minute)
		}
		if err != nil {
			_ = stop()
			return nil, fmt.Errorf("%s: %w", l.name, err)
		}
		lat := gw.latencies(l.phase)
		f[l.name+"_p50_ms"] = percentile(lat, 0.50)
		f[l.name+"_p99_ms"] = percentile(lat, 0.99)
		f[l.name+"_max_ms"] = percentile(lat, 1)
		f[l.name+"_rps"] = l.rate
	}
	if err := stop(); err != nil {
		return nil, err
	}
	return f, nil
}

// pace writes requests of phase at rate for d: every millisecond the
// requests due by then, stamped with the time of their write. It returns
// how many it wrote.
func pace(ctx context.Context, phase int, rate float64, d time.Duration, write func(context.Context, []*wire.Request) error) (int, error) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	sent := 0
	var batch []*wire.Request
	for {
		select {
		case <-ctx.Done():
			return sent, ctx.Err()
		case now := <-tick.C:
			el := now.Sub(start)
			if el >= d {
				return sent, nil
			}
			due := int(el.Seconds()*rate) + 1
			if due <= sent {
				continue
			}
			batch = batch[:0]
			stamp := time.Now().UnixNano()
			for i := sent; i < due; i++ {
				batch = append(batch, stampRequest(phase, i, stamp))
			}
			if err := write(ctx, batch); err != nil {
				return sent, err
			}
			sent = due
		}
	}
}

// stampRequest is request i of phase, stamped with its write time (Unix ns).
func stampRequest(phase, i int, stamp int64) *wire.Request {
	payload := `{"model":"m","prompt":"What is 2+2?","max_tokens":16,"ph":` + strconv.Itoa(phase) +
		`,"sent_ns":` + strconv.FormatInt(stamp, 10) + `}`
	return &wire.Request{ID: "o-" + strconv.Itoa(phase) + "-" + strconv.Itoa(i), Deadline: time.Now().Add(time.Hour),
		Created: time.Now(), Payload: json.RawMessage(payload)}
}

// plainZadd writes rs as upstream's producers do: ZADD of the flat form,
// nothing else.
func plainZadd(ctx context.Context, c redis.UniversalClient, q string, rs []*wire.Request) error {
	members := make([]redis.Z, 0, len(rs))
	for _, r := range rs {
		b, err := wire.EncodeRequest(r)
		if err != nil {
			return err
		}
		s, _ := strconv.ParseFloat(rss.Score(r.Deadline), 64)
		members = append(members, redis.Z{Score: s, Member: b})
	}
	return c.ZAdd(ctx, q, members...).Err()
}

// percentile returns the q-quantile of xs (nearest rank; xs sorted in place).
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	sort.Float64s(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// stampGateway is a 0-ms gateway that records, per phase, how long ago each
// request it receives was written (its payload's sent_ns).
type stampGateway struct {
	url string
	srv *http.Server

	mu   sync.Mutex
	lat  [phases][]float64
	cond *sync.Cond
}

func startStampGateway() (*stampGateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &stampGateway{url: "http://" + ln.Addr().String()}
	g.cond = sync.NewCond(&g.mu)
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = g.srv.Serve(ln) }()
	return g, nil
}

var stampAnswer = []byte(`{"choices":[{"text":"4"}]}`)

func (g *stampGateway) serve(w http.ResponseWriter, r *http.Request) {
	now := time.Now().UnixNano()
	body, _ := io.ReadAll(r.Body)
	ph, sent := stampField(body, `"ph":`), stampField(body, `"sent_ns":`)
	if ph >= 0 && ph < phases && sent >= 0 {
		g.mu.Lock()
		g.lat[ph] = append(g.lat[ph], float64(now-sent)/1e6)
		g.cond.Broadcast()
		g.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(stampAnswer)
}

// stampField reads the non-negative integer after key in body, or -1.
func stampField(body []byte, key string) int64 {
	i := bytes.Index(body, []byte(key))
	if i < 0 {
		return -1
	}
	j := i + len(key)
	k := j
	for k < len(body) && body[k] >= '0' && body[k] <= '9' {
		k++
	}
	v, err := strconv.ParseInt(string(body[j:k]), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

func (g *stampGateway) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.lat {
		g.lat[i] = g.lat[i][:0]
	}
}

// wait blocks until n requests of phase arrived, or limit passed.
func (g *stampGateway) wait(ctx context.Context, phase, n int, limit time.Duration) error {
	end := time.Now().Add(limit)
	stop := context.AfterFunc(ctx, func() { g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() })
	defer stop()
	t := time.AfterFunc(limit, func() { g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() })
	defer t.Stop()
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.lat[phase]) < n {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(end) {
			return fmt.Errorf("%d of %d requests reached the gateway after %s", len(g.lat[phase]), n, limit)
		}
		g.cond.Wait()
	}
	return nil
}

func (g *stampGateway) latencies(phase int) []float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]float64(nil), g.lat[phase]...)
}

func (g *stampGateway) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = g.srv.Shutdown(ctx)
}

// sleep waits for d or the end of ctx (false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
