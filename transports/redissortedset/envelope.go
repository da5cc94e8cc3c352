package redissortedset

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
)

// What upstream's envelopes carry beyond the core's request, read and
// written at dequeue as upstream's sorted-set transport does (v0.10 and
// main): the routing stamps (result_routing_resolved, result_queue_name,
// result_ttl_seconds), the enqueue sequence (enqueue_seq, which makes equal
// deadlines keep their enqueue order) and payload keys (payload_ref).

// Metadata keys of a delivery, for its result's settle.
const (
	// metaRoute is the result list the envelope's routing resolved to.
	metaRoute = "sluice_result_route"
	// metaTTL is the result list's expiry in seconds (result_ttl_seconds).
	metaTTL = "sluice_result_ttl"
	// metaPayloadKey is the key holding the request's payload, deleted
	// with the result.
	metaPayloadKey = "sluice_payload_key"
)

// rawJSON is a JSON value as it is in the message: unlike json.RawMessage
// it aliases the input instead of copying it (the message outlives every
// use of it here).
type rawJSON []byte

// UnmarshalJSON implements json.Unmarshaler.
func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

// envelopeInfo is the part of an upstream envelope the transport reads.
// Every value is kept raw so that a member of an unexpected type reads as
// absent instead of failing the whole message (the core decides whether the
// message is valid).
type envelopeInfo struct {
	RequestKind rawJSON           `json:"request_kind"`
	Internal    *envelopeInternal `json:"internal"`
	Data        *envelopeData     `json:"data"`
}

// envelopeInternal is the part of an envelope's internal object the
// transport reads.
type envelopeInternal struct {
	QueueID               rawJSON `json:"queue_id"`
	RequestQueueName      rawJSON `json:"request_queue_name"`
	ResultQueueName       rawJSON `json:"result_queue_name"`
	ResultTTLSeconds      rawJSON `json:"result_ttl_seconds"`
	ResultRoutingResolved rawJSON `json:"result_routing_resolved"`
	EnqueueSeq            rawJSON `json:"enqueue_seq"`
	PayloadRef            rawJSON `json:"payload_ref"`
	KeptResult            rawJSON `json:"kept_result"`
	RequestToken          rawJSON `json:"request_token"`
}

// envelopeData is the part of an envelope's data object the transport
// reads.
type envelopeData struct {
	ID       rawJSON `json:"id"`
	Deadline rawJSON `json:"deadline"`
}

// maybeEnvelope is a byte search telling a message that may be an envelope
// from a flat one (which costs no decode).
func maybeEnvelope(b []byte) bool {
	return bytes.Contains(b, []byte(`"internal"`)) || bytes.Contains(b, []byte(`"request_kind"`))
}

// parseEnvelope reads the envelope fields of b; ok is false for a message
// that is not an envelope (as the core's decoder tells them apart). The
// shape producers write is read by wire.ScanEnvelope (no reflection, no
// allocation per field); encoding/json decides the rest.
func parseEnvelope(b []byte) (e envelopeInfo, ok bool) {
	if !maybeEnvelope(b) {
		return e, false
	}
	if !scanEnvelope(b, &e) && json.Unmarshal(b, &e) != nil {
		return e, false
	}
	if e.Data == nil {
		return e, false
	}
	return e, e.Internal != nil || (len(e.RequestKind) > 0 && string(e.RequestKind) != "null")
}

// The members of internal and data that envelopeInfo holds, in the order
// scanEnvelope stores them.
var (
	envelopeInternalNames = []string{"queue_id", "request_queue_name", "result_queue_name", "result_ttl_seconds",
		"result_routing_resolved", "enqueue_seq", "payload_ref", "kept_result", "request_token"}
	envelopeDataNames = []string{"id", "deadline"}
)

// scanEnvelope fills e from b as json.Unmarshal would, through
// wire.ScanEnvelope; false means the shape needs json.Unmarshal (e is then
// left as it was).
func scanEnvelope(b []byte, e *envelopeInfo) bool {
	v, ok := wire.ScanEnvelope(b, envelopeInternalNames, envelopeDataNames)
	if !ok {
		return false
	}
	e.RequestKind = v.Kind
	if v.HasInternal {
		in := &envelopeInternal{}
		for i, p := range []*rawJSON{&in.QueueID, &in.RequestQueueName, &in.ResultQueueName, &in.ResultTTLSeconds,
			&in.ResultRoutingResolved, &in.EnqueueSeq, &in.PayloadRef, &in.KeptResult, &in.RequestToken} {
			*p = v.Internal[i]
		}
		e.Internal = in
	}
	if v.HasData {
		e.Data = &envelopeData{ID: v.Data[0], Deadline: v.Data[1]}
	}
	return true
}

// keys is upstreamKeysOf(b) for the envelope e read from b: its plain
// string data.id and internal.request_token as they stand, else
// (escapes, other types, a shape the scan left to encoding/json) what
// upstreamKeysOf reads.
func (e *envelopeInfo) keys(b []byte) (id, token string) {
	if e.Internal == nil || len(e.Internal.RequestToken) == 0 {
		if !bytes.Contains(b, []byte(`"request_token"`)) {
			return "", ""
		}
		return upstreamKeysOf(b)
	}
	rid, rtok := e.Data.ID, e.Internal.RequestToken
	if len(rid) > 2 && len(rtok) > 2 && rid[0] == '"' && rtok[0] == '"' &&
		plainJSON(rid[1:len(rid)-1]) && plainJSON(rtok[1:len(rtok)-1]) {
		return string(rid[1 : len(rid)-1]), string(rtok[1 : len(rtok)-1])
	}
	return upstreamKeysOf(b)
}

func (e *envelopeInfo) str(raw func() rawJSON) string {
	if e.Internal == nil {
		return ""
	}
	return jsonString(json.RawMessage(raw()))
}

// empty is e.str(raw) == "" without making the string.
func (e *envelopeInfo) empty(raw func() rawJSON) bool {
	if e.Internal == nil {
		return true
	}
	r := raw()
	if len(r) >= 2 && r[0] == '"' && r[len(r)-1] == '"' && plainJSON(r[1:len(r)-1]) {
		return len(r) == 2
	}
	return jsonString(json.RawMessage(r)) == ""
}

func (e *envelopeInfo) int(raw rawJSON) int64 {
	if e.Internal == nil || len(raw) == 0 {
		return 0
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func (e *envelopeInfo) resolved() bool {
	return e.Internal != nil && string(e.Internal.ResultRoutingResolved) == "true"
}

func (e *envelopeInfo) seq() int64 {
	if e.Internal == nil {
		return 0
	}
	return e.int(e.Internal.EnqueueSeq)
}

// deadline returns data.deadline as Unix seconds (a number, or a string
// holding one), 0 when it is neither.
func (e *envelopeInfo) deadline() float64 {
	if e.Data == nil {
		return 0
	}
	s := strings.Trim(string(e.Data.Deadline), `"`)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		return 0
	}
	return f
}

// maxEnqueueSeq is the largest enqueue sequence that orders (2^21 - 1):
// upstream's score keeps deadline + seq/2^21 exact in a float64 for
// deadlines below 2^32.
const maxEnqueueSeq = 1<<21 - 1

// QueueScore is the score of message b in a request queue, by upstream's
// formula (api.QueueScore): its deadline plus, for an envelope carrying
// internal.enqueue_seq, min(seq, 2^21-1)/2^21, so that requests with equal
// deadlines come out in enqueue order. A request without a sequence scores
// its deadline (Score); one whose deadline cannot be read scores 0, so its
// INVALID_REQUEST answer comes at once. Every re-ZADD of a stored member
// (reclaim, adopting upstream's retries, migration) scores it so, the
// producer writes the same score, and a hand-back or retry keeps the score
// the message had.
func QueueScore(b []byte) string {
	if e, ok := parseEnvelope(b); ok {
		if d := e.deadline(); d > 0 {
			return scoreOf(time.UnixMilli(int64(d*1000+0.5)), e.seq())
		}
	}
	if r, err := wire.Decode(b); err == nil {
		return Score(r.Deadline)
	}
	return "0"
}

// scoreOf is the score of a deadline and an enqueue sequence (see QueueScore).
func scoreOf(deadline time.Time, seq int64) string {
	if seq <= 0 {
		return Score(deadline)
	}
	f := float64(deadline.UnixMilli())/1000 + float64(min(seq, maxEnqueueSeq))/float64(maxEnqueueSeq+1)
	return strconv.FormatFloat(f, 'g', 17, 64)
}

// ownResult reports whether q has a result list of its own (not the
// deployment's default), which upstream's routing puts first.
func ownResult(q transport.Queue) bool { return !q.ResultFromMessage && q.ResultName != "" }

// stampEnvelope does what upstream's dequeue does to an envelope before
// any outcome, and records in m's metadata what its result's settle needs:
//
//   - the request id and token (the result carries request_token; the
//     settle cleans upstream's cancellation keys);
//   - the result's route and ttl: unless result_routing_resolved, the
//     routing is resolved once, as routingStamps says. The result goes to
//     the envelope's result_queue_name (else the deployment's list) with its
//     result_ttl_seconds;
//   - internal.payload_ref names the key holding the payload (it reports
//     true: the payload is to be attached).
//
// The envelope's bytes are not rewritten here: nothing the core reads from
// it depends on the stamps (the route and ttl travel in the metadata). The
// stamps are written into the envelope when it goes back to Redis — a
// retry, a hand-back with a kept result, a dead letter (stampPayload) — so
// a retry or another replica (sluice or upstream) routes it the same way.
// That spares every request that is simply answered a rewrite of its
// envelope (a copy and a dozen allocations).
//
// A flat message gets the queue's result ttl only.
func (s *source) stampEnvelope(m *message.Message) (payloadRef bool) {
	q := s.q
	e, ok := parseEnvelope(m.Payload)
	if !ok {
		if q.ResultTTLSeconds > 0 {
			m.Metadata[metaTTL] = strconv.FormatInt(q.ResultTTLSeconds, 10)
		}
		return false
	}
	if id, tok := e.keys(m.Payload); tok != "" {
		m.Metadata[metaRequestID], m.Metadata[metaRequestToken] = id, tok
	}
	_, route, ttl := routingStamps(q, &e, false)
	m.Metadata[metaRoute] = route
	if ttl > 0 {
		m.Metadata[metaTTL] = strconv.FormatInt(ttl, 10)
	}
	if ref := e.str(func() rawJSON { return e.Internal.PayloadRef }); ref != "" {
		m.Metadata[metaPayloadKey] = ref
		kept := len(e.Internal.KeptResult) > 0 && string(e.Internal.KeptResult) != "null"
		if d := e.deadline(); kept || (d > 0 && float64(time.Now().UnixMilli())/1000 >= d) {
			// Answered without calling the gateway (its kept result, or
			// DEADLINE_EXCEEDED as upstream, which reads no payload for an
			// expired request): a payload key that is gone does not matter.
			m.Metadata[metaNoPayload] = "1"
		}
		return true
	}
	return false
}

// routingStamps returns what upstream's dequeue resolves for envelope e of
// queue q: the result's route (the envelope's result_queue_name, else the
// deployment's list) and ttl, and, with members set, the internal members
// it stamps into the envelope:
//
//   - request_queue_name and queue_id, when empty, become the queue's;
//   - unless result_routing_resolved: result_queue_name becomes the queue's
//     own result list when it has one, result_ttl_seconds the queue's,
//     result_routing_resolved true.
func routingStamps(q transport.Queue, e *envelopeInfo, members bool) (set []wire.InternalMember, route string, ttl int64) {
	str := quoteJSON
	if members && e.empty(func() rawJSON { return e.Internal.RequestQueueName }) {
		set = append(set, wire.InternalMember{Name: "request_queue_name", Value: str(q.Name)})
	}
	if members && q.ID != "" && e.empty(func() rawJSON { return e.Internal.QueueID }) {
		set = append(set, wire.InternalMember{Name: "queue_id", Value: str(q.ID)})
	}
	route = e.str(func() rawJSON { return e.Internal.ResultQueueName })
	if e.resolved() {
		ttl = e.int(e.Internal.ResultTTLSeconds)
	} else {
		if ownResult(q) {
			route = q.ResultName
			if members {
				set = append(set, wire.InternalMember{Name: "result_queue_name", Value: str(route)})
			}
		}
		ttl = q.ResultTTLSeconds
		if members {
			if ttl > 0 { // upstream omits a zero ttl (omitempty)
				set = append(set, wire.InternalMember{Name: "result_ttl_seconds", Value: strconv.AppendInt(nil, ttl, 10)})
			}
			set = append(set, wire.InternalMember{Name: "result_routing_resolved", Value: []byte("true")})
		}
	}
	if route == "" {
		route = q.ResultName
	}
	return set, route, ttl
}

// stampPayload writes upstream's dequeue stamps (routingStamps) into
// payload, an envelope of queue q going back to Redis; any other message
// is returned as it is.
func stampPayload(q transport.Queue, payload []byte) []byte {
	e, ok := parseEnvelope(payload)
	if !ok {
		return payload
	}
	set, _, _ := routingStamps(q, &e, true)
	if len(set) == 0 {
		return payload
	}
	if stamped, err := wire.SetInternal(payload, set...); err == nil {
		return stamped
	}
	return payload
}

// metaNoPayload marks a delivery whose payload is not needed: it carries a
// kept result, or its deadline passed (the gateway is not called).
const metaNoPayload = "sluice_no_payload"

// routeOf is the result list of delivery m: the one its envelope resolved
// to, else the queue's.
func (s *source) routeOf(m *message.Message) string {
	if r := m.Metadata.Get(metaRoute); r != "" {
		return r
	}
	return s.q.ResultName
}

// Messages of a payload key that is gone.
const (
	payloadMissing      = "request payload is missing"
	payloadNotAttached  = "request payload could not be attached"
	keptResultNoPayload = "{}" // attached when the payload is not needed and gone
)

// attachPayloads reads the payloads of refs (messages of out whose
// envelope names a payload key) in one round trip, after the claim, and
// attaches each to its message, as upstream does. A payload that is gone
// is answered PAYLOAD_UNAVAILABLE (the request is claimed, so the answer is
// fenced like any result); when the read itself fails, those requests are
// handed back to the queue. It returns the messages to deliver.
func (s *source) attachPayloads(ctx context.Context, out, refs []*message.Message) []*message.Message {
	t := s.t
	names := make([]string, len(refs))
	for i, m := range refs {
		names[i] = m.Metadata.Get(metaPayloadKey)
	}
	vals, err := t.getMany(ctx, names)
	drop := map[*message.Message]bool{}
	if err != nil {
		t.log.Warn("reading payload keys failed; handing the requests back", "queue", s.q.Name, "count", len(refs), "err", err)
		s.HandBack(refs)
		for _, m := range refs {
			drop[m] = true
		}
	} else {
		for i, m := range refs {
			v, ok := vals[i].(string)
			if !ok && m.Metadata.Get(metaNoPayload) != "" {
				v, ok = keptResultNoPayload, true
			}
			msg := payloadMissing
			if ok {
				if p, err := wire.WithPayload(m.Payload, []byte(v)); err == nil {
					m.Payload = p
					continue
				}
				msg = payloadNotAttached
			}
			drop[m] = true
			s.answerUnavailable(m, msg)
		}
	}
	kept := out[:0]
	for _, m := range out {
		if !drop[m] {
			kept = append(kept, m)
		}
	}
	return kept
}

// getMany reads keys in one MGET (a pipeline of GETs in a cluster, where
// they live in different slots); a missing key reads as nil.
func (t *Transport) getMany(ctx context.Context, names []string) ([]any, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !t.cluster {
		return t.client.MGet(ctx, names...).Result()
	}
	cmds := make([]*redis.StringCmd, len(names))
	if _, err := t.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, n := range names {
			cmds[i] = p.Get(ctx, n)
		}
		return nil
	}); err != nil && err != redis.Nil {
		return nil, err
	}
	out := make([]any, len(names))
	for i, c := range cmds {
		if v, err := c.Result(); err == nil {
			out[i] = v
		}
	}
	return out, nil
}

// answerUnavailable answers delivery m, whose payload is gone, with
// PAYLOAD_UNAVAILABLE.
func (s *source) answerUnavailable(m *message.Message, msg string) {
	t := s.t
	id := m.Metadata.Get(metaRequestID)
	if id == "" {
		if e, ok := parseEnvelope(m.Payload); ok && e.Data != nil {
			id = jsonString(json.RawMessage(e.Data.ID))
		}
	}
	t.log.Warn("a request's payload key is gone; answering PAYLOAD_UNAVAILABLE", "queue", s.q.Name, "id", id, "key", m.Metadata.Get(metaPayloadKey))
	res := &wire.Result{ID: id, Payload: wire.ErrorPayload(msg), ErrorCode: wire.CodePayloadUnavailable, ErrorMessage: msg}
	it := t.resultItem(s.q, m, res.Marshal())
	if err := t.settleRetrying(s.qs, s.routeOf(m), it); err != nil {
		t.log.Error("answering PAYLOAD_UNAVAILABLE failed; the lease will expire and the request come back", "queue", s.q.Name, "err", err)
	}
}

// resultItem is the settle of result for delivery m of queue q: fenced by
// its claim, with upstream's request_token added to the result, the
// cleanup of upstream's cancellation keys (single node) and payload key
// (in the settle on a single node; apart in a cluster, by the publisher or,
// for a cross-slot settle a reclaimer finishes, from its record) and the
// result list's ttl.
func (t *Transport) resultItem(q transport.Queue, m *message.Message, result []byte) settleItem {
	it := settleItem{mode: 'r', token: m.Metadata.Get(MetaLease), claim: m.Metadata.Get(MetaClaim), result: result}
	if tok := m.Metadata.Get(metaRequestToken); tok != "" {
		it.result = withRequestToken(result, tok)
		if !t.cluster {
			it.reqID, it.reqToken = m.Metadata.Get(metaRequestID), tok
		}
	}
	it.payloadKey = m.Metadata.Get(metaPayloadKey) // a cluster's one-script settle leaves it to the publisher (another slot)
	if v := m.Metadata.Get(metaTTL); v != "" {
		it.ttl, _ = strconv.ParseInt(v, 10, 64)
	} else {
		it.ttl = q.ResultTTLSeconds
	}
	return it
}

// withRequestToken adds upstream's top-level request_token to a result
// (the durable result consumer de-duplicates by id and token), unless it
// already has one.
func withRequestToken(result []byte, token string) []byte {
	end := bytes.LastIndexByte(result, '}')
	if end < 0 || bytes.Contains(result, []byte(`"request_token"`)) {
		return result
	}
	tok := quoteJSON(token)
	out := make([]byte, 0, len(result)+len(tok)+20)
	out = append(out, result[:end]...)
	if bytes.TrimSpace(result[:end])[len(bytes.TrimSpace(result[:end]))-1] != '{' {
		out = append(out, ',')
	}
	out = append(out, `"request_token":`...)
	out = append(out, tok...)
	return append(out, result[end:]...)
}
