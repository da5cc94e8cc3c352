package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/transports/internal/rigs/brokere2e"
	"github.com/sluice-io/sluice/transports/wmtransport"
)

// TestServerRestartMidRun runs sluice over PostgreSQL, crashes the server
// (immediate shutdown: every connection and open transaction cut) once a
// third of the requests are answered, starts it again a second later on the
// same data, and checks that every request is answered; duplicates (a
// result committed whose request's delete was cut) are logged.
func TestServerRestartMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts postgres")
	}
	srv := testenv.StartPostgres(t)
	db := pool(t, srv.URL)
	const queue, results, n = "rs-requests", "rs-results", 400
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := brokere2e.IDs("rs", n)
	for _, id := range ids {
		if err := produce(ctx, db, queue, brokere2e.Request(id)); err != nil {
			t.Fatalf("produce %s: %v", id, err)
		}
	}
	tp := newTransport(t, srv.URL).(*wmtransport.Transport)
	brokere2e.Run(t, tp, adapters(t), queue, results, brokere2e.Gateway(t, 40*time.Millisecond), 16)

	tally := brokere2e.NewTally()
	read := func() {
		got, err := consumeResults(ctx, db, results, 256)
		if err != nil {
			time.Sleep(100 * time.Millisecond) // the server is down
			return
		}
		tally.Add(t, got)
		if len(got) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	restarted := false
	deadline := time.Now().Add(25 * time.Second)
	for tally.Answered() < n && time.Now().Before(deadline) {
		read()
		if !restarted && tally.Answered() >= n/3 {
			restarted = true
			t.Logf("crashing postgres after %d results", tally.Answered())
			srv.Crash()
			time.Sleep(time.Second)
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !restarted {
		t.Fatalf("only %d of %d results before the deadline; the server was not restarted", tally.Answered(), n)
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		read()
	}
	dups := tally.Check(t, ids)
	t.Logf("%d requests, %d answered, %d duplicate results", n, tally.Answered(), dups)
}

// adapters are the gates the deployment needs (the constant gate).
func adapters(t testing.TB) app.Adapters {
	t.Helper()
	ad := app.NewAdapters()
	if err := ad.Gates.Register(constant.Type, constant.Factory); err != nil {
		t.Fatal(err)
	}
	return ad
}
