package batch

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// This file reads the few members the front needs from a JSON object by
// byte offset, without reflection: each line of a batch is read once to
// validate it and once to enqueue it, and each response body once, so the
// per-line cost of encoding/json's decoder (a validating pass, then a
// reflective pass that allocates) was most of the front's own work
// (docs/benchmarks.md, batch-api). Every function here takes JSON that
// json.Valid accepted; the callers check that first. Member names match
// as encoding/json matches them to struct fields (case-insensitively),
// and a name given twice takes the last value, as there.

// eachMember calls fn with the name (between its quotes, escapes as
// written) and raw value of every member of the object b, in order; it
// reports false when b is not an object (null is one without members, as
// decoding null into a struct leaves it as it was). b must be valid JSON.
func eachMember(b []byte, fn func(name, value []byte)) bool {
	if string(trimSpace(b)) == "null" {
		return true
	}
	return jsonscan.EachMember(b, jsonscan.SkipSpace(b, 0), func(name, value []byte) bool {
		fn(name, value)
		return true
	})
}

// nameIs reports whether the member name (between its quotes) matches
// field as encoding/json matches a member name to a struct field.
func nameIs(name []byte, field string) bool {
	if string(name) == field {
		return true
	}
	if bytes.IndexByte(name, '\\') < 0 {
		return bytes.EqualFold(name, []byte(field))
	}
	quoted := make([]byte, 0, len(name)+2)
	quoted = append(append(append(quoted, '"'), name...), '"')
	var s string
	return json.Unmarshal(quoted, &s) == nil && bytes.EqualFold([]byte(s), []byte(field))
}

// stringValue reads a string value: ok is false when it is not a string
// (null gives "" and true, leaving the field as encoding/json leaves it).
func stringValue(v []byte) (s string, ok bool) {
	switch {
	case string(v) == "null":
		return "", true
	case len(v) < 2 || v[0] != '"':
		return "", false
	}
	raw := v[1 : len(v)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw), true
	}
	// Escapes or invalid UTF-8 (replaced with U+FFFD): encoding/json's
	// own reading.
	return s, json.Unmarshal(v, &s) == nil
}

// stringIs reports whether the raw string token v (nil: absent or null,
// read as "") reads as s, as stringValue(v) == s would, without
// allocating when v has no escapes.
func stringIs(v []byte, s string) bool {
	if v == nil {
		return s == ""
	}
	if len(v) < 2 || v[0] != '"' {
		return false
	}
	raw := v[1 : len(v)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw) == s
	}
	str, ok := stringValue(v)
	return ok && str == s
}

// trimSpace drops the JSON whitespace around b.
func trimSpace(b []byte) []byte {
	i := jsonscan.SkipSpace(b, 0)
	j := len(b)
	for j > i {
		switch b[j-1] {
		case ' ', '\t', '\r', '\n':
			j--
			continue
		}
		break
	}
	return b[i:j]
}

// bodyUsageOf returns the usage member of a response body (valid JSON, an
// object or not), as decoding the body into bodyUsage would: nil when the
// body is not an object, has no usage or one that does not decode.
func bodyUsageOf(body []byte) *lineUsage {
	var lu *lineUsage
	ok := true
	if !eachMember(body, func(name, v []byte) {
		if nameIs(name, "usage") && !decodeUsage(v, &lu) {
			ok = false
		}
	}) || !ok {
		return nil
	}
	return lu
}

// decodeUsage reads the usage value v (valid JSON) into *lu by byte
// offset, as json.Unmarshal(v, lu) would (null sets *lu nil; an object
// fills *lu, allocated when nil, member by member); false where that
// would fail (a value of another type, a number that is not an int64).
// Every response body's usage is read (1 µs a line with encoding/json's
// reflective decoder, most of building an output line).
func decodeUsage(v []byte, lu **lineUsage) bool {
	if string(v) == "null" {
		*lu = nil
		return true
	}
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	if *lu == nil {
		*lu = new(lineUsage)
	}
	u := *lu
	ok := true
	eachMember(v, func(name, v []byte) {
		var dst *int64
		switch {
		case nameIs(name, "prompt_tokens"):
			dst = &u.PromptTokens
		case nameIs(name, "completion_tokens"):
			dst = &u.CompletionTokens
		case nameIs(name, "input_tokens"):
			dst = &u.InputTokens
		case nameIs(name, "output_tokens"):
			dst = &u.OutputTokens
		case nameIs(name, "total_tokens"):
			dst = &u.TotalTokens
		case nameIs(name, "prompt_tokens_details"):
			ok = detailInto(v, "cached_tokens", &u.PromptTokensDetails, cachedOf) && ok
			return
		case nameIs(name, "input_tokens_details"):
			ok = detailInto(v, "cached_tokens", &u.InputTokensDetails, cachedOf) && ok
			return
		case nameIs(name, "completion_tokens_details"):
			ok = detailInto(v, "reasoning_tokens", &u.CompletionTokensDetails, reasoningOf) && ok
			return
		case nameIs(name, "output_tokens_details"):
			ok = detailInto(v, "reasoning_tokens", &u.OutputTokensDetails, reasoningOf) && ok
			return
		default:
			return
		}
		ok = decodeInt(v, dst) && ok
	})
	return ok
}

// decodeDetail reads a details object of one int64 member (field) as
// json.Unmarshal into a pointer to its struct would: null clears the
// pointer (clear), an object allocates it when nil (n returns the
// member's address, allocating) and sets the member it names.
func decodeDetail(v []byte, field string, n func() *int64, clear func()) bool {
	if string(v) == "null" {
		clear()
		return true
	}
	if len(v) == 0 || v[0] != '{' {
		return false
	}
	dst := n()
	ok := true
	eachMember(v, func(name, v []byte) {
		if nameIs(name, field) {
			ok = decodeInt(v, dst) && ok
		}
	})
	return ok
}

// decodeInt reads a JSON number into an int64 as encoding/json does (an
// integer literal in range; null leaves *n as it was).
func decodeInt(v []byte, n *int64) bool {
	if string(v) == "null" {
		return true
	}
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return false
	}
	i, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return false
	}
	*n = i
	return true
}

// detailInto decodes the details object v into *p (member is its one
// counted field, field its place in T), allocating *p on the first count
// and clearing it on null, as decodeDetail's callbacks ask.
func detailInto[T any](v []byte, member string, p **T, field func(*T) *int64) bool {
	return decodeDetail(v, member, func() *int64 {
		if *p == nil {
			*p = new(T)
		}
		return field(*p)
	}, func() { *p = nil })
}

func cachedOf(d *cachedTokens) *int64       { return &d.CachedTokens }
func reasoningOf(d *reasoningTokens) *int64 { return &d.ReasoningTokens }
