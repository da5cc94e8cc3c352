package dispatch

import (
	"bytes"
	"encoding/json"
	"math"
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
	raw := topLevelMember(body, "usage")
	if raw == nil {
		return 0, 0, false
	}
	var u struct {
		Prompt     *float64 `json:"prompt_tokens"`
		Completion *float64 `json:"completion_tokens"`
	}
	if json.Unmarshal(raw, &u) != nil || (u.Prompt == nil && u.Completion == nil) {
		return 0, 0, false
	}
	count := func(f *float64) int64 {
		if f == nil || !(*f > 0) {
			return 0
		}
		return int64(math.Min(*f, math.MaxInt64/2))
	}
	return count(u.Prompt), count(u.Completion), true
}

// topLevelMember returns the raw value of member name of the JSON object
// b, nil when b is not an object or has no such member (or is malformed
// before it).
func topLevelMember(b []byte, name string) []byte {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil
	}
	i++
	for {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return nil
		}
		end := skipString(b, i)
		if end < 0 {
			return nil
		}
		key := b[i+1 : end-1]
		i = skipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return nil
		}
		i = skipSpace(b, i+1)
		vend := skipValue(b, i)
		if vend < 0 {
			return nil
		}
		if bytes.Equal(key, []byte(name)) {
			return b[i:vend]
		}
		i = skipSpace(b, vend)
		if i >= len(b) || b[i] != ',' {
			return nil
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
