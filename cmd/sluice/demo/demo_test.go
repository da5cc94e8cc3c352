package demo

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func TestDemoAccountsForEveryRequest(t *testing.T) {
	sum, err := Run(context.Background(), Options{Requests: 300, RetryBase: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Results != sum.Requests || sum.Missing != 0 || sum.Duplicates != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if sum.Succeeded == 0 || sum.DeadlineExceeded == 0 || sum.Invalid == 0 || sum.Retries == 0 {
		t.Errorf("demo sample lacks a category: %+v", sum)
	}
	if got := sum.Succeeded + sum.Failed + sum.DeadlineExceeded + sum.Invalid + sum.Cancelled + sum.GateDropped; got != sum.Results {
		t.Errorf("categories add up to %d, results %d", got, sum.Results)
	}
}

// The memory load runs every request to its result, with or without HTTP.
func TestMemoryLoad(t *testing.T) {
	r, err := MemoryLoad(context.Background(), LoadOptions{Requests: 2000, Dispatcher: okDispatcher{}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 2000 || r.PerSecond <= 0 {
		t.Errorf("load %+v", r)
	}
}
