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
		{"nats-jetstream", runNATSJetStream},
		{"postgres", runPostgres},
	}
}

// brokerConcurrency is the requests in flight, sluice's default and the baseline's workers.
const brokerConcurrency = 64

// brokerRun measures one broker: setup prepares run i's request and result
// topics with n requests; count reports the results of run i.
type brokerRun struct {
	n        int
	options  func(run int) wmtransport.Options
	brokers  *wmtransport.Brokers
	setup    func(ctx context.Context, run int) error
	count    func(ctx context.Context, run int) (int64, error)
	baseline func(ctx context.Context, run int, gw string) error
	topics   func(run int) (queue, results string)
}

func (b brokerRun) measure(ctx context.Context, o options) (figures, error) {
	sim, err := simulator.New(simulator.Config{Capacity: brokerConcurrency})
	if err != nil {
		return nil, err
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer sim.Close()
	var sluiceRate, baseRate []float64
	for i := range o.runs {
		run := 2 * i
		if err := b.setup(ctx, run); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		rate, err := b.sluice(ctx, run, gw)
		if err != nil {
			return nil, fmt.Errorf("sluice: %w", err)
		}
		sluiceRate = append(sluiceRate, rate)
		run++
		if err := b.setup(ctx, run); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
		start := time.Now()
		if err := b.baseline(ctx, run, gw); err != nil {
			return nil, fmt.Errorf("baseline: %w", err)
		}
		baseRate = append(baseRate, float64(b.n)/time.Since(start).Seconds())
	}
	t, base := median(sluiceRate), median(baseRate)
	return figures{"requests": float64(b.n), "throughput": t, "baseline": base, "ratio": t / base}, nil
}

// sluice runs a deployment over the backlog of run until its n results are
// in and returns requests per second (from when its pipeline runs).
func (b brokerRun) sluice(ctx context.Context, run int, gw string) (float64, error) {
	queue, results := b.topics(run)
	tp, err := wmtransport.New(b.brokers, b.options(run), transport.Env{})
	if err != nil {
		return 0, err
	}
	cfg := &config.Config{Transport: wmtransport.Name, MetricsPort: -1, HealthPort: -1,
		TransportConfig: config.TransportConfig{ResultQueueName: results,
			Queues: []config.Queue{{Queue: transport.Queue{Name: queue}, IGWBaseURL: gw}}}}
	a, err := newApp(cfg, app.Options{Transport: tp})
	if err != nil {
		_ = tp.Close()
		return 0, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(rctx) }()
	// The clock starts once the pipeline runs, as in the other transport
	// scenarios (the backlog is already there).
	for !a.Pipeline().Ready() {
		select {
		case err := <-done:
			return 0, fmt.Errorf("sluice stopped: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	start := time.Now()
	limit := time.After(5 * time.Minute)
	for {
		got, err := b.count(ctx, run)
		if err != nil {
			return 0, err
		}
		if got >= int64(b.n) {
			break
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("sluice stopped: %v", err)
		case <-limit:
			return 0, fmt.Errorf("only %d of %d results after 5m", got, b.n)
		case <-time.After(10 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(b.n) / elapsed.Seconds(), nil
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
		baseline: func(ctx context.Context, run int, gw string) error {
			queue, results := topics(run)
			return natsBaseline(ctx, js, queue, results, gw, n)
		},
	}
	return r.measure(ctx, o)
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
				req, err := wire.Decode(m.Data())
				if err != nil {
					fail(err)
					return
				}
				res, err := postJSON(rctx, client, gw, req)
				if err != nil {
					fail(err)
					return
				}
				if _, err := js.Publish(rctx, results, res.Marshal()); err != nil {
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
		baseline: func(ctx context.Context, run int, gw string) error {
			queue, results := topics(run)
			return postgresBaseline(ctx, pg.URL, table(queue), table(results), gw, n)
		},
	}
	return r.measure(ctx, o)
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
		req, err := wire.Decode(payload)
		if err != nil {
			return false, err
		}
		res, err := postJSON(ctx, client, gw, req)
		if err != nil {
			return false, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+results+` (uuid, payload, metadata) VALUES ($1, $2, '{}')`, uuid, res.Marshal()); err != nil {
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
