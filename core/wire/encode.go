package wire

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// EncodeRequest returns r in the flat form, for producers:
//
//	{"id":..,"created":..,"deadline":..,"payload":{..},"metadata":{..},"headers":{..},"endpoint":..}
//
// created and deadline are Unix seconds rounded to the millisecond, written
// as integers when whole ("1700000000") and as fractions otherwise
// ("1700000000.25"); the payload bytes are written verbatim (surrounding
// whitespace aside); created, metadata, headers, endpoint and the queue names
// are omitted when empty. The envelope fields Kind, RetryCount and Token are
// not part of the flat form and are not written (see WithRetryCount).
//
// r must be a request Decode would accept, so Decode(EncodeRequest(r))
// returns r again (with times at millisecond precision).
func EncodeRequest(r *Request) ([]byte, error) {
	if msg := checkEncodable(r); msg != "" {
		return nil, fmt.Errorf("encode request %q: %s", r.ID, msg)
	}
	payload := r.Payload[skipSpace(r.Payload, 0):skipSpaceBack(r.Payload)]
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
	if !json.Valid(r.Payload) {
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
// changes (it is added when absent), every other byte, data included, is
// kept. A flat message is wrapped verbatim in an envelope,
//
//	{"request_kind":"plain","internal":{"retry_count":n},"data":<raw>}
//
// so its request decodes with Kind "plain" from then on.
func WithRetryCount(raw []byte, n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("set retry count %d: must not be negative", n)
	}
	_, env, err := decode(raw)
	if err != nil {
		return nil, fmt.Errorf("set retry count: %w", err)
	}
	count := strconv.AppendInt(nil, int64(n), 10)
	if !env {
		body := raw[skipSpace(raw, 0):skipSpaceBack(raw)]
		b := make([]byte, 0, len(body)+64)
		b = append(b, `{"request_kind":"plain","internal":{"retry_count":`...)
		b = append(b, count...)
		b = append(b, `},"data":`...)
		b = append(b, body...)
		return append(b, '}'), nil
	}
	out, err := rewriteRetryCount(raw, count)
	if err != nil {
		// raw decoded, so it is valid JSON and the scan cannot fail.
		return nil, fmt.Errorf("set retry count: %w", err)
	}
	return out, nil
}

// splice is a replacement of raw[start:end] by with.
type splice struct {
	start, end int
	with       []byte
}

// rewriteRetryCount sets internal.retry_count to count in the envelope raw,
// matching member names as encoding/json does, so that the value decoded
// afterwards is count whatever duplicates raw holds:
//   - no internal: one is inserted first;
//   - the last internal is an object: its last retry_count is replaced, or
//     one is inserted first in it (after any earlier internal, so it wins);
//   - the last internal is null (dropping all earlier ones): it becomes
//     {"retry_count":count} and the earlier ones become null, so that
//     nothing they held comes back.
func rewriteRetryCount(raw, count []byte) ([]byte, error) {
	start := skipSpace(raw, 0)
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
	var edits []splice
	switch {
	case len(internals) == 0:
		with := []byte(`"internal":{"retry_count":` + string(count) + `}`)
		if len(members) > 0 {
			with = append(with, ',')
		}
		edits = append(edits, splice{start + 1, start + 1, with})
	case isNull(raw[internals[len(internals)-1].start:internals[len(internals)-1].end]):
		for _, m := range internals[:len(internals)-1] {
			edits = append(edits, splice{m.start, m.end, []byte("null")})
		}
		last := internals[len(internals)-1]
		edits = append(edits, splice{last.start, last.end, []byte(`{"retry_count":` + string(count) + `}`)})
	default:
		last := internals[len(internals)-1]
		inner, _, err := objectMembers(raw, last.start)
		if err != nil {
			return nil, err
		}
		var target *member
		for i := range inner {
			if matchesField(inner[i].name, "retry_count") {
				target = &inner[i]
			}
		}
		if target != nil {
			edits = append(edits, splice{target.start, target.end, count})
		} else {
			with := []byte(`"retry_count":` + string(count))
			if len(inner) > 0 {
				with = append(with, ',')
			}
			edits = append(edits, splice{last.start + 1, last.start + 1, with})
		}
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
