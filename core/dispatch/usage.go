package dispatch

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/sluice-io/sluice/internal/jsonscan"
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
	// The walk stops at the first usage member, which it reached only
	// through well-formed members; no usage (or a malformed object before
	// one) leaves raw nil.
	var raw []byte
	jsonscan.EachMember(body, jsonscan.SkipSpace(body, 0), func(key, val []byte) bool {
		if string(key) == "usage" {
			raw = val
		}
		return raw == nil
	})
	if raw == nil {
		return 0, 0, false
	}
	// The usage object's two counts, read as encoding/json would read them
	// into *float64 (the last of a repeated member wins, null is absent, any
	// other non-number refuses the object), without its reflection: this
	// runs on every answer.
	var prompt, completion float64
	var seen, bad bool
	if !jsonscan.EachMember(raw, 0, func(key, val []byte) bool {
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
