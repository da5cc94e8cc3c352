package producer

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/wire"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// Idempotent submits, as upstream's proposal for crash recovery describes
// them (llm-d-async docs/proposals/idempotent-producer-submit-lookup.md):
// a submit carries a key chosen by the caller; the first submit under a
// key enqueues the request and records its identity, token and routes in
// <prefix>:submission:<key>, in the same script, for the producer's
// SubmissionRetention. A later submit under the key enqueues nothing: it
// returns the first submission when the request is the same (same
// identity), and ErrIdempotencyConflict when it is not. So a caller that
// crashed between its submit and the answer submits again and learns what
// happened, without losing or doubling the request.

// DefaultSubmissionRetention is how long a submission record is kept when
// Config.SubmissionRetention is 0.
const DefaultSubmissionRetention = 7 * 24 * time.Hour

// ErrIdempotencyConflict is returned by SubmitIdempotent when its key
// already names a different request (submit's sentinel: one error for
// every idempotent producer).
var ErrIdempotencyConflict = submit.ErrIdempotencyConflict

// ErrSubmissionNotFound is returned by LookupSubmission when no record of
// the key is kept (never submitted, or older than the retention).
var ErrSubmissionNotFound = submit.ErrSubmissionNotFound

// Submission is the record of the first submit under a key (submit's:
// its RequestToken is the record's own, since the flat form carries no
// token on the wire; its IdentitySHA256 is Identity's).
type Submission = submit.Submission

// identityJSON is the canonical form whose SHA-256 identifies a request:
// what it asks and where its answer goes, not when or by which attempt.
type identityJSON struct {
	Type         string            `json:"type"`
	ID           string            `json:"id"`
	Created      int64             `json:"created"`
	Deadline     int64             `json:"deadline"`
	Payload      json.RawMessage   `json:"payload"`
	Metadata     map[string]string `json:"metadata"`
	Headers      map[string]string `json:"headers"`
	Endpoint     string            `json:"endpoint"`
	RequestRoute string            `json:"request_route"`
	ResultRoute  string            `json:"result_route"`
}

// Identity returns the hex SHA-256 of req's canonical JSON as submitted to
// queue: its type ("plain"), id, created and deadline (Unix seconds, as
// the wire carries them), payload (its JSON with object keys sorted and
// insignificant space removed), metadata, headers, endpoint and routes.
// The token, lease, retry count and labels are not part of it.
func Identity(queue string, req *wire.Request) (string, error) {
	payload, err := canonicalJSON(req.Payload)
	if err != nil {
		return "", fmt.Errorf("identity of %s: payload: %w", req.ID, err)
	}
	id := identityJSON{Type: "plain", ID: req.ID, Deadline: req.Deadline.Unix(), Payload: payload,
		Metadata: req.Metadata, Headers: req.Headers, Endpoint: req.Endpoint, RequestRoute: queue, ResultRoute: req.ResultQueueName}
	if !req.Created.IsZero() {
		id.Created = req.Created.Unix()
	}
	b, err := json.Marshal(id) // maps are written with sorted keys
	if err != nil {
		return "", fmt.Errorf("identity of %s: %w", req.ID, err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// canonicalJSON rewrites b with object keys sorted and numbers as written.
func canonicalJSON(b json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return json.RawMessage("null"), nil
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// SubmitIdempotent enqueues req on queue under the idempotency key key,
// unless a submit under key was recorded within the retention: then it
// enqueues nothing and returns that first submission (Replayed) when req
// has the same identity, or an error wrapping ErrIdempotencyConflict and
// naming the key when it has not. The check, the enqueue and the record
// are one script: a crash at any point leaves either nothing or both.
// Flat form on a single node only (not with Config.Envelope, nor on a
// Cluster, where the record and the queue live in different slots).
func (p *Producer) SubmitIdempotent(ctx context.Context, queue string, req *wire.Request, key string) (*Submission, error) {
	subs, err := p.SubmitIdempotentMany(ctx, queue, []*wire.Request{req}, []string{key})
	if err != nil {
		return nil, err
	}
	return subs[0], nil
}

// SubmitIdempotentMany is SubmitIdempotent of each reqs[i] under keys[i],
// pipelined: one round trip for all of them (one script call each). A
// request whose key names another request gets a nil Submission and its
// conflict is in the returned error (errors.Is ErrIdempotencyConflict);
// the others are submitted all the same. Any other error fails the call:
// some requests may then be submitted, and submitting them again under
// the same keys is safe.
func (p *Producer) SubmitIdempotentMany(ctx context.Context, queue string, reqs []*wire.Request, keyOf []string) ([]*Submission, error) {
	if len(reqs) != len(keyOf) {
		return nil, fmt.Errorf("idempotent submit: %d requests, %d keys", len(reqs), len(keyOf))
	}
	if err := p.IdempotentSubmits(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	k := p.names.Queue(queue)
	now := time.Now()
	identities := make([]string, len(reqs))
	argsOf := make([][]any, len(reqs))
	for i, req := range reqs {
		if keyOf[i] == "" {
			return nil, fmt.Errorf("idempotent submit of %s: empty key", req.ID)
		}
		identity, err := Identity(queue, req)
		if err != nil {
			return nil, err
		}
		body, err := wire.EncodeRequest(req)
		if err != nil {
			return nil, err
		}
		var tb [16]byte
		if _, err := rand.Read(tb[:]); err != nil {
			return nil, err
		}
		identities[i] = identity
		argsOf[i] = []any{identity, hex.EncodeToString(tb[:]), queue, req.ResultQueueName, p.retention().Milliseconds(), now.UnixMilli(),
			k.JobPrefix, p.names.JobQueues(""), p.cfg.JobIndexTTL.Milliseconds(), now.UnixMilli(),
			rss.Score(req.Deadline), indexableJob(req.JobID()), string(body[1:])}
	}
	// Each call's mark is fixed before the first attempt (see EnqueueMany).
	marks := make([]string, len(reqs))
	for i := range marks {
		marks[i] = k.CallMarks + p.id + ":" + strconv.FormatUint(p.calls.Add(1), 36)
	}
	run := func() ([]*redis.Cmd, error) {
		cmds := make([]*redis.Cmd, len(reqs))
		_, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
			pl.SAdd(ctx, p.names.Registry(), queue)
			for i := range reqs {
				cmds[i] = keys.SubmitIdempotent.EvalSha(ctx, pl, []string{p.names.Submission(keyOf[i]), queue, k.Seq, marks[i]}, argsOf[i]...)
			}
			pl.Publish(ctx, k.Notify, "1")
			return nil
		})
		return cmds, err
	}
	if err := p.ensureIdempotentLoaded(ctx); err != nil {
		return nil, err
	}
	cmds, err := run()
	if err != nil && strings.Contains(err.Error(), "NOSCRIPT") {
		if err = keys.SubmitIdempotent.Load(ctx, p.client).Err(); err == nil {
			cmds, err = run()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("idempotent submit to %s: %w", queue, err)
	}
	if afterSubmitWrite != nil {
		afterSubmitWrite()
	}
	subs := make([]*Submission, len(reqs))
	var conflicts []error
	for i, c := range cmds {
		raw, err := c.Slice()
		if err != nil {
			return nil, fmt.Errorf("idempotent submit %s to %s: %w", keyOf[i], queue, err)
		}
		s, err := submissionOf(keyOf[i], raw)
		if err != nil {
			return nil, fmt.Errorf("idempotent submit %s: %w", keyOf[i], err)
		}
		if s.Replayed && s.IdentitySHA256 != identities[i] {
			conflicts = append(conflicts, fmt.Errorf("idempotent submit %s: %w (first submitted at %s as request token %s to %s; this request's identity %s, the first's %s)",
				keyOf[i], ErrIdempotencyConflict, s.Submitted.UTC().Format(time.RFC3339), s.RequestToken, s.RequestRoute, identities[i], s.IdentitySHA256))
			continue
		}
		subs[i] = s
	}
	return subs, errors.Join(conflicts...)
}

// IdempotentSubmits says why this producer cannot submit idempotently
// (nil: it can): the envelope form and a Redis Cluster are not supported.
func (p *Producer) IdempotentSubmits() error {
	switch {
	case p.cfg.Envelope:
		return errors.New("idempotent submit: not available with the envelope form")
	case p.names.Cluster:
		return errors.New("idempotent submit: not available on a Redis Cluster (the record and the queue are in different slots)")
	}
	return nil
}

// ensureIdempotentLoaded loads the idempotent submit script once.
func (p *Producer) ensureIdempotentLoaded(ctx context.Context) error {
	var err error
	p.loadIdem.Do(func() { err = keys.SubmitIdempotent.Load(ctx, p.client).Err() })
	if err != nil {
		p.loadIdem = sync.Once{}
		return fmt.Errorf("load idempotent submit script: %w", err)
	}
	return nil
}

// afterSubmitWrite, when set (tests), runs once SubmitIdempotent's write
// answered and before SubmitIdempotent does.
var afterSubmitWrite func()

// LookupSubmission returns the record of key, or an error wrapping
// ErrSubmissionNotFound.
func (p *Producer) LookupSubmission(ctx context.Context, key string) (*Submission, error) {
	vals, err := p.client.HMGet(ctx, p.names.Submission(key), "identity", "token", "request_route", "result_route", "submitted").Result()
	if err != nil {
		return nil, fmt.Errorf("lookup submission %s: %w", key, err)
	}
	if vals[0] == nil {
		return nil, fmt.Errorf("lookup submission %s: %w", key, ErrSubmissionNotFound)
	}
	raw := append([]any{int64(0)}, vals...)
	s, err := submissionOf(key, raw)
	if err != nil {
		return nil, fmt.Errorf("lookup submission %s: %w", key, err)
	}
	s.Replayed = false
	return s, nil
}

// SetSubmissionRetention sets Config.SubmissionRetention (0: the default)
// for the submits that follow; call it before submitting.
func (p *Producer) SetSubmissionRetention(d time.Duration) { p.cfg.SubmissionRetention = d }

// retention is the configured record retention.
func (p *Producer) retention() time.Duration {
	if p.cfg.SubmissionRetention > 0 {
		return p.cfg.SubmissionRetention
	}
	return DefaultSubmissionRetention
}

// submissionOf reads the script's answer {enqueued, identity, token,
// request route, result route, submitted ms}.
func submissionOf(key string, raw []any) (*Submission, error) {
	if len(raw) != 6 {
		return nil, fmt.Errorf("unexpected record of %d fields", len(raw))
	}
	str := func(v any) string { s, _ := v.(string); return s }
	n, _ := raw[0].(int64)
	ms, err := strconv.ParseInt(strings.TrimSpace(str(raw[5])), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("record's submitted %q: %w", str(raw[5]), err)
	}
	return &Submission{Key: key, IdentitySHA256: str(raw[1]), RequestToken: str(raw[2]), RequestRoute: str(raw[3]),
		ResultRoute: str(raw[4]), Submitted: time.UnixMilli(ms), Replayed: n == 0}, nil
}
