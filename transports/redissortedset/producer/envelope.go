package producer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/wire"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redissortedset/internal/keys"
)

// submitEnvelopes is EnqueueMany with Config.Envelope: upstream's wire
// form and enqueue sequence (keys.SubmitEnvelopes), ChunkSize requests per
// script call.
func (p *Producer) submitEnvelopes(ctx context.Context, queue string, reqs []*wire.Request) error {
	if p.names.Cluster {
		return errors.New("enqueue: the envelope form (Config.Envelope) needs a single Redis: upstream's per-request keys are in other hash slots than the queue")
	}
	now := time.Now()
	var chunks [][]any
	var args []any
	for _, r := range reqs {
		a, err := p.envelopeArgs(queue, r, now)
		if err != nil {
			return err
		}
		args = append(args, a...)
		if len(args)/keys.SubmitArgs == p.cfg.ChunkSize {
			chunks = append(chunks, args)
			args = nil
		}
	}
	if len(args) > 0 {
		chunks = append(chunks, args)
	}
	k := p.names.Queue(queue)
	for _, c := range chunks {
		if _, err := p.client.Pipelined(ctx, func(pl redis.Pipeliner) error {
			keys.SubmitEnvelopes.Eval(ctx, pl, []string{queue}, c...)
			pl.SAdd(ctx, p.names.Registry(), queue)
			pl.Publish(ctx, k.Notify, "1")
			return nil
		}); err != nil {
			return fmt.Errorf("enqueue to %s: %w", queue, err)
		}
	}
	return nil
}

// envelopeArgs is r's SubmitEnvelopes arguments.
func (p *Producer) envelopeArgs(queue string, r *wire.Request, now time.Time) ([]any, error) {
	// Upstream's api.RequestMessage holds created and deadline as whole
	// seconds (a fraction fails its decode, and it drops the message).
	whole := *r
	whole.Created, whole.Deadline = r.Created.Truncate(time.Second), r.Deadline.Truncate(time.Second)
	r = &whole
	flat, err := wire.EncodeRequest(r)
	if err != nil {
		return nil, err
	}
	var tb [16]byte
	if _, err := rand.Read(tb[:]); err != nil {
		return nil, fmt.Errorf("request token: %w", err)
	}
	token := hex.EncodeToString(tb[:])
	results := r.ResultQueueName
	if results == "" {
		results = p.cfg.ResultQueueName
	}
	str := func(v string) string { b, _ := json.Marshal(v); return string(b) }
	before := `{"internal":{"request_token":` + str(token) + `,"request_queue_name":` + str(queue)
	if results != "" {
		before += `,"result_queue_name":` + str(results)
	}
	before += `,"enqueue_seq":`
	after := "}"
	payloadKey, payload := "", ""
	if p.cfg.PayloadKeys {
		payloadKey, payload = keys.PayloadKey(r.ID, token), string(r.Payload)
		after = `,"payload_ref":` + str(payloadKey) + "}"
	}
	body := `,"request_kind":"plain","data":` + string(flat) + "}"
	if p.cfg.PayloadKeys {
		b, err := wire.WithPayload([]byte(`{"data":`+string(flat)+`}`), []byte("null"))
		if err != nil {
			return nil, err
		}
		body = `,"request_kind":"plain",` + string(b[1:])
	}
	deadline := rss.Score(r.Deadline)
	activeMS := max(r.Deadline.Sub(now).Milliseconds(), 1)
	seqExpire := r.Deadline.Unix() + 3600
	return []any{
		keys.SeqPrefix + queue + ":" + deadline, keys.CancelPrefix + r.ID, keys.ActivePrefix + r.ID, token,
		activeMS, strconv.FormatInt(seqExpire, 10), before, after + body, deadline,
		payloadKey, payload, activeMS + 600000,
	}, nil
}
