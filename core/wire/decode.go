package wire

import (
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// flatWire is the flat request on the wire; it is also the envelope's data.
type flatWire struct {
	ID               string          `json:"id"`
	Created          unixTime        `json:"created"`
	Deadline         unixTime        `json:"deadline"`
	Payload          json.RawMessage `json:"payload"`
	Metadata         metadataMap     `json:"metadata"`
	Headers          headerMap       `json:"headers"`
	Endpoint         string          `json:"endpoint"`
	RequestQueueName string          `json:"request_queue_name"`
	ResultQueueName  string          `json:"result_queue_name"`
	// Model is upstream's optional request model; a value that is not a
	// string is ignored, as it only labels traces.
	Model looseString `json:"model"`
}

// internalWire is the envelope's internal object. A queue_id that is not a
// string is ignored (it only labels metrics), and so is a labels value that
// is not an object (see labelMap).
type internalWire struct {
	RetryCount       int         `json:"retry_count"`
	QueueID          looseString `json:"queue_id"`
	RequestToken     string      `json:"request_token"`
	RequestQueueName string      `json:"request_queue_name"`
	ResultQueueName  string      `json:"result_queue_name"`
	Labels           labelMap    `json:"labels"`
	// KeptResult is sluice's internal.kept_result (see WithKeptResult).
	KeptResult json.RawMessage `json:"kept_result"`
}

// labelMap is the envelope's internal.labels. An object is read as metadata
// is (see metadataMap): string values are kept, numbers and booleans are
// taken as the text they were written as, null becomes "", and a nested
// object or array refuses the message (an envelope's: a flat message's
// internal is not read), naming the label. An empty object
// gives nil, and null clears what an earlier labels member gave. Any other
// value (a number, a string, an array) is ignored, as it was before sluice
// read labels at all: the member is then as good as absent.
type labelMap map[string]string

// UnmarshalJSON implements json.Unmarshaler.
func (l *labelMap) UnmarshalJSON(b []byte) error {
	if k := jsonKind(b); k != "object" && k != "null" {
		return nil
	}
	v, err := parseStringMap(b, true, nil)
	if err != nil {
		var ve *valueError
		if errors.As(err, &ve) {
			return &valueError{sub: ".labels" + ve.sub, msg: ve.msg}
		}
		return err
	}
	*l = v
	return nil
}

// looseString is a JSON string; any other JSON value decodes as "".
type looseString string

// UnmarshalJSON keeps a string and ignores any other value.
func (s *looseString) UnmarshalJSON(b []byte) error {
	var v string
	if json.Unmarshal(b, &v) == nil {
		*s = looseString(v)
	}
	return nil
}

// messageWire is either form, decoded in one pass: the flat fields at the top
// level, the envelope fields next to them. Which one applies is decided
// afterwards (see isEnvelope).
type messageWire struct {
	flatWire
	RequestKind *string       `json:"request_kind"`
	Internal    *internalWire `json:"internal"`
	Data        *flatWire     `json:"data"`
}

// Decode parses a request message in the flat or the envelope form.
//
// A message is an envelope when it has a non-null "data" and a non-null
// "request_kind" or "internal"; otherwise it is flat and any "data" is
// ignored, like every other unknown field. Field names match as
// encoding/json matches them (exactly, else case-insensitively) and, when a
// name repeats, the last occurrence wins.
//
// Any failure is a *DecodeError. Its ID (and Metadata) are set whenever the
// id could be read, so the caller can answer with an INVALID_REQUEST result
// (see DecodeError.Result); an empty ID means the message is not answerable
// and belongs in a dead-letter destination.
func Decode(b []byte) (*Request, error) {
	req, _, err := decode(b)
	if err != nil {
		return nil, err
	}
	return req, nil
}

// decode is Decode, also reporting whether the message was an envelope.
//
// The common case is scanMessage's single pass without reflection; what it
// does not take costs a json.Unmarshal into messageWire. That pass
// fails on anything unusual (a type error anywhere, even in a field the
// form ignores), and the message then goes through decodeSlow, which
// decodes field by field to name what is wrong and recover the id. The slow
// path alone defines what is accepted: the fast path only ever accepts what
// the slow path accepts, with the same result (FuzzDecode checks this).
func decode(b []byte) (*Request, bool, error) {
	if req, env, ok := scanMessage(b); ok {
		return req, env, nil
	}
	if req, env, ok := decodeJSON(b); ok {
		return req, env, nil
	}
	req, env, derr := decodeSlow(b)
	if derr != nil {
		return nil, env, derr
	}
	return req, env, nil
}

// decodeJSON is the encoding/json pass of decode; ok is false when it
// fails or the request it finds is refused.
func decodeJSON(b []byte) (req *Request, env, ok bool) {
	var w messageWire
	if json.Unmarshal(b, &w) == nil {
		env := w.Data != nil && (w.RequestKind != nil || w.Internal != nil)
		src, kind := &w.flatWire, ""
		if env {
			src = w.Data
			if w.RequestKind != nil {
				kind = *w.RequestKind
			}
		}
		if req, derr := build(src, env, kind, w.Internal); derr == nil {
			return req, env, true
		}
	}
	return nil, false, false
}

// build checks the decoded fields and makes the Request. The envelope's
// internal is only looked at when env is set.
func build(f *flatWire, env bool, kind string, in *internalWire) (*Request, *DecodeError) {
	prefix := ""
	if env {
		prefix = "data."
	}
	if f.ID == "" {
		return nil, &DecodeError{Reason: prefix + "id: missing or empty"}
	}
	fail := func(reason string) *DecodeError {
		return &DecodeError{ID: f.ID, Metadata: f.Metadata, Reason: prefix + reason}
	}
	switch {
	case !f.Deadline.set:
		return nil, fail("deadline: missing")
	case !f.Deadline.positive():
		return nil, fail("deadline: must be after the Unix epoch (> 0)")
	case f.Created.neg:
		return nil, fail("created: must not be before the Unix epoch")
	case len(f.Payload) == 0:
		return nil, fail("payload: missing")
	case f.Payload[0] != '{':
		return nil, fail("payload: must be a JSON object, got " + jsonKind(f.Payload))
	}
	if msg := checkEndpoint(f.Endpoint); msg != "" {
		return nil, fail("endpoint: " + msg)
	}
	req := &Request{
		ID:               f.ID,
		Created:          f.Created.time(),
		Deadline:         f.Deadline.time(),
		Payload:          f.Payload,
		Metadata:         f.Metadata,
		Headers:          f.Headers,
		Endpoint:         f.Endpoint,
		RequestQueueName: f.RequestQueueName,
		ResultQueueName:  f.ResultQueueName,
		Model:            string(f.Model),
	}
	if !env {
		return req, nil
	}
	req.Kind = kind
	if in != nil {
		if in.RetryCount < 0 {
			return nil, &DecodeError{ID: f.ID, Metadata: f.Metadata, Reason: "internal.retry_count: must not be negative"}
		}
		req.RetryCount = in.RetryCount
		req.Token = in.RequestToken
		req.QueueID = string(in.QueueID)
		req.Labels = in.Labels
		if len(in.KeptResult) > 0 && !isNull(in.KeptResult) {
			req.KeptResult = in.KeptResult
		}
		if in.RequestQueueName != "" {
			req.RequestQueueName = in.RequestQueueName
		}
		if in.ResultQueueName != "" {
			req.ResultQueueName = in.ResultQueueName
		}
	}
	return req, nil
}

// checkEndpoint returns why endpoint is not an acceptable request path, or "".
// A path must start with one slash ("//host/..." would name another host
// when resolved against the gateway URL) and hold no spaces or control
// characters.
func checkEndpoint(endpoint string) string {
	if endpoint == "" {
		return ""
	}
	if endpoint[0] != '/' || strings.HasPrefix(endpoint, "//") {
		return `must be a path starting with a single "/", got ` + strconv.Quote(endpoint)
	}
	for i := 0; i < len(endpoint); i++ {
		if c := endpoint[i]; c <= ' ' || c == 0x7f {
			return "must not hold spaces or control characters, got " + strconv.Quote(endpoint)
		}
	}
	return ""
}

// rawValues collects every occurrence of an object member, in order, as raw
// JSON aliasing the input.
type rawValues [][]byte

// UnmarshalJSON implements json.Unmarshaler.
func (r *rawValues) UnmarshalJSON(b []byte) error {
	*r = append(*r, b)
	return nil
}

// present reports whether the member occurred and its last value is not null.
func (r rawValues) present() bool { return len(r) > 0 && !isNull(r[len(r)-1]) }

// looseFlat mirrors flatWire with every field kept raw.
type looseFlat struct {
	ID               rawValues `json:"id"`
	Created          rawValues `json:"created"`
	Deadline         rawValues `json:"deadline"`
	Payload          rawValues `json:"payload"`
	Metadata         rawValues `json:"metadata"`
	Headers          rawValues `json:"headers"`
	Endpoint         rawValues `json:"endpoint"`
	RequestQueueName rawValues `json:"request_queue_name"`
	ResultQueueName  rawValues `json:"result_queue_name"`
	Model            rawValues `json:"model"`
}

// looseMessage mirrors messageWire with every field kept raw.
type looseMessage struct {
	looseFlat
	RequestKind rawValues `json:"request_kind"`
	Internal    rawValues `json:"internal"`
	Data        rawValues `json:"data"`
}

// decodeSlow decodes b field by field. Each field's occurrences are replayed
// into the same typed value the fast path decodes into, so both agree on
// what is accepted; what differs is that a failure is pinned to its field
// and the id and metadata are read first, to be reported with it.
func decodeSlow(b []byte) (*Request, bool, *DecodeError) {
	if jsonscan.SkipSpace(b, 0) == len(b) {
		return nil, false, &DecodeError{Reason: "empty message"}
	}
	var m looseMessage
	if err := json.Unmarshal(b, &m); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, false, &DecodeError{Reason: "not valid JSON: " + se.Error() + " (offset " + strconv.FormatInt(se.Offset, 10) + ")"}
		}
		return nil, false, &DecodeError{Reason: "must be a JSON object, got " + jsonKind(b)}
	}
	if k := jsonKind(b); k != "object" {
		return nil, false, &DecodeError{Reason: "must be a JSON object, got " + k}
	}

	env := m.Data.present() && (m.RequestKind.present() || m.Internal.present())
	src, prefix := &m.looseFlat, ""
	if env {
		// Like a *flatWire field: null resets, objects merge in order.
		src, prefix = &looseFlat{}, "data."
		for _, v := range m.Data {
			if isNull(v) {
				*src = looseFlat{}
				continue
			}
			if k := jsonKind(v); k != "object" {
				return nil, env, &DecodeError{Reason: "data: must be a JSON object, got " + k}
			}
			if err := json.Unmarshal(v, src); err != nil {
				return nil, env, &DecodeError{Reason: "data: " + err.Error()}
			}
		}
	}

	var f flatWire
	if err := replay(src.ID, &f.ID); err != nil {
		return nil, env, &DecodeError{Reason: reason(prefix+"id", err)}
	}
	if f.ID == "" {
		return nil, env, &DecodeError{Reason: prefix + "id: missing or empty"}
	}
	if err := replay(src.Metadata, &f.Metadata); err != nil {
		return nil, env, &DecodeError{ID: f.ID, Reason: reason(prefix+"metadata", err)}
	}
	fail := func(field string, err error) *DecodeError {
		return &DecodeError{ID: f.ID, Metadata: f.Metadata, Reason: reason(field, err)}
	}
	fields := []struct {
		name string
		vals rawValues
		dst  any
	}{
		{"created", src.Created, &f.Created},
		{"deadline", src.Deadline, &f.Deadline},
		{"payload", src.Payload, &f.Payload},
		{"headers", src.Headers, &f.Headers},
		{"endpoint", src.Endpoint, &f.Endpoint},
		{"request_queue_name", src.RequestQueueName, &f.RequestQueueName},
		{"result_queue_name", src.ResultQueueName, &f.ResultQueueName},
		{"model", src.Model, &f.Model},
	}
	for _, fd := range fields {
		if err := replay(fd.vals, fd.dst); err != nil {
			return nil, env, fail(prefix+fd.name, err)
		}
	}
	var (
		kind *string
		in   *internalWire
	)
	if env {
		if err := replay(m.RequestKind, &kind); err != nil {
			return nil, env, fail("request_kind", err)
		}
		if err := replay(m.Internal, &in); err != nil {
			return nil, env, fail("internal", err)
		}
	}
	k := ""
	if kind != nil {
		k = *kind
	}
	req, derr := build(&f, env, k, in)
	return req, env, derr
}

// replay decodes each occurrence into dst in order, as encoding/json does
// when a member name repeats.
func replay(vals rawValues, dst any) error {
	for _, v := range vals {
		if err := json.Unmarshal(v, dst); err != nil {
			return err
		}
	}
	return nil
}

// reason phrases a field's decoding error.
func reason(field string, err error) string {
	var ve *valueError
	if errors.As(err, &ve) {
		return field + ve.sub + ": " + ve.msg
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			field += "." + te.Field
		}
		return field + ": must be " + describeType(te.Type) + ", got " + te.Value
	}
	return field + ": " + err.Error()
}

// describeType names a Go type the way a producer thinks of JSON.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Struct, reflect.Map:
		return "a JSON object"
	default:
		return t.String()
	}
}
