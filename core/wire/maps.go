package wire

import (
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// valueError is a decoding failure inside a field's value. sub locates it
// below the field (`["job_id"]`), empty when the value as a whole is wrong.
type valueError struct {
	sub string
	msg string
}

// Error implements error.
func (e *valueError) Error() string { return e.sub + ": " + e.msg }

// metadataMap is the request's metadata: a JSON object whose values are
// strings. Producers vary, so numbers and booleans are taken as the text
// they were written as (42 → "42") and null as "". Nested objects and
// arrays are refused. Each occurrence replaces the previous one; null
// clears it.
type metadataMap map[string]string

// UnmarshalJSON implements json.Unmarshaler.
func (m *metadataMap) UnmarshalJSON(b []byte) error {
	v, err := parseStringMap(b, true, nil)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// headerMap is the request's headers: a JSON object whose values are
// strings, each a valid HTTP header field. Each occurrence replaces the
// previous one; null clears it.
type headerMap map[string]string

// UnmarshalJSON implements json.Unmarshaler.
func (h *headerMap) UnmarshalJSON(b []byte) error {
	v, err := parseStringMap(b, false, checkHeader[[]byte])
	if err != nil {
		return err
	}
	*h = v
	return nil
}

// parseStringMap decodes the JSON object b into a map; nil for null or an
// empty object. Values must be strings; when lenient, numbers and booleans
// are kept as written and null becomes "". check, when set, vets each
// member. All keys and values share one allocation.
func parseStringMap(b []byte, lenient bool, check func(key, value []byte) error) (map[string]string, error) {
	want := "a string"
	if lenient {
		want = "a string, number or bool"
	}
	i := jsonscan.SkipSpace(b, 0)
	if i < len(b) && b[i] == 'n' && isNull(b[i:skipSpaceBack(b)]) {
		return nil, nil
	}
	if i >= len(b) || b[i] != '{' {
		return nil, &valueError{msg: "must be a JSON object of strings, got " + jsonKind(b)}
	}
	type pair struct{ key, value []byte }
	var stack [16]pair
	pairs, size := stack[:0], 0
	i = jsonscan.SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		i++
	} else {
		for {
			end, ok := jsonscan.StringEnd(b, i)
			if !ok {
				return nil, errSyntax
			}
			key, err := unquote(b[i:end])
			if err != nil {
				return nil, err
			}
			i = jsonscan.SkipSpace(b, end)
			if i >= len(b) || b[i] != ':' {
				return nil, errSyntax
			}
			i = jsonscan.SkipSpace(b, i+1)
			if end, ok = jsonscan.ValueEnd(b, i); !ok {
				return nil, errSyntax
			}
			value := b[i:end]
			switch c := value[0]; {
			case c == '"':
				if value, err = unquote(value); err != nil {
					return nil, err
				}
			case lenient && c == 'n':
				value = nil
			case lenient && c != '{' && c != '[':
				// a number or a boolean, kept as written
			default:
				return nil, &valueError{
					sub: "[" + strconv.Quote(string(key)) + "]",
					msg: "must be " + want + ", got " + jsonKind(value),
				}
			}
			if check != nil {
				if err := check(key, value); err != nil {
					return nil, err
				}
			}
			pairs = append(pairs, pair{key, value})
			size += len(key) + len(value)
			i = jsonscan.SkipSpace(b, end)
			if i >= len(b) {
				return nil, errSyntax
			}
			if b[i] == '}' {
				i++
				break
			}
			if b[i] != ',' {
				return nil, errSyntax
			}
			i = jsonscan.SkipSpace(b, i+1)
		}
	}
	if jsonscan.SkipSpace(b, i) != len(b) {
		return nil, errSyntax
	}
	if len(pairs) == 0 {
		return nil, nil
	}
	var sb strings.Builder
	sb.Grow(size)
	for _, p := range pairs {
		sb.Write(p.key)
		sb.Write(p.value)
	}
	all := sb.String()
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		key := all[:len(p.key)]
		value := all[len(p.key) : len(p.key)+len(p.value)]
		all = all[len(p.key)+len(p.value):]
		m[key] = value
	}
	return m, nil
}

// skipSpaceBack returns the length of b without trailing whitespace.
func skipSpaceBack(b []byte) int {
	n := len(b)
	for n > 0 {
		switch b[n-1] {
		case ' ', '\t', '\n', '\r':
			n--
		default:
			return n
		}
	}
	return n
}

// checkHeader refuses a header that net/http would refuse to send: a name
// that is not an RFC 9110 token, a value with control characters (CR and LF
// included) other than horizontal tab.
func checkHeader[T string | []byte](name, value T) error {
	msg := ""
	if len(name) == 0 {
		msg = "empty header name"
	}
	for i := 0; i < len(name) && msg == ""; i++ {
		if !isTokenChar(name[i]) {
			msg = "invalid header name"
		}
	}
	for i := 0; i < len(value) && msg == ""; i++ {
		if c := value[i]; (c < ' ' && c != '\t') || c == 0x7f {
			msg = "header value holds a control character"
		}
	}
	if msg == "" {
		return nil
	}
	return &valueError{sub: "[" + strconv.Quote(string(name)) + "]", msg: msg}
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
