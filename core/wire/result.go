package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// Marshal returns the result as COMPAT.md writes it:
//
//	{"id":..,"status_code":..,"payload":"..","metadata":{..},"error_code":..,"error_message":..}
//
// status_code is omitted when 0, metadata when empty, error_code on success
// and error_message when empty; payload is always present, as a string. The
// bytes are those json.Marshal(r) would produce (keys sorted, HTML-sensitive
// characters escaped), written without reflection.
func (r *Result) Marshal() []byte {
	n := 64 + len(r.ID) + len(r.Payload) + len(r.Payload)/8 + len(r.ErrorCode) + len(r.ErrorMessage)
	for k, v := range r.Metadata {
		n += len(k) + len(v) + 6
	}
	return r.AppendJSON(make([]byte, 0, n))
}

// AppendJSON appends the JSON of Marshal to b and returns the extended slice,
// for callers that reuse a buffer.
func (r *Result) AppendJSON(b []byte) []byte {
	b = append(b, `{"id":`...)
	b = appendString(b, r.ID)
	if r.StatusCode != 0 {
		b = append(b, `,"status_code":`...)
		b = strconv.AppendInt(b, int64(r.StatusCode), 10)
	}
	b = append(b, `,"payload":`...)
	b = appendString(b, r.Payload)
	if len(r.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		b = appendStringMap(b, r.Metadata)
	}
	if r.ErrorCode != CodeNone {
		b = append(b, `,"error_code":`...)
		b = appendString(b, string(r.ErrorCode))
	}
	if r.ErrorMessage != "" {
		b = append(b, `,"error_message":`...)
		b = appendString(b, r.ErrorMessage)
	}
	return append(b, '}')
}

// appendStringMap appends m as a JSON object with its keys sorted.
func appendStringMap(b []byte, m map[string]string) []byte {
	var buf [16]string
	keys := buf[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, m[k])
	}
	return append(b, '}')
}

// errMissingResultID is returned by DecodeResult for a result without an id.
var errMissingResultID = errors.New("id: missing or empty")

// DecodeResult parses a result message written by Marshal (or by upstream).
// Unknown fields are ignored; known fields must have their documented types
// and the id must be set.
func DecodeResult(b []byte) (*Result, error) {
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode result: %w", err)
	}
	if r.ID == "" {
		return nil, fmt.Errorf("decode result: %w", errMissingResultID)
	}
	return &r, nil
}

// ErrorPayload returns the result payload used when no HTTP response came
// back: {"error":"<msg>"}, with msg escaped as json.Marshal escapes it.
func ErrorPayload(msg string) string {
	b := make([]byte, 0, len(msg)+16)
	b = append(b, `{"error":`...)
	b = appendString(b, msg)
	return string(append(b, '}'))
}

// ErrorResult returns the failed result for req: its id and metadata (the
// map is shared, not copied), code, msg as error_message and
// ErrorPayload(msg) as payload. StatusCode is left 0; set it when an HTTP
// response did come back (and then the payload is usually its body).
func ErrorResult(req *Request, code ErrorCode, msg string) *Result {
	return &Result{
		ID:           req.ID,
		Payload:      ErrorPayload(msg),
		Metadata:     req.Metadata,
		ErrorCode:    code,
		ErrorMessage: msg,
	}
}

// Result returns the INVALID_REQUEST result answering the message that
// failed to decode. It is only meaningful when e.ID is set: without an id
// nobody can match the result, and the message belongs in a dead-letter
// destination instead.
func (e *DecodeError) Result() *Result {
	return &Result{
		ID:           e.ID,
		Payload:      ErrorPayload(e.Reason),
		Metadata:     e.Metadata,
		ErrorCode:    CodeInvalidRequest,
		ErrorMessage: e.Reason,
	}
}
