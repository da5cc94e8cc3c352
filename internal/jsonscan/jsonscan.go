// Package jsonscan checks JSON (Valid: json.Valid's answer in a quarter of
// its time, used by core/wire's scanners) and walks JSON that Valid
// already accepted, by byte offset and without allocating: the few
// helpers the hand-written readers of the simulator (internal/simulator)
// and the Batch API (front/batch) share. Every index returned is at most len(b), also on input that is
// not valid JSON, so a caller that skipped the validity check reads
// garbage but never out of bounds. (core/wire's envelope scanner checks
// its input as it goes and keeps its own, error-returning variants.)
package jsonscan

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
