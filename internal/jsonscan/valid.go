package jsonscan

// maxDepth is encoding/json's nesting limit: Valid refuses what nests
// deeper, as json.Valid does.
const maxDepth = 10000

// Valid reports whether b is one JSON value with nothing but white space
// around it, exactly as encoding/json's Valid does (strings are not checked
// for UTF-8, nesting deeper than 10,000 is refused; FuzzValid compares
// them), in one pass without a state machine's call per byte: most of a
// request's bytes are inside strings, which a tight loop skips.
func Valid(b []byte) bool {
	var small [4]uint64 // one bit per open container: 1 object, 0 array
	stack := small[:]
	depth := 0
	i := SkipSpace(b, 0)
	for {
		// A value starts at b[i].
		if i >= len(b) {
			return false
		}
		ended := true // the value ends at i (false: a container opened)
		switch c := b[i]; c {
		case '{', '[':
			if depth == maxDepth {
				return false
			}
			if depth/64 == len(stack) {
				stack = append(stack, 0)
			}
			bit := uint64(1) << (depth % 64)
			if c == '{' {
				stack[depth/64] |= bit
			} else {
				stack[depth/64] &^= bit
			}
			depth++
			i = SkipSpace(b, i+1)
			if i < len(b) && (c == '{' && b[i] == '}' || c == '[' && b[i] == ']') {
				i++
				depth--
				break
			}
			if c == '{' {
				var ok bool
				if i, ok = validKey(b, i); !ok {
					return false
				}
			}
			ended = false
		case '"':
			var ok bool
			if i, ok = validString(b, i); !ok {
				return false
			}
		case 't':
			if !hasLiteral(b, i, "true") {
				return false
			}
			i += 4
		case 'f':
			if !hasLiteral(b, i, "false") {
				return false
			}
			i += 5
		case 'n':
			if !hasLiteral(b, i, "null") {
				return false
			}
			i += 4
		default:
			var ok bool
			if i, ok = validNumber(b, i); !ok {
				return false
			}
		}
		if !ended {
			continue
		}
		// After a value: a comma and the next one, or the containers it
		// closes, or the end.
		for {
			i = SkipSpace(b, i)
			if depth == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			object := stack[(depth-1)/64]&(uint64(1)<<((depth-1)%64)) != 0
			if b[i] == ',' {
				i = SkipSpace(b, i+1)
				if object {
					var ok bool
					if i, ok = validKey(b, i); !ok {
						return false
					}
				}
				break
			}
			if object && b[i] == '}' || !object && b[i] == ']' {
				i++
				depth--
				continue
			}
			return false
		}
	}
}

// validKey checks a member's name and colon at b[i] and returns the index
// of its value (white space skipped).
func validKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := validString(b, i)
	if !ok {
		return i, false
	}
	i = SkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return SkipSpace(b, i+1), true
}

// validString checks the string token at b[i] (the opening quote) and
// returns the index after it.
func validString(b []byte, i int) (int, bool) {
	for i++; i < len(b); i++ {
		c := b[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		switch c {
		case '"':
			return i + 1, true
		case '\\':
			i++
			if i >= len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return i, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return i, false
					}
				}
				i += 4
			default:
				return i, false
			}
		default: // a control character
			return i, false
		}
	}
	return i, false
}

// validNumber checks the number at b[i] (JSON's grammar: -?(0|[1-9]d*)
// (.d+)?([eE][+-]?d+)?) and returns the index after it.
func validNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func hasLiteral(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
