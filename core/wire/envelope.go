package wire

import (
	"errors"
	"fmt"
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
	start := skipSpace(raw, 0)
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
