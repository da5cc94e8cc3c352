package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/wmtransport/postgres"
)

// refuseCreates makes the server refuse the first n CREATE TABLE
// statements of topic's table (an event trigger raising an error, as a
// lost race on the catalog would) and returns a count of the statements
// tried so far. name keeps the trigger's objects apart from another one's.
func refuseCreates(t *testing.T, db *pgxpool.Pool, name, topic string, n int) (tried func() int) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{
		fmt.Sprintf(`CREATE SEQUENCE tries_%s`, name),
		fmt.Sprintf(`CREATE FUNCTION refuse_%[1]s() RETURNS event_trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF position(%[2]s IN current_query()) > 0 THEN
				IF nextval('tries_%[1]s') <= %[3]d THEN
					RAISE EXCEPTION 'CREATE TABLE refused (test)';
				END IF;
			END IF;
		END $$`, name, "'\"watermill_"+topic+"\"'", n),
		fmt.Sprintf(`CREATE EVENT TRIGGER refuse_%[1]s ON ddl_command_start WHEN TAG IN ('CREATE TABLE') EXECUTE FUNCTION refuse_%[1]s()`, name),
	}
	for _, s := range stmts {
		if _, err := db.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() { _, _ = db.Exec(ctx, fmt.Sprintf(`DROP EVENT TRIGGER refuse_%s`, name)) })
	return func() int {
		t.Helper()
		var v int
		var called bool
		if err := db.QueryRow(ctx, fmt.Sprintf(`SELECT last_value, is_called FROM tries_%s`, name)).Scan(&v, &called); err != nil {
			t.Fatal(err)
		}
		if !called {
			return 0
		}
		return v
	}
}

// TestTableCreationRetried: creating a topic's table is tried again when
// it fails, as when another replica creates it at the same moment: a
// result table written in a delivery's transaction 4 times in all, a
// subscription's table 5 times, with growing waits in between; the write
// or the subscription succeeds once a try does, and fails with the
// server's error naming the table when none did.
func TestTableCreationRetried(t *testing.T) {
	srv := testenv.StartPostgres(t)
	db := pool(t, srv.URL)
	ctx := context.Background()
	b, err := postgres.New(postgres.Options{URL: srv.URL, PollIntervalMS: 50}, transport.Env{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	// deliver subscribes to a fresh request topic and returns a delivery
	// of it, whose context carries its transaction.
	deliver := func(t *testing.T, topic string) *message.Message {
		t.Helper()
		if err := produce(ctx, db, topic, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		sub, err := b.Subscriber(topic, 1)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		ch, err := sub.Subscribe(sctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); _ = sub.Close() })
		select {
		case m := <-ch:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery")
			return nil
		}
	}
	result := func(m *message.Message) *message.Message {
		out := message.NewMessage(m.UUID, []byte(`"answer"`))
		out.SetContext(m.Context())
		return out
	}
	// subscribe subscribes to topic until the test ends.
	subscribe := func(t *testing.T, topic string) error {
		t.Helper()
		sub, err := b.Subscriber(topic, 1)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(ctx)
		t.Cleanup(func() { cancel(); _ = sub.Close() })
		_, err = sub.Subscribe(sctx, topic)
		return err
	}
	// gaveUp checks a creation refused every time: err is the refusal,
	// naming topic, after tries tries and at least waits since start.
	gaveUp := func(t *testing.T, err error, topic string, tried func() int, tries int, start time.Time, waits time.Duration) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "create the table of "+topic) || !strings.Contains(err.Error(), "refused (test)") {
			t.Fatalf("%v; want the refusal, naming the table", err)
		}
		if n := tried(); n != tries {
			t.Errorf("%d CREATE TABLE tries, want %d", n, tries)
		}
		if took := time.Since(start); took < waits {
			t.Errorf("gave up after %s, before its waits (%s in all) ran", took, waits)
		}
	}

	t.Run("result table, refused twice", func(t *testing.T) {
		tried := refuseCreates(t, db, "res2", "res-two", 2)
		m := deliver(t, "req-two")
		if err := b.Publisher().Publish("res-two", result(m)); err != nil {
			t.Fatalf("publish: %v", err)
		}
		m.Ack()
		if n := tried(); n != 3 {
			t.Errorf("%d CREATE TABLE tries, want 3", n)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := consumeResults(ctx, db, "res-two", 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no result written")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("result table, always refused", func(t *testing.T) {
		tried := refuseCreates(t, db, "resall", "res-all", 1000)
		m := deliver(t, "req-all")
		start := time.Now()
		err := b.Publisher().Publish("res-all", result(m))
		m.Nack()
		gaveUp(t, err, "res-all", tried, 4, start, (20+40+60)*time.Millisecond)
	})

	t.Run("subscription table, refused twice", func(t *testing.T) {
		tried := refuseCreates(t, db, "sub2", "sub-two", 2)
		if err := subscribe(t, "sub-two"); err != nil {
			t.Fatalf("subscribe: %v", err)
		}
		if n := tried(); n != 3 {
			t.Errorf("%d CREATE TABLE tries, want 3", n)
		}
	})

	t.Run("subscription table, always refused", func(t *testing.T) {
		tried := refuseCreates(t, db, "suball", "sub-all", 1000)
		start := time.Now()
		gaveUp(t, subscribe(t, "sub-all"), "sub-all", tried, 5, start, (50+100+150+200)*time.Millisecond)
	})
}
