package wire

import (
	"errors"
	"fmt"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// InternalMember is a member of an envelope's internal object to set with
// SetInternal: its name and its value as raw JSON.
type InternalMember struct {
	Name  string
	Value []byte
}

// SetInternal returns the envelope raw with members set in its internal
// object: each member's value replaced where the member exists (the last
// one encoding/json would read), added otherwise; every other byte is kept.
// It is what a transport stamps an envelope with at dequeue (upstream's
// request_queue_name, result_routing_resolved, ...). raw must be a JSON
// object; it is not decoded, so this costs one scan of its structure.
func SetInternal(raw []byte, members ...InternalMember) ([]byte, error) {
	if len(members) == 0 {
		return raw, nil
	}
	fields := make([]internalField, len(members))
	for i, m := range members {
		fields[i] = internalField{name: m.Name, value: m.Value}
	}
	out, err := rewriteInternal(raw, fields)
	if err != nil {
		return nil, fmt.Errorf("stamp envelope: %w", err)
	}
	return out, nil
}

// WithPayload returns the envelope raw with data.payload set to payload
// (raw JSON, written verbatim): how a payload kept in its own key
// (upstream's internal.payload_ref) is attached to its request, and, with
// payload "null", detached again. Every other byte is kept. raw must be a
// JSON object whose data member (the last one) is an object.
func WithPayload(raw, payload []byte) ([]byte, error) {
	start := jsonscan.SkipSpace(raw, 0)
	members, _, err := objectMembers(raw, start)
	if err != nil {
		return nil, fmt.Errorf("attach payload: %w", err)
	}
	data := -1
	for i, m := range members {
		if matchesField(m.name, "data") {
			data = i
		}
	}
	if data < 0 || raw[members[data].start] != '{' {
		return nil, errors.New("attach payload: the envelope has no data object")
	}
	d := members[data]
	inner, _, err := objectMembers(raw, d.start)
	if err != nil {
		return nil, fmt.Errorf("attach payload: %w", err)
	}
	at := -1
	for i, m := range inner {
		if matchesField(m.name, "payload") {
			at = i
		}
	}
	out := make([]byte, 0, len(raw)+len(payload)+16)
	if at < 0 {
		out = append(out, raw[:d.start+1]...)
		out = append(out, `"payload":`...)
		out = append(out, payload...)
		if len(inner) > 0 {
			out = append(out, ',')
		}
		return append(out, raw[d.start+1:]...), nil
	}
	out = append(out, raw[:inner[at].start]...)
	out = append(out, payload...)
	return append(out, raw[inner[at].end:]...), nil
}

// EnvelopeScan is what ScanEnvelope read: raw values, as encoding/json
// would store them in json.RawMessage fields (a null member reads
// "null"; an absent one nil).
type EnvelopeScan struct {
	// Kind is the raw request_kind.
	Kind []byte
	// HasInternal and HasData report an internal and a data object (absent
	// or null: false).
	HasInternal, HasData bool
	// Internal and Data hold the raw values of the member names asked for,
	// index by index.
	Internal, Data [][]byte
}

// ScanEnvelope reads, in one pass and without reflection, the raw values of
// request_kind and of the named members of an envelope's internal and data
// objects: what encoding/json reads into a struct of json.RawMessage
// fields (a pointer to a struct for internal and for data). It costs a
// validity check (jsonscan.Valid, json.Valid's answer) and one walk of the top two levels, with two allocations for
// the value slices. ok is false when encoding/json must decide: b is not
// valid JSON or not an object, internal or data is neither an object nor
// null, a member it reads is repeated or spelled in a way encoding/json
// folds (another case, escapes, non-ASCII). The caller then decodes b with
// encoding/json, whose answer defines the result.
func ScanEnvelope(b []byte, internal, data []string) (v EnvelopeScan, ok bool) {
	if len(internal) > 16 || len(data) > 16 || !jsonscan.Valid(b) {
		return v, false
	}
	v.Internal, v.Data = make([][]byte, len(internal)), make([][]byte, len(data))
	var seen uint16
	var in, dt []byte
	ok = jsonscan.EachMember(b, jsonscan.SkipSpace(b, 0), func(name, val []byte) bool {
		var f int
		switch string(name) {
		case "request_kind":
			f = 0
			v.Kind = val
		case "internal":
			f = 1
			in = val
		case "data":
			f = 2
			dt = val
		default:
			return !foldsTo(name, scanTopNames)
		}
		return once(&seen, f)
	})
	if !ok {
		return v, false
	}
	obj := func(val []byte, names []string, out [][]byte) (present, ok bool) {
		if val == nil || val[0] == 'n' {
			return false, true
		}
		if val[0] != '{' {
			return false, false
		}
		var seen uint16
		return true, jsonscan.EachMember(val, 0, func(name, m []byte) bool {
			for i, n := range names {
				if string(name) == n {
					out[i] = m
					return once(&seen, i)
				}
			}
			return !foldsTo(name, names)
		})
	}
	if v.HasInternal, ok = obj(in, internal, v.Internal); !ok {
		return v, false
	}
	if v.HasData, ok = obj(dt, data, v.Data); !ok {
		return v, false
	}
	return v, true
}

// scanTopNames are the top-level members ScanEnvelope reads.
var scanTopNames = []string{"request_kind", "internal", "data"}
