package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode/utf8"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// This file holds the small JSON helpers the package needs beyond
// encoding/json: naming the kind of a raw value, unquoting a string token,
// walking the members of an object by byte offset (to rewrite one value and
// keep every other byte) and appending a string the way json.Marshal does.

var errSyntax = errors.New("malformed JSON")

// jsonKind names the kind of the raw JSON value b for error messages.
func jsonKind(b []byte) string {
	i := jsonscan.SkipSpace(b, 0)
	if i >= len(b) {
		return "nothing"
	}
	switch b[i] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "bool"
	case 'n':
		return "null"
	default:
		return "number"
	}
}

// isNull reports whether the raw JSON value b is null.
func isNull(b []byte) bool { return string(b) == "null" }

// snippet quotes a raw JSON value for an error message, shortened when long.
func snippet(b []byte) string {
	const limit = 40
	if len(b) > limit {
		return string(b[:limit]) + "..."
	}
	return string(b)
}

// unquote returns the contents of the JSON string token b. The result aliases
// b unless b holds escapes or invalid UTF-8, which encoding/json resolves
// (replacing invalid bytes with U+FFFD, as it does everywhere else).
func unquote(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return nil, errSyntax
	}
	s := b[1 : len(b)-1]
	ascii := true
	for _, c := range s {
		if c == '\\' || c == '"' || c < ' ' {
			return unquoteSlow(b)
		}
		if c >= utf8.RuneSelf {
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(s) {
		return unquoteSlow(b)
	}
	return s, nil
}

func unquoteSlow(b []byte) ([]byte, error) {
	var str string
	if err := json.Unmarshal(b, &str); err != nil {
		return nil, errSyntax
	}
	return []byte(str), nil
}

// member is one name/value pair of a JSON object, located by byte offsets.
type member struct {
	name       []byte // the unquoted name (aliasing the input when it has no escapes)
	start, end int    // the value is b[start:end]
}

// objectMembers lists the members of the JSON object that starts at b[i], in
// order (duplicates included), and returns the index just past its '}'.
func objectMembers(b []byte, i int) ([]member, int, error) {
	if i >= len(b) || b[i] != '{' {
		return nil, 0, errSyntax
	}
	ms := make([]member, 0, 8) // one allocation for the usual object
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, i + 1, nil
	}
	for {
		end, ok := jsonscan.StringEnd(b, i)
		if !ok {
			return nil, 0, errSyntax
		}
		name, err := unquote(b[i:end])
		if err != nil {
			return nil, 0, err
		}
		i = jsonscan.SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, 0, errSyntax
		}
		i = jsonscan.SkipSpace(b, i+1)
		if end, ok = jsonscan.ValueEnd(b, i); !ok {
			return nil, 0, errSyntax
		}
		ms = append(ms, member{name: name, start: i, end: end})
		i = jsonscan.SkipSpace(b, end)
		if i >= len(b) {
			return nil, 0, errSyntax
		}
		switch b[i] {
		case ',':
			i = jsonscan.SkipSpace(b, i+1)
		case '}':
			return ms, i + 1, nil
		default:
			return nil, 0, errSyntax
		}
	}
}

// matchesField reports whether encoding/json decodes an object member named
// name into the struct field tagged field: an exact or case-folded match.
func matchesField(name []byte, field string) bool {
	return string(name) == field || bytes.EqualFold(name, []byte(field))
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, byte for byte as json.Marshal
// writes it: HTML-sensitive characters, U+2028 and U+2029 escaped, invalid
// UTF-8 replaced by U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
