package redissortedset_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/transport"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// The client suite of llm-d-async-rs sharing sluice's Redis (CLIENTS.md
// §3): it keeps queues in upstream's layout, re-scores a request it
// reclaims or promotes at its plain integer deadline (no enqueue
// sequence), adds keys of its own and PUBLISHes llm-d-async:results
// <route> on every finish, and its envelopes may carry
// internal.payload_content_type, internal.payload_size and a payload_ref
// blob://requests/<token> for a body that is not JSON. sluice must ignore
// what it does not own, read both score forms in order, and answer a
// payload_ref it cannot read with one PAYLOAD_UNAVAILABLE result and no
// gateway call.

// rsEnvelope is an async-rs envelope: upstream's, plus its own internal
// fields.
func rsEnvelope(id, token, queue, results string, dl int64, payload string, blob bool) string {
	in := map[string]any{"request_token": token, "request_queue_name": queue, "result_queue_name": results,
		"payload_content_type": "application/json", "payload_size": len(payload)}
	data := map[string]any{"id": id, "created": time.Now().Unix(), "deadline": dl, "payload": json.RawMessage(payload)}
	if blob {
		in["payload_ref"] = "blob://requests/" + token
		in["payload_content_type"] = "audio/wav"
		data["payload"] = nil
	}
	b, err := json.Marshal(map[string]any{"internal": in, "request_kind": "plain", "data": data})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestClientAsyncRS(t *testing.T) {
	f, gw := cutoverFixture(t, 0)
	c := f.prod.Client()
	ctx := context.Background()
	const q, results = "llm-d-async:requests:rs", "llm-d-async:results:rs"
	// Its own keys, which sluice must leave as they are.
	own := map[string]string{
		"llm-d-async:result-claim-ids:" + results: "set",
		"llm-d-async:result-routes":               "set",
		"llm-d-async:blob-requests-meta":          "hash",
		"llm-d-async:kv:tenant-a":                 "string",
	}
	for k, kind := range own {
		var err error
		switch kind {
		case "set":
			err = c.SAdd(ctx, k, "m1", "m2").Err()
		case "hash":
			err = c.HSet(ctx, k, "f", "v").Err()
		default:
			err = c.Set(ctx, k, "v", 0).Err()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	before := map[string]string{}
	for k := range own {
		d, err := c.Dump(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		before[k] = d
	}

	// Requests due at three deadlines, four each: at each deadline, two
	// enqueued with a sequence (deadline + seq/2^21) and two re-scored by
	// async-rs at the plain deadline, which sorts before them.
	base := time.Now().Add(time.Hour).Unix()
	tokens := map[string]string{}
	var want []string // the order of the scores
	type member struct {
		score float64
		id    string
		body  string
	}
	var members []member
	for d := range 3 {
		dl := base + int64(d)
		for k := range 4 {
			id := fmt.Sprintf("rs-%d-%d", d, k)
			tok := randHex(t, 16)
			tokens[id] = tok
			score := float64(dl) + float64(k+1)/2097152
			if k >= 2 { // re-scored: the plain deadline
				score = float64(dl)
			}
			members = append(members, member{score, id, rsEnvelope(id, tok, q, results, dl, payloadFor(id), false)})
			if err := c.Set(ctx, "request-active:"+id, tok, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.Set(ctx, fmt.Sprintf("request-progress:%s:%s", id, tok), "0.5", time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	blobID, blobTok := "rs-blob", randHex(t, 16)
	tokens[blobID] = blobTok
	if err := c.Set(ctx, fmt.Sprintf("request-progress:%s:%s", blobID, blobTok), "0", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	members = append(members, member{float64(base - 10), blobID, rsEnvelope(blobID, blobTok, q, results, base-10+3600, `null`, true)})
	for _, m := range members {
		if err := c.ZAdd(ctx, q, redis.Z{Score: m.score, Member: m.body}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	sorted := slices.Clone(members)
	slices.SortStableFunc(sorted, func(a, b member) int {
		if a.score != b.score {
			if a.score < b.score {
				return -1
			}
			return 1
		}
		return 0
	})
	for _, m := range sorted {
		if m.id != blobID {
			want = append(want, m.id)
		}
	}
	// Its finishes are announced on a channel of its own while sluice runs.
	pubStop := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-pubStop:
				return
			case <-time.After(5 * time.Millisecond):
				c.Publish(ctx, "llm-d-async:results", results)
			}
		}
	}()
	// One at a time, nothing claimed ahead: the gateway sees the claim order.
	tp := f.transport(rss.Options{PollIntervalMS: 20, Prefetch: -1, BatchSize: 64})
	f.runAppOn(tp, []config.Queue{{Queue: transport.Queue{Name: q}, IGWBaseURL: f.sim}}, results, 1)
	waitResults(t, c, results, len(members), 10*time.Second)
	close(pubStop)
	<-pubDone
	byID := checkAnsweredOnce(t, c, results, tokens)
	if r := byID[blobID]; r != nil {
		if r["error_code"] != "PAYLOAD_UNAVAILABLE" || r["status_code"] != nil {
			t.Errorf("%s: %v, want PAYLOAD_UNAVAILABLE without status_code", blobID, r)
		}
	}
	calls, order := gw.counts()
	if calls[blobID] != 0 {
		t.Errorf("%s: %d gateway calls for a payload sluice cannot read", blobID, calls[blobID])
	}
	if !slices.Equal(order, want) {
		t.Errorf("dispatch order %v, want the scores' %v", order, want)
	}
	for id, r := range byID {
		if id != blobID && r["status_code"] != float64(200) {
			t.Errorf("%s: %v", id, r)
		}
		if n := c.Exists(ctx, fmt.Sprintf("request-progress:%s:%s", id, tokens[id])).Val(); n != 1 {
			t.Errorf("%s: its request-progress key is gone", id)
		}
	}
	for k := range own {
		d, err := c.Dump(ctx, k).Result()
		if err != nil || d != before[k] {
			t.Errorf("%s changed (%v)", k, err)
		}
	}
	t.Logf("%d requests in score order %s", len(order), strconv.Quote(fmt.Sprint(order[:4])))
}
