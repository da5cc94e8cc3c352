package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
)

// The scale-out brokers of the generic Watermill transport (transport
// "watermill"): NATS JetStream (one nats-server node) and PostgreSQL. The
// harness talks to each as a plain producer and consumer would, in the
// broker's message form (transports/wmtransport/...).

// wmDeployment is the transport config of a watermill deployment on broker.
func wmDeployment(broker string, opts map[string]any, queue, results, gw string) map[string]any {
	return map[string]any{
		"broker": broker, "broker_options": opts, "result_queue_name": results,
		"queues": []map[string]any{{"queue_name": queue, "igw_base_url": gw}},
	}
}

// ---- watermill + nats-jetstream ----

type natsBroker struct {
	url, queue, results string
	nc                  *nats.Conn
	js                  jetstream.JetStream
}

func openNATS(ctx context.Context, r *rig, _ brokerTweak) (broker, error) {
	srv, err := testenv.StartNATSClusterProcess(1)
	if err != nil {
		return nil, err
	}
	r.onClose(srv.Stop)
	nc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b := &natsBroker{url: srv.URL, queue: "chaos-requests", results: "chaos-results", nc: nc, js: js}
	// The streams as the broker creates them (work queue, file storage),
	// made here so the harness can publish and read before sluice runs.
	for _, topic := range []string{b.queue, b.results, b.queue + "_dead"} {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsjetstream.StreamName(topic), Subjects: []string{topic},
			Storage: jetstream.FileStorage, Retention: jetstream.WorkQueuePolicy, Duplicates: 120 * time.Second})
		if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			nc.Close()
			return nil, fmt.Errorf("create stream %s: %w", topic, err)
		}
	}
	return b, nil
}

func (b *natsBroker) deployment(gw string) (string, map[string]any, string) {
	return "watermill", wmDeployment("nats-jetstream",
		map[string]any{"url": b.url, "ack_wait_ms": 2000, "fetch_wait_ms": 200}, b.queue, b.results, gw), ""
}

func (b *natsBroker) send(ctx context.Context, msgs []outMsg) error {
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for i, m := range msgs {
		nm := nats.NewMsg(b.queue)
		nm.Data = m.body
		nm.Header.Set(natsjetstream.UUIDHeader, "h-"+strconv.FormatInt(time.Now().UnixNano(), 36)+"-"+strconv.Itoa(i))
		f, err := b.js.PublishMsgAsync(nm)
		if err != nil {
			return err
		}
		futs = append(futs, f)
		if len(futs) == 500 || i == len(msgs)-1 {
			for _, f := range futs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			futs = futs[:0]
		}
	}
	return nil
}

func (b *natsBroker) readResults(ctx context.Context, l *ledger) {
	var cons jetstream.Consumer
	for cons == nil && ctx.Err() == nil {
		c, err := b.js.CreateOrUpdateConsumer(ctx, natsjetstream.StreamName(b.results),
			jetstream.ConsumerConfig{Durable: "chaos", AckPolicy: jetstream.AckExplicitPolicy})
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		cons = c
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		for m := range batch.Messages() {
			id, code := resultID(m.Data())
			l.record(id, code, time.Now())
			_ = m.Ack()
		}
	}
}

func (b *natsBroker) deadLetters(ctx context.Context) (int, error) {
	s, err := b.js.Stream(ctx, natsjetstream.StreamName(b.queue+"_dead"))
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.State.Msgs), nil
}

func (b *natsBroker) close() { b.nc.Close() }

// ---- watermill + postgres ----

type pgBroker struct {
	url, queue, results string
	db                  *pgxpool.Pool
}

func openPostgres(ctx context.Context, r *rig, _ brokerTweak) (broker, error) {
	srv, err := testenv.StartPostgresProcess()
	if err != nil {
		return nil, err
	}
	r.onClose(srv.Stop)
	db, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		return nil, err
	}
	b := &pgBroker{url: srv.URL, queue: "chaos_requests", results: "chaos_results", db: db}
	for _, topic := range []string{b.queue, b.results, b.queue + "_dead"} {
		if err := b.ensureTable(ctx, topic); err != nil {
			db.Close()
			return nil, fmt.Errorf("create table %s: %w", topic, err)
		}
	}
	return b, nil
}

// pgTable is watermill-sql's queue table of topic.
func pgTable(topic string) string { return `"watermill_` + topic + `"` }

// ensureTable creates topic's table as the broker does (bytea payload).
func (b *pgBroker) ensureTable(ctx context.Context, topic string) error {
	_, err := b.db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+pgTable(topic)+` (
		"offset" SERIAL PRIMARY KEY, "uuid" VARCHAR(36) NOT NULL, "payload" bytea DEFAULT NULL,
		"metadata" JSON DEFAULT NULL, "acked" BOOLEAN NOT NULL DEFAULT FALSE,
		"created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT CURRENT_TIMESTAMP)`)
	return err
}

func (b *pgBroker) deployment(gw string) (string, map[string]any, string) {
	return "watermill", wmDeployment("postgres", map[string]any{"url": b.url, "poll_interval_ms": 100}, b.queue, b.results, gw), ""
}

func (b *pgBroker) send(ctx context.Context, msgs []outMsg) error {
	for i := 0; i < len(msgs); i += 500 {
		var batch pgx.Batch
		for _, m := range msgs[i:min(i+500, len(msgs))] {
			batch.Queue(`INSERT INTO `+pgTable(b.queue)+` (uuid, payload, metadata) VALUES (gen_random_uuid()::text, $1, '{}')`, m.body)
		}
		if err := b.db.SendBatch(ctx, &batch).Close(); err != nil {
			return err
		}
	}
	return nil
}

func (b *pgBroker) readResults(ctx context.Context, l *ledger) {
	for ctx.Err() == nil {
		rows, err := b.db.Query(ctx, `DELETE FROM `+pgTable(b.results)+` WHERE "offset" IN (SELECT "offset" FROM `+
			pgTable(b.results)+` ORDER BY "offset" LIMIT 500 FOR UPDATE SKIP LOCKED) RETURNING payload`)
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		n := 0
		for rows.Next() {
			var p []byte
			if rows.Scan(&p) == nil {
				id, code := resultID(p)
				l.record(id, code, time.Now())
				n++
			}
		}
		rows.Close()
		if n < 500 {
			sleep(ctx, 20*time.Millisecond)
		}
	}
}

func (b *pgBroker) deadLetters(ctx context.Context) (int, error) {
	var n int
	err := b.db.QueryRow(ctx, `SELECT count(*) FROM `+pgTable(b.queue+"_dead")).Scan(&n)
	return n, err
}

func (b *pgBroker) close() { b.db.Close() }
