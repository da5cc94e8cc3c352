package main

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
)

// The example configs of the watermill transport, one per broker
// (examples/<broker>/transport-config.json), as the other transports'
// examples in examples_test.go: each validates, and `sluice serve` runs it
// against a real server until one request got its result.
var exampleBrokers = []string{"nats-jetstream", "postgres"}

func TestBrokerExamplesValidate(t *testing.T) {
	for _, b := range exampleBrokers {
		t.Run(b, func(t *testing.T) {
			out, err := run(t, "validate", "--transport", "watermill", "--transport-config-file", examplePath(b))
			if err != nil || !strings.HasPrefix(out, "ok: transport watermill") {
				t.Fatalf("validate %s: %q %v", b, out, err)
			}
		})
	}
}

func TestBrokerExamplesServe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and postgres")
	}
	gw := startSim(t, simulator.Config{})
	setups := map[string]func(t *testing.T, queue, results string) exampleServer{
		"nats-jetstream": natsExampleServer,
		"postgres":       postgresExampleServer,
	}
	for _, b := range exampleBrokers {
		t.Run(b, func(t *testing.T) {
			data, err := os.ReadFile(examplePath(b))
			if err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := json.Unmarshal(data, &doc); err != nil {
				t.Fatal(err)
			}
			queues := doc["queues"].([]any)
			for _, q := range queues {
				q.(map[string]any)["igw_base_url"] = gw
			}
			queue, results := queues[0].(map[string]any)["queue_name"].(string), doc["result_queue_name"].(string)
			srv := setups[b](t, queue, results)
			bo := doc["broker_options"].(map[string]any)
			for k, v := range srv.options {
				bo[k] = v
			}
			raw, err := json.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			f := writeFile(t, "transport-config.json", string(raw))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, _, err := runCLI(t, ctx, "", "serve", "--transport", "watermill", "--transport-config-file", f,
					"--metrics-port", "-1", "--health-port", "-1", "--drain-timeout", "5s")
				done <- err
			}()
			srv.produce(t, queue, []byte(`{"id":"ex-1","deadline":`+itoa(time.Now().Add(time.Hour).Unix())+`,"payload":{"prompt":"hi"},"metadata":{"job_id":"j"}}`))
			res, err := wire.DecodeResult(srv.result(t, results))
			cancel()
			if serr := <-done; serr != nil {
				t.Errorf("serve: %v", serr)
			}
			if err != nil || res.ID != "ex-1" || !res.OK() {
				t.Fatalf("result %+v, %v: want a success for ex-1", res, err)
			}
		})
	}
}

// natsExampleServer is a one-node JetStream (the example's replicas: 1).
func natsExampleServer(t *testing.T, queue, results string) exampleServer {
	cl := testenv.StartNATSCluster(t, 1)
	nc, err := nats.Connect(cl.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, topic := range []string{queue, results} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsjetstream.StreamName(topic), Subjects: []string{topic},
			Retention: jetstream.WorkQueuePolicy}); err != nil {
			t.Fatal(err)
		}
	}
	return exampleServer{
		options: map[string]any{"url": cl.URL, "replicas": 1},
		produce: func(t *testing.T, queue string, payload []byte) {
			if _, err := js.Publish(ctx, queue, payload); err != nil {
				t.Fatal(err)
			}
		},
		result: func(t *testing.T, results string) []byte {
			cons, err := js.CreateOrUpdateConsumer(ctx, natsjetstream.StreamName(results), jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
			if err != nil {
				t.Fatal(err)
			}
			m, err := cons.Next(jetstream.FetchMaxWait(20 * time.Second))
			if err != nil {
				t.Fatalf("no result on %s: %v", results, err)
			}
			_ = m.Ack()
			return m.Data()
		},
	}
}

// postgresExampleServer is a fresh PostgreSQL; requests and results are rows
// of watermill-sql's queue tables.
func postgresExampleServer(t *testing.T, _, _ string) exampleServer {
	pg := testenv.StartPostgres(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	table := func(topic string) string { return `"watermill_` + topic + `"` }
	create := func(topic string) {
		// sluice creates the same tables meanwhile: a lost race is tried again
		err := testenv.CreateRacing(ctx, func(ctx context.Context) error {
			_, err := c.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table(topic)+` ("offset" SERIAL PRIMARY KEY, "uuid" VARCHAR(36) NOT NULL,
			"payload" bytea, "metadata" JSON, "acked" BOOLEAN NOT NULL DEFAULT FALSE, "created_at" TIMESTAMPTZ NOT NULL DEFAULT now())`)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return exampleServer{
		options: map[string]any{"url": pg.URL},
		produce: func(t *testing.T, queue string, payload []byte) {
			create(queue)
			if _, err := c.Exec(ctx, `INSERT INTO `+table(queue)+` (uuid, payload, metadata) VALUES (gen_random_uuid()::text, $1, '{}')`, payload); err != nil {
				t.Fatal(err)
			}
		},
		result: func(t *testing.T, results string) []byte {
			create(results)
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				var b []byte
				err := c.QueryRow(ctx, `DELETE FROM `+table(results)+` WHERE "offset" = (SELECT min("offset") FROM `+table(results)+`) RETURNING payload`).Scan(&b)
				if err == nil {
					return b
				}
			}
			t.Fatalf("no result in %s within 20s", table(results))
			return nil
		},
	}
}
