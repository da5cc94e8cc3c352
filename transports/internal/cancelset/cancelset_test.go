package cancelset

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
)

// TestEntries: each cancellation's entries parse back to it, a string of
// neither kind does not parse, and a cancellation of nothing has no entry.
func TestEntries(t *testing.T) {
	j1, r1 := transport.Cancellation{JobID: "j1"}, transport.Cancellation{RequestID: "r1"}
	for _, tc := range []struct {
		c      transport.Cancellation
		want   []string
		parsed []transport.Cancellation
	}{
		{j1, []string{"job:j1"}, []transport.Cancellation{j1}},
		{r1, []string{"req:r1"}, []transport.Cancellation{r1}},
		{transport.Cancellation{JobID: "j1", RequestID: "r1"}, []string{"job:j1", "req:r1"}, []transport.Cancellation{j1, r1}},
		{transport.Cancellation{}, nil, nil},
	} {
		got := Entries(tc.c)
		if len(got) != len(tc.want) {
			t.Fatalf("Entries(%+v) = %q, want %q", tc.c, got, tc.want)
		}
		for i, e := range got {
			if e != tc.want[i] {
				t.Fatalf("Entries(%+v) = %q, want %q", tc.c, got, tc.want)
			}
			if back, ok := Parse(e); !ok || back != tc.parsed[i] {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v", e, back, ok, tc.parsed[i])
			}
		}
	}
	for _, e := range []string{"", "job", "request:r1", "JOB:j1", "x:job:j1"} {
		if c, ok := Parse(e); ok {
			t.Fatalf("Parse(%q) = %+v, want no cancellation", e, c)
		}
	}
}

// TestHas: a request is cancelled by its job's entry or its id's, by
// nothing else, and by nothing before the first load.
func TestHas(t *testing.T) {
	var s Set
	inJob := &wire.Request{ID: "r1", Metadata: map[string]string{"job_id": "j1"}}
	alone := &wire.Request{ID: "r2"}
	other := &wire.Request{ID: "r3", Metadata: map[string]string{"job_id": "j2"}}
	if s.Has(inJob) || s.Has(alone) {
		t.Fatal("the zero Set cancels a request")
	}
	if s.Current("") || s.Current("0") {
		t.Fatal("the zero Set is current at an epoch")
	}
	s.Replace("3", []string{"job:j1", "req:r2", "req:j2", "job:r3", "noise"})
	if !s.Has(inJob) {
		t.Fatal("a request of a cancelled job is not cancelled")
	}
	if !s.Has(alone) {
		t.Fatal("a cancelled request is not cancelled")
	}
	if s.Has(other) {
		t.Fatal("a request is cancelled by entries of the other kind")
	}
	if !s.Current("3") || s.Current("4") {
		t.Fatal("Current does not name the epoch of the last load")
	}
	s.Replace("4", nil)
	if s.Has(inJob) || s.Has(alone) {
		t.Fatal("an entry outlives the load that dropped it")
	}
}

// TestWatch runs Watch against a real Redis: a reload reports what the
// copy did not hold (not held entries, forgotten ones or strings of
// neither kind),
// an announcement of a held entry is reported only with ReportRepeats, a
// new one always (and is then in the copy); Watch ends when closed closes
// and when its context ends.
func TestWatch(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	ctx := context.Background()
	now := time.Now()
	if err := c.ZAdd(ctx, "cs", redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "job:j0"},
		redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "job:j1"},
		redis.Z{Score: float64(now.Add(time.Hour).UnixMilli()), Member: "noise"},
		redis.Z{Score: float64(now.Add(-time.Hour).UnixMilli()), Member: "req:gone"}).Err(); err != nil {
		t.Fatal(err)
	}
	for _, repeats := range []bool{false, true} {
		t.Run("ReportRepeats="+strconv.FormatBool(repeats), func(t *testing.T) {
			s := Set{ReportRepeats: repeats}
			channel := "cs:notify:" + strconv.FormatBool(repeats) // a channel of its own: the last subtest's subscriber may linger
			s.Replace("1", []string{"req:held", "job:j0"})
			got := make(chan transport.Cancellation, 16)
			closed := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- s.Watch(ctx, c, channel, closed, func(ca transport.Cancellation) { got <- ca })
			}()
			waitSubscribed(t, c, channel)
			next := func() transport.Cancellation {
				t.Helper()
				select {
				case ca := <-got:
					return ca
				case <-time.After(10 * time.Second):
					t.Fatal("no cancellation reported in 10 s")
					return transport.Cancellation{}
				}
			}

			if err := s.Reload(ctx, c, "cs", "2"); err != nil {
				t.Fatal(err)
			}
			if ca := next(); ca != (transport.Cancellation{JobID: "j1"}) {
				t.Fatalf("the reload reported %+v, want job j1", ca)
			}
			if !s.Current("2") || !s.Has(&wire.Request{ID: "x", Metadata: map[string]string{"job_id": "j0"}}) ||
				s.Has(&wire.Request{ID: "gone"}) || s.Has(&wire.Request{ID: "held"}) {
				t.Fatal("the reload did not install the set at its epoch")
			}

			// Announced again: job:j1 is held now.
			for _, e := range []string{"job:j1", "noise", "req:new"} {
				if err := c.Publish(ctx, channel, e).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if repeats {
				if ca := next(); ca != (transport.Cancellation{JobID: "j1"}) {
					t.Fatalf("reported %+v, want the repeated job j1", ca)
				}
			}
			if ca := next(); ca != (transport.Cancellation{RequestID: "new"}) {
				t.Fatalf("reported %+v, want request new", ca)
			}
			if !s.Has(&wire.Request{ID: "new"}) {
				t.Fatal("an announced entry is not in the copy")
			}

			close(closed)
			returned(t, done, "closed closed")
			s.Replace("3", []string{"req:after"})
			select {
			case ca := <-got:
				t.Fatalf("reported %+v after Watch returned", ca)
			default:
			}
		})
	}

	t.Run("context", func(t *testing.T) {
		var s Set
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- s.Watch(wctx, c, "cs:notify:ctx", nil, func(transport.Cancellation) {}) }()
		waitSubscribed(t, c, "cs:notify:ctx")
		cancel()
		returned(t, done, "its context ended")
	})
}

// waitSubscribed waits (up to 10 s) until channel has a subscriber.
func waitSubscribed(t *testing.T, c *redis.Client, channel string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		n, err := c.PubSubNumSub(context.Background(), channel).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n[channel] > 0 {
			return
		}
	}
	t.Fatalf("no subscriber on %s after 10 s", channel)
}

// returned waits (up to 10 s) for Watch's result on done, and fails t
// unless it is nil.
func returned(t *testing.T, done <-chan error, after string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Watch still runs 10 s after %s", after)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
