package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// EncodeRequest returns r in the flat form, for producers:
//
//	{"id":..,"created":..,"deadline":..,"payload":{..},"metadata":{..},"headers":{..},"endpoint":..}
//
// created and deadline are Unix seconds rounded to the millisecond, written
// as integers when whole ("1700000000") and as fractions otherwise
// ("1700000000.25"); the payload bytes are written verbatim (surrounding
// whitespace aside); created, metadata, headers, endpoint and the queue names
// are omitted when empty. The envelope fields Kind, RetryCount, Token, QueueID
// and Labels are not part of the flat form and are not written (see
// WithRetryCount and WithEnvelope).
//
// r must be a request Decode would accept, so Decode(EncodeRequest(r))
// returns r again (with times at millisecond precision).
func EncodeRequest(r *Request) ([]byte, error) {
	if msg := checkEncodable(r); msg != "" {
		return nil, fmt.Errorf("encode request %q: %s", r.ID, msg)
	}
	payload := r.Payload[jsonscan.SkipSpace(r.Payload, 0):skipSpaceBack(r.Payload)]
	b := make([]byte, 0, 128+len(r.ID)+len(payload)+len(r.Endpoint))
	b = append(b, `{"id":`...)
	b = appendString(b, r.ID)
	if !r.Created.IsZero() {
		b = append(b, `,"created":`...)
		b = appendUnixTime(b, r.Created)
	}
	b = append(b, `,"deadline":`...)
	b = appendUnixTime(b, r.Deadline)
	b = append(b, `,"payload":`...)
	b = append(b, payload...)
	if len(r.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = appendStringMap(b, r.Metadata)
	}
	if len(r.Headers) > 0 {
		b = append(b, `,"headers":`...)
		b = appendStringMap(b, r.Headers)
	}
	for _, f := range [...]struct{ name, value string }{
		{"endpoint", r.Endpoint},
		{"request_queue_name", r.RequestQueueName},
		{"result_queue_name", r.ResultQueueName},
		{"model", r.Model},
	} {
		if f.value != "" {
			b = append(b, `,"`...)
			b = append(b, f.name...)
			b = append(b, `":`...)
			b = appendString(b, f.value)
		}
	}
	return append(b, '}'), nil
}

// checkEncodable returns why r would not decode, or "".
func checkEncodable(r *Request) string {
	if r.ID == "" {
		return "id: missing or empty"
	}
	if msg := checkEncodableTime(r.Deadline, true); msg != "" {
		return "deadline: " + msg
	}
	if !r.Created.IsZero() {
		if msg := checkEncodableTime(r.Created, false); msg != "" {
			return "created: " + msg
		}
	}
	if !jsonscan.Valid(r.Payload) {
		return "payload: not valid JSON"
	}
	if k := jsonKind(r.Payload); k != "object" {
		return "payload: must be a JSON object, got " + k
	}
	for name, value := range r.Headers {
		if err := checkHeader(name, value); err != nil {
			return "headers" + err.Error()
		}
	}
	if msg := checkEndpoint(r.Endpoint); msg != "" {
		return "endpoint: " + msg
	}
	return ""
}

// checkEncodableTime returns why t cannot be written, or "": it is before
// the Unix epoch, after year 9999 or, when positive is set, rounds to the
// epoch itself.
func checkEncodableTime(t time.Time, positive bool) string {
	sec, ms := unixMillis(t)
	switch {
	case sec < 0:
		return "must not be before the Unix epoch"
	case positive && sec == 0 && ms == 0:
		return "must be after the Unix epoch"
	case sec > maxUnixSeconds:
		return errOutOfRange.Error()
	}
	return ""
}

// WithRetryCount returns message bytes that decode to the same request as
// raw, with RetryCount n. raw must decode (see Decode).
//
// An envelope is rewritten in place: only the value of internal.retry_count
// changes (it is added when absent), every other byte, data and labels
// included, is kept. A flat message is wrapped verbatim in an envelope,
//
//	{"request_kind":"plain","internal":{"retry_count":n},"data":<raw>}
//
// so its request decodes with Kind "plain" from then on. To write the
// request's labels as well, use WithEnvelope.
func WithRetryCount(raw []byte, n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("set retry count %d: must not be negative", n)
	}
	out, err := setInternal(raw, n, nil, false)
	if err != nil {
		return nil, fmt.Errorf("set retry count: %w", err)
	}
	return out, nil
}

// WithEnvelope returns message bytes that decode to the same request as raw,
// with RetryCount retryCount and Labels labels: what a request is re-queued
// with. labels are the request's full current labels (Request.Labels), so
// they replace whatever labels raw holds. raw must decode (see Decode).
//
// An envelope is rewritten in place: only the values of internal.retry_count
// and internal.labels change (each is added when absent), every other byte,
// data included, is kept. labels are written as a JSON object with sorted
// keys, each key and value as json.Marshal writes a string. When labels is
// empty and raw's request has no labels either, no labels member is written
// (the result is then WithRetryCount's); when labels is empty and raw's
// request has some, they are overwritten with {}. A flat message is wrapped
// verbatim in an envelope,
//
//	{"request_kind":"plain","internal":{"retry_count":n,"labels":{..}},"data":<raw>}
//
// (labels left out when empty), so its request decodes with Kind "plain"
// from then on.
//
// Decode of the result gives back labels exactly, except that empty labels
// decode as nil and invalid UTF-8 in a key or value decodes as U+FFFD.
func WithEnvelope(raw []byte, retryCount int, labels map[string]string) ([]byte, error) {
	if retryCount < 0 {
		return nil, fmt.Errorf("rewrite envelope: retry count %d must not be negative", retryCount)
	}
	out, err := setInternal(raw, retryCount, labels, true)
	if err != nil {
		return nil, fmt.Errorf("rewrite envelope: %w", err)
	}
	return out, nil
}

// setInternal is WithRetryCount and, when setLabels is set, WithEnvelope;
// its errors carry no context of their own.
func setInternal(raw []byte, n int, labels map[string]string, setLabels bool) ([]byte, error) {
	req, env, err := decode(raw)
	if err != nil {
		return nil, err
	}
	fields := make([]internalField, 1, 2)
	fields[0] = internalField{"retry_count", strconv.AppendInt(nil, int64(n), 10)}
	if setLabels && (len(labels) > 0 || len(req.Labels) > 0) {
		fields = append(fields, internalField{"labels", appendStringMap(nil, labels)})
	}
	return withInternal(raw, env, fields)
}

// WithKeptResult returns message bytes that decode to the same request as
// raw (retry count and labels included) with KeptResult result: what a
// request whose result could not be written is handed back with, so that
// the next delivery writes that result instead of calling the gateway
// again. result must be a JSON object (a marshalled Result); raw must
// decode. The member is internal.kept_result, added as WithEnvelope adds
// its members (a flat message is wrapped in an envelope).
func WithKeptResult(raw, result []byte) ([]byte, error) {
	if !jsonscan.Valid(result) || jsonKind(result) != "object" {
		return nil, errors.New("keep result: not a JSON object")
	}
	req, env, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("keep result: %w", err)
	}
	var kept bytes.Buffer
	if err := json.Compact(&kept, result); err != nil {
		return nil, fmt.Errorf("keep result: %w", err)
	}
	fields := []internalField{
		{"retry_count", strconv.AppendInt(nil, int64(req.RetryCount), 10)},
		{"kept_result", kept.Bytes()},
	}
	out, err := withInternal(raw, env, fields)
	if err != nil {
		return nil, fmt.Errorf("keep result: %w", err)
	}
	return out, nil
}

// withInternal sets fields in the internal object of raw: an envelope is
// rewritten in place (rewriteInternal), a flat message wrapped in one.
func withInternal(raw []byte, env bool, fields []internalField) ([]byte, error) {
	if !env {
		body := raw[jsonscan.SkipSpace(raw, 0):skipSpaceBack(raw)]
		b := make([]byte, 0, len(body)+64)
		b = append(b, `{"request_kind":"plain","internal":{`...)
		b = appendFields(b, fields)
		b = append(b, `},"data":`...)
		b = append(b, body...)
		return append(b, '}'), nil
	}
	// raw decoded, so it is valid JSON and the scan cannot fail.
	return rewriteInternal(raw, fields)
}

// internalField is a member of the envelope's internal object to set: its
// name as encoding/json matches it and its value as raw JSON.
type internalField struct {
	name  string
	value []byte
}

// appendFields appends fields as object members, comma-separated.
func appendFields(b []byte, fields []internalField) []byte {
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, f.name...)
		b = append(b, `":`...)
		b = append(b, f.value...)
	}
	return b
}

// splice is a replacement of raw[start:end] by with.
type splice struct {
	start, end int
	with       []byte
}

// rewriteInternal sets each of fields in the internal object of the
// envelope raw, matching member names as encoding/json does, so that the
// value decoded afterwards is the one given whatever duplicates raw holds.
// Every field's value must replace, not merge with, what an earlier
// occurrence decoded to (a number for retry_count, an object for labels).
//   - no internal: one holding just fields is inserted first;
//   - the last internal is an object: the last member matching each field
//     has its value replaced; the fields with no such member are inserted
//     first in it (after any earlier internal, so they win);
//   - the last internal is null (dropping all earlier ones): it becomes an
//     object holding just fields and the earlier ones become null, so that
//     nothing they held comes back.
func rewriteInternal(raw []byte, fields []internalField) ([]byte, error) {
	start := jsonscan.SkipSpace(raw, 0)
	members, _, err := objectMembers(raw, start)
	if err != nil {
		return nil, err
	}
	var internals []member
	for _, m := range members {
		if matchesField(m.name, "internal") {
			internals = append(internals, m)
		}
	}
	object := func() []byte {
		return append(appendFields([]byte{'{'}, fields), '}')
	}
	var edits []splice
	switch {
	case len(internals) == 0:
		with := append([]byte(`"internal":`), object()...)
		if len(members) > 0 {
			with = append(with, ',')
		}
		edits = append(edits, splice{start + 1, start + 1, with})
	case isNull(raw[internals[len(internals)-1].start:internals[len(internals)-1].end]):
		for _, m := range internals[:len(internals)-1] {
			edits = append(edits, splice{m.start, m.end, []byte("null")})
		}
		last := internals[len(internals)-1]
		edits = append(edits, splice{last.start, last.end, object()})
	default:
		last := internals[len(internals)-1]
		inner, _, err := objectMembers(raw, last.start)
		if err != nil {
			return nil, err
		}
		var missing []internalField
		for _, f := range fields {
			target := -1
			for i := range inner {
				if matchesField(inner[i].name, f.name) {
					target = i
				}
			}
			if target < 0 {
				missing = append(missing, f)
				continue
			}
			edits = append(edits, splice{inner[target].start, inner[target].end, f.value})
		}
		if len(missing) > 0 {
			with := appendFields(nil, missing)
			if len(inner) > 0 {
				with = append(with, ',')
			}
			edits = append(edits, splice{last.start + 1, last.start + 1, with})
		}
		// Members are replaced in the order of fields, not of raw.
		slices.SortFunc(edits, func(a, b splice) int { return a.start - b.start })
	}
	out := make([]byte, 0, len(raw)+32)
	pos := 0
	for _, e := range edits {
		out = append(out, raw[pos:e.start]...)
		out = append(out, e.with...)
		pos = e.end
	}
	return append(out, raw[pos:]...), nil
}
