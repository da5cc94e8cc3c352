// Package postgres is the PostgreSQL broker of sluice's generic Watermill
// transport (transport "watermill", broker "postgres"): a durable queue in
// one table per topic, through watermill-sql v4 (github.com/ThreeDotsLabs/
// watermill-sql/v4) on the pgx driver.
//
// Tables are watermill-sql's queue schema ("watermill_<topic>": offset,
// uuid, payload, metadata, acked, created_at), created on first use. A
// subscription reads one row at a time inside a transaction (SELECT ... FOR
// UPDATE SKIP LOCKED, read committed) that stays open while its request
// runs and deletes the row when the core acks it (a nack or a lost
// connection rolls back: the row is there again). window parallel
// subscriptions per queue (wmtransport.Parallel) run up to window requests
// at once, each holding one connection of the queue's own pool. Why not
// watermill-sql's PostgreSQLQueueSchema as it is: its SELECT ... FOR UPDATE
// without SKIP LOCKED serialises every reader of a table behind the first
// one's lock, and it reads batches of 100 rows in one transaction (with
// more than one row a close can mark unread rows done).
//
// Writes that end a delivery (its result, re-queued retry or dead letter)
// are inserted in the delivery's own transaction (watermill-sql puts it in
// the message's context; the transport passes its values along): the
// result and the delete of the request row commit together, so a crash or
// restart at any point neither loses a request nor writes its result twice
// (results to another database are not possible this way; every topic is a
// table of the same database).
//
// Retries use PostgreSQL natively: the publisher turns the transport's
// sluice_not_before into watermill's _watermill_delayed_until (the
// components/delay key), and readers skip rows not yet due, so a waiting
// retry holds no connection and no transaction.
package postgres

import (
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/retry"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

// Name is the broker's registry name.
const Name = "postgres"

// Options are the broker's options (broker_options).
type Options struct {
	// URL is the PostgreSQL connection URL (postgres://user:pass@host:port/db?sslmode=...). Required.
	URL string `json:"url"`
	// PayloadType is the payload column type of created tables: "bytea"
	// (default: any bytes) or "json" (watermill-sql's default).
	PayloadType string `json:"payload_type,omitempty"`
	// PollIntervalMS is how long an idle reader waits before it looks again (default 200).
	PollIntervalMS int `json:"poll_interval_ms,omitempty"`
	// RetryIntervalMS is how long a reader waits after an error, e.g. while the server restarts (default 500).
	RetryIntervalMS int `json:"retry_interval_ms,omitempty"`
	// ResendIntervalMS is how long a nacked row waits before it is read again (default 100).
	ResendIntervalMS int `json:"resend_interval_ms,omitempty"`
	// MaxConns bounds the publisher's connections (default 16); each queue's readers
	// have a pool of their own (window + 2).
	MaxConns int `json:"max_conns,omitempty"`
}

func (o *Options) setDefaults() {
	if o.PayloadType == "" {
		o.PayloadType = "bytea"
	}
	if o.PollIntervalMS == 0 {
		o.PollIntervalMS = 200
	}
	if o.RetryIntervalMS == 0 {
		o.RetryIntervalMS = 500
	}
	if o.ResendIntervalMS == 0 {
		o.ResendIntervalMS = 100
	}
	if o.MaxConns == 0 {
		o.MaxConns = 16
	}
}

// Validate reports options the broker cannot run with.
func (o *Options) Validate() error {
	var errs []error
	if o.URL == "" {
		errs = append(errs, errors.New("url: required (postgres://user:password@host:port/database)"))
	} else if _, err := pgxpool.ParseConfig(o.URL); err != nil {
		errs = append(errs, fmt.Errorf("url: %w", err))
	}
	if o.PayloadType != "bytea" && o.PayloadType != "json" {
		errs = append(errs, fmt.Errorf("payload_type %q: want \"bytea\" or \"json\"", o.PayloadType))
	}
	for name, v := range map[string]int{"poll_interval_ms": o.PollIntervalMS, "retry_interval_ms": o.RetryIntervalMS,
		"resend_interval_ms": o.ResendIntervalMS, "max_conns": o.MaxConns} {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s %d: must be positive", name, v))
		}
	}
	return errors.Join(errs...)
}

// Factory is the broker's wmtransport.BrokerFactory. It does no I/O.
func Factory(options json.RawMessage, env transport.Env) (wmtransport.Broker, error) {
	return wmtransport.BuildBroker(options, env, New)
}

// Broker is the PostgreSQL broker. It is safe for concurrent use.
type Broker struct {
	opts   Options
	log    watermill.LoggerAdapter
	schema schema
	pool   *pgxpool.Pool
	pub    *wsql.Publisher

	tables sync.Map // topics whose table exists
	// lost holds the delivery transactions a write failed in (aborted or
	// cut): see handBack.
	lost sync.Map

	mu    sync.Mutex
	pools []*pgxpool.Pool // the readers' pools
}

var (
	_ wmtransport.Broker        = (*Broker)(nil)
	_ wmtransport.HealthChecker = (*Broker)(nil)
)

// New builds the broker; its pools connect on first use.
func New(o Options, env transport.Env) (*Broker, error) {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// watermill-sql logs every reader's start and stop at info: debug here.
	b := &Broker{opts: o, log: watermill.NewSlogLoggerWithLevelMapping(log.With("broker", Name),
		map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})}
	b.schema = schema{wsql.PostgreSQLQueueSchema{
		GeneratePayloadType: func(string) string { return o.PayloadType },
		SubscribeBatchSize:  1,
	}}
	pool, err := b.newPool(o.MaxConns)
	if err != nil {
		return nil, err
	}
	pub, err := wsql.NewPublisher(wsql.BeginnerFromPgx(pool), wsql.PublisherConfig{SchemaAdapter: b.schema, AutoInitializeSchema: true}, b.log)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("publisher: %w", err)
	}
	b.pool, b.pub = pool, pub
	return b, nil
}

func (b *Broker) newPool(maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(b.opts.URL)
	if err != nil {
		return nil, fmt.Errorf("url: %w", err)
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("connection pool: %w", err)
	}
	return pool, nil
}

// Options returns the defaulted options.
func (b *Broker) Options() Options { return b.opts }

// Publisher implements wmtransport.Broker: an INSERT per publish call,
// returning once committed; sluice_not_before becomes the row's
// _watermill_delayed_until.
func (b *Broker) Publisher() message.Publisher { return publisher{b} }

type publisher struct{ b *Broker }

func (p publisher) Publish(topic string, ms ...*message.Message) error {
	for _, m := range ms {
		if v := m.Metadata.Get(transport.MetaNotBefore); v != "" {
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
				m.Metadata.Set(delay.DelayedUntilKey, time.UnixMilli(ms).UTC().Format(time.RFC3339Nano))
			}
		}
	}
	for _, m := range ms {
		tx, ok := wsql.TxFromContext(m.Context())
		if !ok {
			if err := p.b.pub.Publish(topic, m); err != nil {
				return fmt.Errorf("insert into %s: %w", p.b.schema.MessagesTable(topic), err)
			}
			continue
		}
		// The write that ends a delivery goes into the transaction that
		// read it: committed with the delete of the request row, or rolled
		// back with it (no second result after a crash).
		if err := p.b.ensureTable(m.Context(), topic); err != nil {
			return err
		}
		txPub, err := wsql.NewPublisher(tx, wsql.PublisherConfig{SchemaAdapter: p.b.schema}, p.b.log)
		if err != nil {
			return fmt.Errorf("publisher in the delivery's transaction: %w", err)
		}
		if err := txPub.Publish(topic, m); err != nil {
			// A failed statement ends a PostgreSQL transaction (and a cut
			// connection takes it along): the delivery is gone, its
			// request row is back in the queue once the transaction rolls back.
			p.b.lost.Store(txKey(tx), struct{}{})
			return fmt.Errorf("insert into %s in the delivery's transaction: %w: %w", p.b.schema.MessagesTable(topic), transport.ErrDeliveryLost, err)
		}
	}
	return nil
}

// ensureTable creates topic's table unless done before (outside any delivery's transaction).
func (b *Broker) ensureTable(ctx context.Context, topic string) error {
	if _, ok := b.tables.Load(topic); ok {
		return nil
	}
	qs, err := b.schema.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return err
	}
	// CREATE TABLE IF NOT EXISTS racing another one (another replica, a
	// producer) fails on the catalog's unique index: the second try sees
	// the table.
	create := func() (struct{}, error) {
		for _, q := range qs {
			if _, err := b.pool.Exec(ctx, q.Query, q.Args...); err != nil {
				if ctx.Err() != nil {
					return struct{}{}, backoff.Permanent(err)
				}
				return struct{}{}, err
			}
		}
		return struct{}{}, nil
	}
	// The waits do not end with ctx (as before: ctx only stops the tries).
	if _, err := backoff.Retry(context.WithoutCancel(ctx), create, backoff.WithBackOff(&retry.Linear{Step: createRetryStep}),
		backoff.WithMaxTries(createTries), backoff.WithMaxElapsedTime(0)); err != nil {
		return fmt.Errorf("create the table of %s: %w", topic, err)
	}
	b.tables.Store(topic, struct{}{})
	return nil
}

// Creating a table is tried createTries times in all, createRetryStep
// apart, then twice, three times that long (20, 40, 60 ms): the race with
// another creator clears at once. A subscription creating its table waits
// subscribeRetryStep longer each time, subscribeTries times in all.
const (
	createTries        = 4
	createRetryStep    = 20 * time.Millisecond
	subscribeTries     = 5
	subscribeRetryStep = 50 * time.Millisecond
)

// Close does nothing: Broker.Close closes the pool.
func (publisher) Close() error { return nil }

// Subscriber implements wmtransport.Broker: window readers of topic's
// table, one row each, over a pool of window + 2 connections.
func (b *Broker) Subscriber(topic string, window int) (message.Subscriber, error) {
	window = max(window, 1)
	pool, err := b.newPool(window + 2)
	if err != nil {
		return nil, err
	}
	noDeadline := time.Duration(0)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), wsql.SubscriberConfig{
		AckDeadline:    &noDeadline, // a request runs as long as it runs; the row stays locked meanwhile
		PollInterval:   time.Duration(b.opts.PollIntervalMS) * time.Millisecond,
		ResendInterval: time.Duration(b.opts.ResendIntervalMS) * time.Millisecond,
		RetryInterval:  time.Duration(b.opts.RetryIntervalMS) * time.Millisecond,
		SchemaAdapter:  b.schema,
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true},
	}, b.log)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("subscriber of %s: %w", topic, err)
	}
	b.mu.Lock()
	b.pools = append(b.pools, pool)
	b.mu.Unlock()
	return &subscriber{b: b, sub: sub, par: wmtransport.Parallel(sub, window), pool: pool}, nil
}

// txKey is the comparable identity of a delivery's transaction.
func txKey(tx wsql.Tx) any {
	if p, ok := tx.(wsql.PgxTx); ok {
		return p.Tx
	}
	return tx
}

// subscriber creates the table once, then subscribes window times.
type subscriber struct {
	b    *Broker
	sub  *wsql.Subscriber
	par  message.Subscriber
	pool *pgxpool.Pool
}

func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	// CREATE TABLE IF NOT EXISTS racing another one (a producer creating
	// the table at the same moment) fails on a unique index of the catalog:
	// try again.
	initialize := func() (struct{}, error) { return struct{}{}, s.sub.SubscribeInitialize(topic) }
	if _, err := backoff.Retry(ctx, initialize, backoff.WithBackOff(&retry.Linear{Step: subscribeRetryStep}),
		backoff.WithMaxTries(subscribeTries), backoff.WithMaxElapsedTime(0)); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("create the table of %s: %w", topic, err)
	}
	in, err := s.par.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	return s.b.handBack(ctx, in), nil
}

// handBack forwards the deliveries of in, and settles each at watermill-sql
// when the transport settled the copy it was given. A nack is watermill-sql's
// resend in the same transaction; that is right while the transaction
// lives, but a transaction a write failed in is aborted (or its connection
// is gone, the server crashed): resent in it, the delivery could never be
// answered. Such a delivery is acked instead: watermill-sql's delete then
// fails in the dead transaction, which rolls back, and the row is read again
// in a new one.
func (b *Broker) handBack(ctx context.Context, in <-chan *message.Message) <-chan *message.Message {
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for m := range in {
			c := m.Copy()
			c.SetContext(m.Context())
			select {
			case out <- c:
			case <-ctx.Done():
				m.Nack()
				continue
			}
			go func() {
				select {
				case <-c.Acked():
					m.Ack()
				case <-c.Nacked():
					tx, ok := wsql.TxFromContext(m.Context())
					if ok {
						if _, dead := b.lost.LoadAndDelete(txKey(tx)); dead {
							m.Ack()
							return
						}
					}
					m.Nack()
				case <-ctx.Done():
					m.Nack()
				}
			}()
		}
	}()
	return out
}

func (s *subscriber) Close() error {
	err := s.par.Close()
	s.pool.Close()
	return err
}

// CheckHealth implements wmtransport.HealthChecker (one ping).
func (b *Broker) CheckHealth(ctx context.Context) error {
	if err := b.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}

// Close closes the publisher's pool (the readers' pools close with their subscribers).
func (b *Broker) Close() error {
	err := b.pub.Close()
	b.pool.Close()
	return err
}

// schema is watermill-sql's queue schema read one due row at a time,
// skipping rows other readers hold.
type schema struct {
	wsql.PostgreSQLQueueSchema
}

// SelectQuery implements wsql.SchemaAdapter.
func (s schema) SelectQuery(params wsql.SelectQueryParams) (wsql.Query, error) {
	if params.ConsumerGroup != "" {
		return wsql.Query{}, errors.New("consumer groups are not supported by the queue schema")
	}
	return wsql.Query{Query: `SELECT "offset", uuid, payload, metadata FROM ` + s.MessagesTable(params.Topic) + `
		WHERE acked = false
		  AND ((metadata->>'` + delay.DelayedUntilKey + `') IS NULL
		       OR (metadata->>'` + delay.DelayedUntilKey + `')::timestamptz <= NOW())
		ORDER BY "offset" ASC
		LIMIT 1
		FOR UPDATE SKIP LOCKED`}, nil
}

// SubscribeIsolationLevel implements wsql.SchemaAdapter: read committed, so
// that a row deleted by another reader is skipped rather than a
// serialization error.
func (s schema) SubscribeIsolationLevel() stdsql.IsolationLevel { return stdsql.LevelReadCommitted }
