// Package jsonscan checks JSON (Valid: json.Valid's answer in a quarter of
// its time, used by core/wire's scanners) and walks JSON by byte offset
// without allocating: the one scanner the hand-written readers share
// (core/wire's message and envelope scanners, core/dispatch's usage
// reader, the Batch API in front/batch, the simulator).
//
// Two kinds of helper: SkipSpace, SkipString and SkipValue walk JSON that
// Valid already accepted and never fail (every index they return is at
// most len(b), also on input that is not valid JSON, so a caller that
// skipped the check reads garbage but never out of bounds); StringEnd,
// ValueEnd and EachMember check the structure as they go and report
// input that does not hold what they walk, for readers of unchecked input.
package jsonscan

import "bytes"

// SkipSpace returns the index of the first non-space byte of b from i.
func SkipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// SkipString returns the index after the string token starting at b[i]
// (the opening quote).
func SkipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// SkipValue returns the index after the value starting at b[i].
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = SkipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	default: // a number, true, false or null
		for i < len(b) {
			switch b[i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return i
			}
			i++
		}
		return i
	}
}

// StringEnd returns the index just past the string token that starts at
// b[i] (its opening quote); ok is false when b[i] is not a quote or the
// string does not end. Escapes are skipped, not checked.
func StringEnd(b []byte, i int) (end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, false
	}
	for j := i + 1; ; j++ {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, false
		}
		j += k
		bs := 0 // backslashes right before the quote: an odd count escapes it
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			bs++
		}
		if bs%2 == 0 {
			return j + 1, true
		}
	}
}

// ValueEnd returns the index just past the value that starts at b[i]; ok
// is false when no value ends there (nothing at i, a string or container
// that does not close, an empty number or literal). It finds the end of a
// valid value; it does not validate one.
func ValueEnd(b []byte, i int) (end int, ok bool) {
	if i >= len(b) {
		return 0, false
	}
	switch b[i] {
	case '"':
		return StringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, ok := StringEnd(b, j)
				if !ok {
					return 0, false
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, true
				}
			}
		}
		return 0, false
	default: // a number, true, false or null
		j := i
		for j < len(b) {
			switch b[j] {
			case ',', '}', ']', ':', ' ', '\t', '\n', '\r':
				return j, j > i
			}
			j++
		}
		return j, true
	}
}

// EachMember calls fn with the name (between its quotes, escapes as
// written) and the raw value of each member of the JSON object that starts
// at b[i], in order. It returns false as soon as fn does, and when b[i]
// is not an object or the object is malformed before its end; true once
// fn took every member. Duplicates are passed as they come.
func EachMember(b []byte, i int, fn func(name, value []byte) bool) bool {
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return true
	}
	for {
		end, ok := StringEnd(b, i)
		if !ok {
			return false
		}
		name := b[i+1 : end-1]
		i = SkipSpace(b, end)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = SkipSpace(b, i+1)
		if end, ok = ValueEnd(b, i); !ok {
			return false
		}
		if !fn(name, b[i:end]) {
			return false
		}
		i = SkipSpace(b, end)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = SkipSpace(b, i+1)
		case '}':
			return true
		default:
			return false
		}
	}
}
