package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
	"github.com/sluice-io/sluice/transports/wmtransport/postgres"
)

// brokerScenarios are the throughput scenarios of the watermill transport
// on real brokers: sluice (concurrency 64, constant gate, 0-ms simulated
// gateway) against a baseline on the same server, the fastest plain loop
// doing the same work with the same guarantees and concurrency: read a
// request, POST it, publish its result (confirmed), ack it (confirmed).
func brokerScenarios() []scenario {
	return []scenario{
		{"nats-jetstream", runNATSJetStream, brokerTargets()},
		{"postgres", runPostgres, brokerTargets()},
	}
}

// brokerTargets: the bound of every transport against its plain loop.
func brokerTargets() []target {
	return []target{
		minimum("ratio", 0.70, "sluice at its defaults against the plain loop with the same guarantees and concurrency"),
		noFailures("failed"),
		noFailures("baseline_failed"),
	}
}

// brokerConcurrency is the requests in flight, sluice's default and the baseline's workers.
const brokerConcurrency = 64

// brokerRun measures one broker: setup prepares run i's request and result
// topics with n requests; count reports how many results run i has, tally
// reads and counts them; baseline runs the plain loop over run i's backlog
// until it is drained or ctx ends.
type brokerRun struct {
	n        int
	options  func(run int) wmtransport.Options
	brokers  *wmtransport.Brokers
	setup    func(ctx context.Context, run int) error
	count    func(ctx context.Context, run int) (int64, error)
	tally    func(ctx context.Context, run int) (resultTally, error)
	baseline func(ctx context.Context, run int, gw string) error
	topics   func(run int) (queue, results string)
}

func (b brokerRun) measure(ctx context.Context, name string, o options) (figures, error) {
	sim, err := simulator.New(simulator.Config{Capacity: brokerConcurrency})
	if err != nil {
		return nil, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer sim.Close()
	var sl, base samples
	// Run r's sluice side uses topics 2r, its baseline 2r+1.
	err = alternate(ctx, o.runs,
		func(ctx context.Context, r int) error {
			s, err := b.side(ctx, 2*r, func(ctx context.Context) error { return b.sluice(ctx, 2*r, gw) })
			if err != nil {
				return fmt.Errorf("sluice: %w", err)
			}
			sl = append(sl, s)
			return nil
		},
		func(ctx context.Context, r int) error {
			s, err := b.side(ctx, 2*r+1, func(ctx context.Context) error { return b.baseline(ctx, 2*r+1, gw) })
			if err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
			base = append(base, s)
			return nil
		})
	if err != nil {
		return nil, err
	}
	f := pairFigures(name, sl, base)
	f["requests"] = float64(b.n)
	return f, nil
}

// side sets run up and times launch over its backlog, the same way for
// sluice and the baseline: the clock starts just before launch (which
// builds its own clients) and stops when count sees n results; then the
// results are counted by what they say.
func (b brokerRun) side(ctx context.Context, run int, launch func(ctx context.Context) error) (sample, error) {
	if err := b.setup(ctx, run); err != nil {
		return sample{}, fmt.Errorf("setup: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sideErr error
	stopped := make(chan struct{})
	start := time.Now()
	go func() { sideErr = launch(rctx); close(stopped) }()
	limit := time.After(5 * time.Minute)
	ended := false
	var first time.Duration
	for {
		got, err := b.count(ctx, run)
		if err != nil {
			cancel()
			<-stopped
			return sample{}, err
		}
		if got > 0 && first == 0 {
			first = time.Since(start)
		}
		if got >= int64(b.n) {
			break
		}
		if ended {
			if sideErr != nil {
				return sample{}, sideErr
			}
			return sample{}, fmt.Errorf("stopped with %d of %d results", got, b.n)
		}
		select {
		case <-stopped:
			ended = true
		case <-limit:
			cancel()
			<-stopped
			return sample{}, fmt.Errorf("only %d of %d results after 5m", got, b.n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	<-stopped
	if sideErr != nil && !errors.Is(sideErr, context.Canceled) {
		return sample{}, sideErr
	}
	t, err := b.tally(ctx, run)
	if err != nil {
		return sample{}, err
	}
	return sample{ok: t.ok, failed: t.failed + max(0, b.n-t.total()), seconds: elapsed.Seconds(), first: first}, nil
}

// sluice runs a deployment over the backlog of run until ctx ends.
func (b brokerRun) sluice(ctx context.Context, run int, gw string) error {
	queue, results := b.topics(run)
	tp, err := wmtransport.New(b.brokers, b.options(run), transport.Env{})
	if err != nil {
		return err
	}
	cfg := &config.Config{Transport: wmtransport.Name, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: queue}, IGWBaseURL: gw}}}}
	a, err := newApp(cfg, app.Options{Transport: tp})
	if err != nil {
		_ = tp.Close()
		return err
	}
	return a.Run(ctx)
}

// baselineResult is the plain loops' answer to one message: its result, or
// an error result when the request cannot be read or the call got no
// answer (as sluice writes one), so that both sides' failures are counted
// the same way, from the results they leave.
func baselineResult(ctx context.Context, client *http.Client, gw string, data []byte) []byte {
	req, err := wire.Decode(data)
	if err != nil {
		return wire.ErrorResult(&wire.Request{}, wire.CodeInvalidRequest, err.Error()).Marshal()
	}
	res, err := postJSON(ctx, client, gw, req)
	if err != nil {
		return wire.ErrorResult(req, wire.CodeInferenceError, err.Error()).Marshal()
	}
	return res.Marshal()
}

// postJSON POSTs a request's payload to the gateway as the dispatcher does
// and returns the answer's result.
func postJSON(ctx context.Context, client *http.Client, gw string, req *wire.Request) (*wire.Result, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/completions", bytesReader(req.Payload))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body []byte
	if body, err = readAll(resp); err != nil {
		return nil, err
	}
	return &wire.Result{ID: req.ID, StatusCode: resp.StatusCode, Payload: string(body), Metadata: req.Metadata}, nil
}

// runNATSJetStream: 10k requests in a one-node JetStream stream.
func runNATSJetStream(ctx context.Context, o options) (figures, error) {
	const n = 10_000
	cl, err := testenv.StartNATSClusterProcess(1)
	if err != nil {
		return nil, err
	}
	defer cl.Stop()
	nc, err := nats.Connect(cl.URL)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	topics := func(run int) (string, string) {
		return "bench-requests-" + strconv.Itoa(run), "bench-results-" + strconv.Itoa(run)
	}
	brokers := wmtransport.NewBrokers()
	if err := brokers.Register(natsjetstream.Name, natsjetstream.Factory); err != nil {
		return nil, err
	}
	dl := time.Now().Add(time.Hour)
	r := brokerRun{n: n, brokers: brokers, topics: topics,
		options: func(int) wmtransport.Options {
			bo, _ := json.Marshal(natsjetstream.Options{URL: cl.URL})
			return wmtransport.Options{Broker: natsjetstream.Name, BrokerOptions: bo}
		},
		setup: func(ctx context.Context, run int) error {
			queue, results := topics(run)
			for _, topic := range []string{queue, results} {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsjetstream.StreamName(topic), Subjects: []string{topic},
					Retention: jetstream.WorkQueuePolicy}); err != nil {
					return err
				}
			}
			// Asynchronous publishes, 500 outstanding at most.
			for i := 0; i < n; i += 500 {
				acks := make([]jetstream.PubAckFuture, 0, 500)
				for j := i; j < min(i+500, n); j++ {
					f, err := js.PublishAsync(queue, benchPayload(j, dl))
					if err != nil {
						return err
					}
					acks = append(acks, f)
				}
				for _, f := range acks {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						return err
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
			return nil
		},
		count: func(ctx context.Context, run int) (int64, error) {
			_, results := topics(run)
			s, err := js.Stream(ctx, natsjetstream.StreamName(results))
			if err != nil {
				return 0, err
			}
			info, err := s.Info(ctx)
			if err != nil {
				return 0, err
			}
			return int64(info.State.Msgs), nil
		},
		tally: func(ctx context.Context, run int) (resultTally, error) {
			_, results := topics(run)
			return natsTally(ctx, js, results, n)
		},
		baseline: func(ctx context.Context, run int, gw string) error {
			queue, results := topics(run)
			return natsBaseline(ctx, js, queue, results, gw, n)
		},
	}
	return r.measure(ctx, "nats-jetstream", o)
}

// natsBaseline is the plain loop: one fetcher pulls as many messages as
// workers are free (one durable pull consumer), 64 workers POST, publish
// the result (waiting for the stream's ack) and ack (waiting for the
// server's confirmation).
func natsBaseline(ctx context.Context, js jetstream.JetStream, queue, results, gw string, n int) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, natsjetstream.StreamName(queue), jetstream.ConsumerConfig{
		Durable: "baseline", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: brokerConcurrency, MaxConnsPerHost: brokerConcurrency}}
	defer client.CloseIdleConnections()
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	fail := func(err error) { once.Do(func() { firstErr = err; cancel() }) }
	slots := make(chan struct{}, brokerConcurrency)
	for range brokerConcurrency {
		slots <- struct{}{}
	}
	work := make(chan jetstream.Msg, brokerConcurrency)
	var wg sync.WaitGroup
	for range brokerConcurrency {
		wg.Go(func() {
			for m := range work {
				if _, err := js.Publish(rctx, results, baselineResult(rctx, client, gw, m.Data())); err != nil {
					fail(err)
					return
				}
				if err := m.DoubleAck(rctx); err != nil {
					fail(err)
					return
				}
				done.Add(1)
				slots <- struct{}{}
			}
		})
	}
	for done.Load() < int64(n) && rctx.Err() == nil {
		free := 0
		select {
		case <-slots:
			free = 1
		case <-rctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
		if free == 0 {
			continue
		}
	more:
		for {
			select {
			case <-slots:
				free++
			default:
				break more
			}
		}
		fctx, fcancel := context.WithTimeout(rctx, 200*time.Millisecond)
		batch, err := cons.Fetch(free, jetstream.FetchContext(fctx))
		got := 0
		if err == nil {
			for m := range batch.Messages() {
				got++
				work <- m
			}
		}
		fcancel()
		for ; got < free; got++ {
			slots <- struct{}{}
		}
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// natsTally reads the n results of the results stream (a consumer of its
// own; the run is over) and counts them.
func natsTally(ctx context.Context, js jetstream.JetStream, results string, n int) (resultTally, error) {
	var t resultTally
	cons, err := js.CreateOrUpdateConsumer(ctx, natsjetstream.StreamName(results), jetstream.ConsumerConfig{
		Durable: "tally", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1})
	if err != nil {
		return t, fmt.Errorf("read results: %w", err)
	}
	for t.total() < n {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return t, fmt.Errorf("read results: %w", err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			t.add(m.Data())
			_ = m.Ack()
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return t, fmt.Errorf("read results: %w", err)
		}
		if got == 0 {
			break // fewer than n: the caller counts the missing as failed
		}
	}
	return t, nil
}

// runPostgres: 3k requests in a fresh PostgreSQL.
func runPostgres(ctx context.Context, o options) (figures, error) {
	const n = 3_000
	pg, err := testenv.StartPostgresProcess()
	if err != nil {
		return nil, err
	}
	defer pg.Stop()
	db, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	topics := func(run int) (string, string) {
		return "bench-requests-" + strconv.Itoa(run), "bench-results-" + strconv.Itoa(run)
	}
	table := func(topic string) string { return `"watermill_` + topic + `"` }
	brokers := wmtransport.NewBrokers()
	if err := brokers.Register(postgres.Name, postgres.Factory); err != nil {
		return nil, err
	}
	dl := time.Now().Add(time.Hour)
	r := brokerRun{n: n, brokers: brokers, topics: topics,
		options: func(int) wmtransport.Options {
			bo, _ := json.Marshal(postgres.Options{URL: pg.URL})
			return wmtransport.Options{Broker: postgres.Name, BrokerOptions: bo}
		},
		setup: func(ctx context.Context, run int) error {
			queue, results := topics(run)
			for _, topic := range []string{queue, results} {
				if _, err := db.Exec(ctx, `CREATE TABLE `+table(topic)+` ("offset" SERIAL PRIMARY KEY, "uuid" VARCHAR(36) NOT NULL,
					"payload" bytea, "metadata" JSON, "acked" BOOLEAN NOT NULL DEFAULT FALSE, "created_at" TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
					return err
				}
			}
			rows := make([][]any, n)
			for i := range rows {
				rows[i] = []any{"b-" + strconv.Itoa(i), benchPayload(i, dl), "{}"}
			}
			_, err := db.CopyFrom(ctx, pgx.Identifier{"watermill_" + queue}, []string{"uuid", "payload", "metadata"}, pgx.CopyFromRows(rows))
			return err
		},
		count: func(ctx context.Context, run int) (int64, error) {
			_, results := topics(run)
			var c int64
			err := db.QueryRow(ctx, `SELECT count(*) FROM `+table(results)).Scan(&c)
			return c, err
		},
		tally: func(ctx context.Context, run int) (resultTally, error) {
			_, results := topics(run)
			var t resultTally
			rows, err := db.Query(ctx, `SELECT payload FROM `+table(results))
			if err != nil {
				return t, fmt.Errorf("read results: %w", err)
			}
			defer rows.Close()
			for rows.Next() {
				var b []byte
				if err := rows.Scan(&b); err != nil {
					return t, fmt.Errorf("read results: %w", err)
				}
				t.add(b)
			}
			return t, rows.Err()
		},
		baseline: func(ctx context.Context, run int, gw string) error {
			queue, results := topics(run)
			return postgresBaseline(ctx, pg.URL, table(queue), table(results), gw, n)
		},
	}
	return r.measure(ctx, "postgres", o)
}

// postgresBaseline is the plain loop: 64 workers, each in a transaction per
// request: take one row (FOR UPDATE SKIP LOCKED), POST it, INSERT the
// result, DELETE the row, COMMIT (sluice's postgres broker writes the
// result in the same transaction too).
func postgresBaseline(ctx context.Context, url, queue, results, gw string, n int) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.MaxConns = brokerConcurrency + 2
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: brokerConcurrency, MaxConnsPerHost: brokerConcurrency}}
	defer client.CloseIdleConnections()
	var done atomic.Int64
	errs := make(chan error, brokerConcurrency)
	var wg sync.WaitGroup
	one := func() (bool, error) {
		tx, err := db.Begin(ctx)
		if err != nil {
			return false, err
		}
		defer func() { _ = tx.Rollback(ctx) }()
		var off int64
		var uuid string
		var payload []byte
		err = tx.QueryRow(ctx, `SELECT "offset", uuid, payload FROM `+queue+` WHERE acked = false ORDER BY "offset" LIMIT 1 FOR UPDATE SKIP LOCKED`).Scan(&off, &uuid, &payload)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		res := baselineResult(ctx, client, gw, payload)
		if _, err := tx.Exec(ctx, `INSERT INTO `+results+` (uuid, payload, metadata) VALUES ($1, $2, '{}')`, uuid, res); err != nil {
			return false, err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+queue+` WHERE "offset" = $1`, off); err != nil {
			return false, err
		}
		return true, tx.Commit(ctx)
	}
	for range brokerConcurrency {
		wg.Go(func() {
			for done.Load() < int64(n) {
				ok, err := one()
				if err != nil {
					errs <- err
					return
				}
				if ok {
					done.Add(1)
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

func readAll(resp *http.Response) ([]byte, error) { return io.ReadAll(resp.Body) }
