package dispatch

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// ParseUsage reads the OpenAI usage object of a response body: the
// top-level "usage" member's prompt_tokens (in) and completion_tokens
// (out), negative counts read as 0. ok is false when the body is not a JSON
// object (a streamed answer included), has no usage object, or the object
// holds neither count; then nothing is to be counted (upstream's
// async_tokens_total). Only the top level is decoded: the members before
// usage are skipped by a byte scan, without allocating.
func ParseUsage(body []byte) (in, out int64, ok bool) {
	if !bytes.Contains(body, []byte(`"usage"`)) {
		return 0, 0, false // the common answer without usage: one fast search
	}
	var raw []byte
	if !eachMember(body, func(key, val []byte) bool {
		if string(key) == "usage" {
			raw = val
		}
		return raw == nil
	}) || raw == nil {
		return 0, 0, false
	}
	// The usage object's two counts, read as encoding/json would read them
	// into *float64 (the last of a repeated member wins, null is absent, any
	// other non-number refuses the object), without its reflection: this
	// runs on every answer.
	var prompt, completion float64
	var seen, bad bool
	if !eachMember(raw, func(key, val []byte) bool {
		var dst *float64
		switch {
		case keyIs(key, "prompt_tokens"):
			dst = &prompt
		case keyIs(key, "completion_tokens"):
			dst = &completion
		default:
			return true
		}
		if string(val) == "null" {
			*dst = 0
			return true
		}
		f, err := strconv.ParseFloat(string(val), 64)
		if err != nil || !isJSONNumber(val) {
			bad = true
			return false
		}
		*dst, seen = f, true
		return true
	}) || bad || !seen {
		return 0, 0, false
	}
	count := func(f float64) int64 {
		if !(f > 0) {
			return 0
		}
		return int64(math.Min(f, math.MaxInt64/2))
	}
	return count(prompt), count(completion), true
}

// keyIs reports whether the raw member key (without its quotes) names
// field name as encoding/json matches struct fields: escapes decoded, case
// folded.
func keyIs(key []byte, name string) bool {
	if bytes.IndexByte(key, '\\') >= 0 {
		var k string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
			return false
		}
		return strings.EqualFold(k, name)
	}
	return bytes.EqualFold(key, []byte(name))
}

// isJSONNumber reports whether b is a number as JSON writes it (what
// strconv accepts besides, such as "Inf", "0x1p3" or "1_0", is not).
func isJSONNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	digits := func() int {
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// eachMember calls fn with each member (its key, unescaped only in that it
// has no quotes, and its raw value) of the JSON object b, in order, until
// fn returns false. It returns false when b is not an object or is
// malformed before fn stopped.
func eachMember(b []byte, fn func(key, val []byte) bool) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return false
		}
		end := skipString(b, i)
		if end < 0 {
			return false
		}
		key := b[i+1 : end-1]
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		vend := skipValue(b, i)
		if vend < 0 {
			return false
		}
		if !fn(key, b[i:vend]) {
			return true
		}
		i = skipSpace(b, vend)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			return true
		}
		if b[i] != ',' {
			return false
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] == '"',
// or -1 when it does not end.
func skipString(b []byte, i int) int {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		bs := 0 // backslashes right before the quote: an odd count escapes it
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return j + 1
		}
		j++
	}
}

// skipValue returns the index after the value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				k := skipString(b, j)
				if k < 0 {
					return -1
				}
				j = k - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default: // number, true, false, null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && b[j] != '\r' {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}
