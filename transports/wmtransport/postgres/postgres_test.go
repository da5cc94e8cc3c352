package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/transporttest"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/postgres"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("time.Sleep"))
}

func brokers() *wmtransport.Brokers {
	reg := wmtransport.NewBrokers()
	if err := reg.Register(postgres.Name, postgres.Factory); err != nil {
		panic(err)
	}
	return reg
}

// newTransport builds the watermill transport over the postgres broker at url.
func newTransport(t testing.TB, url string) transport.Transport {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"broker": postgres.Name, "close_timeout_ms": 1000,
		"broker_options": map[string]any{"url": url, "poll_interval_ms": 50, "retry_interval_ms": 100}})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := wmtransport.Factory(brokers())(raw, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// table is watermill-sql's queue table of topic.
func table(topic string) string { return `"watermill_` + topic + `"` }

// ensureTable creates topic's queue table as the broker does (bytea
// payload), again when it lost a race with the broker creating it.
func ensureTable(ctx context.Context, db *pgxpool.Pool, topic string) error {
	return testenv.CreateRacing(ctx, func(ctx context.Context) error {
		_, err := db.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table(topic)+` (
		"offset" SERIAL PRIMARY KEY, "uuid" VARCHAR(36) NOT NULL, "payload" bytea DEFAULT NULL,
		"metadata" JSON DEFAULT NULL, "acked" BOOLEAN NOT NULL DEFAULT FALSE,
		"created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT CURRENT_TIMESTAMP)`)
		return err
	})
}

// produce inserts a request row as a plain SQL producer would.
func produce(ctx context.Context, db *pgxpool.Pool, topic string, payload []byte) error {
	if err := ensureTable(ctx, db, topic); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `INSERT INTO `+table(topic)+` (uuid, payload, metadata) VALUES (gen_random_uuid()::text, $1, '{}')`, payload)
	return err
}

// consumeResults deletes and returns up to n rows of topic's table.
func consumeResults(ctx context.Context, db *pgxpool.Pool, topic string, n int) ([][]byte, error) {
	if err := ensureTable(ctx, db, topic); err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, `DELETE FROM `+table(topic)+` WHERE "offset" IN (SELECT "offset" FROM `+table(topic)+
		` ORDER BY "offset" LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING payload`, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts postgres")
	}
	srv := testenv.StartPostgres(t)
	db := pool(t, srv.URL)
	var seq atomic.Int64
	transporttest.Run(t, transporttest.Harness{
		Features: transporttest.Features{
			Ordering:            transporttest.Unordered,
			AtLeastOnce:         true,
			DelayedRequeue:      true,
			Results:             true,
			Reopen:              true,
			ConcurrentConsumers: true,
		},
		New: func(t testing.TB) transport.Transport { return newTransport(t, srv.URL) },
		Queue: func(testing.TB) transport.Queue {
			n := seq.Add(1)
			return transport.Queue{ID: fmt.Sprint("q", n), Name: fmt.Sprint("requests-", n), ResultName: fmt.Sprint("results-", n)}
		},
		Publish: func(t testing.TB, q transport.Queue, payload []byte) {
			if err := produce(context.Background(), db, q.Name, payload); err != nil {
				t.Fatalf("produce: %v", err)
			}
		},
		Results: func(t testing.TB, q transport.Queue, n int, timeout time.Duration) [][]byte {
			var out [][]byte
			for deadline := time.Now().Add(timeout); len(out) < n && time.Now().Before(deadline); {
				got, err := consumeResults(context.Background(), db, q.ResultName, n-len(out))
				if err != nil {
					t.Fatalf("read results: %v", err)
				}
				out = append(out, got...)
				if len(out) < n {
					time.Sleep(50 * time.Millisecond)
				}
			}
			return out
		},
	})
}
