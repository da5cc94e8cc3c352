package message

import (
	"strconv"
)

// valueError is a decoding failure inside a field's value. sub locates it
// below the field (`["job_id"]`), empty when the value as a whole is wrong.
type valueError struct {
	sub string
	msg string
}

func (e *valueError) Error() string { return e.sub + ": " + e.msg }

// metadataMap is the request's metadata: a JSON object whose values are
// strings. Producers vary, so numbers and booleans are taken as the text
// they were written as (42 → "42") and null as "". Nested objects and
// arrays are refused. Each occurrence replaces the previous one; null
// clears it.
type metadataMap map[string]string

// UnmarshalJSON implements json.Unmarshaler.
func (m *metadataMap) UnmarshalJSON(b []byte) error {
	v, err := parseStringMap(b, true)
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
	v, err := parseStringMap(b, false)
	if err != nil {
		return err
	}
	for name, value := range v {
		if err := checkHeader(name, value); err != nil {
			return err
		}
	}
	*h = v
	return nil
}

// parseStringMap decodes the JSON object b into a map; nil for null or an
// empty object. Values must be strings; when lenient, numbers and booleans
// are kept as written and null becomes "".
func parseStringMap(b []byte, lenient bool) (map[string]string, error) {
	want := "a string"
	if lenient {
		want = "a string, number or bool"
	}
	i := skipSpace(b, 0)
	if i < len(b) && b[i] == 'n' && isNull(b[i:skipSpaceBack(b)]) {
		return nil, nil
	}
	if i >= len(b) || b[i] != '{' {
		return nil, &valueError{msg: "must be a JSON object of strings, got " + jsonKind(b)}
	}
	var m map[string]string
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, nil
	}
	for {
		end, err := skipString(b, i)
		if err != nil {
			return nil, err
		}
		key, err := unquote(b[i:end])
		if err != nil {
			return nil, err
		}
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil, errSyntax
		}
		i = skipSpace(b, i+1)
		end, err = skipValue(b, i)
		if err != nil {
			return nil, err
		}
		raw := b[i:end]
		var val string
		switch c := raw[0]; {
		case c == '"':
			s, err := unquote(raw)
			if err != nil {
				return nil, err
			}
			val = string(s)
		case lenient && c == 'n':
			val = ""
		case lenient && c != '{' && c != '[':
			val = string(raw)
		default:
			return nil, &valueError{
				sub: "[" + strconv.Quote(string(key)) + "]",
				msg: "must be " + want + ", got " + jsonKind(raw),
			}
		}
		if m == nil {
			m = make(map[string]string)
		}
		m[string(key)] = val
		i = skipSpace(b, end)
		if i >= len(b) {
			return nil, errSyntax
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			if skipSpace(b, i+1) != len(b) {
				return nil, errSyntax
			}
			return m, nil
		default:
			return nil, errSyntax
		}
	}
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
func checkHeader(name, value string) error {
	msg := ""
	if name == "" {
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
	return &valueError{sub: "[" + strconv.Quote(name) + "]", msg: msg}
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
