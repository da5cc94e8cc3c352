package producer

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The submitter the kill test starts (this test binary again): it submits
// one request under a key and kills itself with SIGKILL right after the
// submit's write answered, before SubmitIdempotent returns (or, with
// SLUICE_SUBMIT_KILL=before, before anything was sent).
const (
	envSubmitURL  = "SLUICE_SUBMIT_URL"
	envSubmitKill = "SLUICE_SUBMIT_KILL"
)

// killedRequest is the request both the submitter and its retry build: a
// caller rebuilds the same request from its own records.
func killedRequest() *wire.Request {
	return &wire.Request{ID: "line-7", Created: time.Unix(1_900_000_000, 0), Deadline: time.Unix(4_000_000_000, 0),
		Payload:  json.RawMessage(`{"model":"m", "messages":[{"role":"user","content":"hi"}],"max_tokens":16}`),
		Metadata: map[string]string{"job_id": "batch_1"}, Endpoint: "/v1/chat/completions", ResultQueueName: "acme/results:replica-1"}
}

const killedQueue, killedKey = "acme/batch-q", "batch_1/line-7"

func TestMain(m *testing.M) {
	if url := os.Getenv(envSubmitURL); url != "" {
		os.Exit(submitAndDie(url, os.Getenv(envSubmitKill)))
	}
	os.Exit(m.Run())
}

// submitAndDie is the submitter process.
func submitAndDie(url, when string) int {
	p, err := Dial(url, Config{})
	if err != nil {
		return 2
	}
	die := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	if when == "before" {
		die()
	}
	afterSubmitWrite = die
	if _, err := p.SubmitIdempotent(context.Background(), killedQueue, killedRequest(), killedKey); err != nil {
		return 3
	}
	return 4 // not killed: the hook did not run
}

// runSubmitter runs the submitter and checks it died of SIGKILL.
func runSubmitter(t *testing.T, url, when string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envSubmitURL+"="+url, envSubmitKill+"="+when)
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("submitter: %v, want killed", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("submitter ended %v, want SIGKILL", err)
	}
}

// TestSubmitIdempotentKilled kills the submitter between its write and its
// answer, then submits again as its restarted self would: the retry
// returns the first submission, and the queue holds the request once.
// Killed before the write, the retry enqueues it: nothing lost.
func TestSubmitIdempotentKilled(t *testing.T) {
	for _, when := range []string{"after-write", "before"} {
		t.Run(when, func(t *testing.T) {
			r := testenv.StartRedis(t, testenv.RedisOptions{})
			runSubmitter(t, r.URL, when)
			p, err := Dial(r.URL, Config{SubmissionRetention: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			first, lerr := p.LookupSubmission(ctx, killedKey)
			s, err := p.SubmitIdempotent(ctx, killedQueue, killedRequest(), killedKey)
			if err != nil {
				t.Fatal(err)
			}
			switch when {
			case "after-write":
				if lerr != nil {
					t.Fatalf("lookup after the kill: %v", lerr)
				}
				if !s.Replayed || s.RequestToken != first.RequestToken {
					t.Errorf("retry: %+v, want the first submission %+v replayed", s, first)
				}
			default:
				if !errors.Is(lerr, ErrSubmissionNotFound) {
					t.Fatalf("lookup after a kill before the write: %v, want not found", lerr)
				}
				if s.Replayed {
					t.Errorf("retry: %+v, want enqueued now", s)
				}
			}
			if s.RequestRoute != killedQueue || s.ResultRoute != "acme/results:replica-1" {
				t.Errorf("routes %s → %s", s.RequestRoute, s.ResultRoute)
			}
			members := p.Client().ZRange(ctx, killedQueue, 0, -1).Val()
			if len(members) != 1 || !strings.Contains(members[0], `"id":"line-7"`) {
				t.Fatalf("queue holds %d members, want the request once: %v", len(members), members)
			}
			// A third submit is answered from the record too.
			again, err := p.SubmitIdempotent(ctx, killedQueue, killedRequest(), killedKey)
			if err != nil || !again.Replayed || again.RequestToken != s.RequestToken {
				t.Errorf("third submit: %+v %v", again, err)
			}
			if n := p.Client().ZCard(ctx, killedQueue).Val(); n != 1 {
				t.Errorf("queue holds %d after the third submit", n)
			}
		})
	}
}

// TestSubmitIdempotentConflict: the same key with another request is a
// conflict naming the key; the identity ignores the payload's key order
// and spacing; lookup and retention.
func TestSubmitIdempotentConflict(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	p, err := Dial(r.URL, Config{SubmissionRetention: 90 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	req := killedRequest()
	s, err := p.SubmitIdempotent(ctx, killedQueue, req, killedKey)
	if err != nil || s.Replayed {
		t.Fatalf("first submit: %+v %v", s, err)
	}
	same := killedRequest()
	same.Payload = json.RawMessage(`{"max_tokens":16,"messages":[{"content":"hi","role":"user"}],"model":"m"}`)
	if got, err := p.SubmitIdempotent(ctx, killedQueue, same, killedKey); err != nil || !got.Replayed || got.RequestToken != s.RequestToken {
		t.Errorf("same request, keys reordered: %+v %v", got, err)
	}
	other := killedRequest()
	other.Payload = json.RawMessage(`{"model":"m","messages":[{"role":"user","content":"bye"}],"max_tokens":16}`)
	_, err = p.SubmitIdempotent(ctx, killedQueue, other, killedKey)
	if !errors.Is(err, ErrIdempotencyConflict) || !strings.Contains(err.Error(), killedKey) {
		t.Errorf("another request under the key: %v, want a conflict naming %s", err, killedKey)
	}
	rerouted := killedRequest()
	rerouted.ResultQueueName = "acme/results:replica-2"
	if _, err := p.SubmitIdempotent(ctx, killedQueue, rerouted, killedKey); !errors.Is(err, ErrIdempotencyConflict) {
		t.Errorf("another result route under the key: %v, want a conflict", err)
	}
	if n := p.Client().ZCard(ctx, killedQueue).Val(); n != 1 {
		t.Errorf("queue holds %d, want 1", n)
	}
	// Many at once: a conflict fails only its own request.
	fresh := killedRequest()
	fresh.ID = "line-8"
	subs, err := p.SubmitIdempotentMany(ctx, killedQueue, []*wire.Request{other, fresh}, []string{killedKey, "batch_1/line-8"})
	if !errors.Is(err, ErrIdempotencyConflict) || len(subs) != 2 || subs[0] != nil || subs[1] == nil || subs[1].Replayed {
		t.Errorf("many with one conflict: %+v %v", subs, err)
	}
	if n := p.Client().ZCard(ctx, killedQueue).Val(); n != 2 {
		t.Errorf("queue holds %d, want 2", n)
	}
	got, err := p.LookupSubmission(ctx, killedKey)
	if err != nil || got.RequestToken != s.RequestToken || got.IdentitySHA256 != s.IdentitySHA256 {
		t.Errorf("lookup: %+v %v", got, err)
	}
	if ttl := p.Client().PTTL(ctx, p.Names().Submission(killedKey)).Val(); ttl <= 89*time.Minute || ttl > 90*time.Minute {
		t.Errorf("record kept for %s, want the retention 90m", ttl)
	}
	if _, err := p.LookupSubmission(ctx, "never"); !errors.Is(err, ErrSubmissionNotFound) || !strings.Contains(err.Error(), "never") {
		t.Errorf("lookup of an unknown key: %v", err)
	}
	if _, err := p.SubmitIdempotent(ctx, killedQueue, req, ""); err == nil {
		t.Error("empty key accepted")
	}
}
