package wire

import (
	"errors"
	"strconv"
	"time"
)

// maxUnixSeconds is 9999-12-31T23:59:59Z, the latest time a request may carry.
// It bounds the parser and keeps every accepted time representable as RFC 3339.
const maxUnixSeconds = 253402300799

// unixTime is a Unix time in seconds as producers write it: a JSON number
// (integer, fractional or with an exponent) or, for v0.6 producers, a JSON
// string holding such a number. Digits past the nanosecond are truncated.
//
// Like encoding/json does for scalars, null leaves the value unchanged.
type unixTime struct {
	set  bool  // a number was decoded
	neg  bool  // the number was negative (and not zero)
	sec  int64 // whole seconds of the magnitude
	nsec int64 // nanoseconds of the magnitude, in [0, 1e9)
}

var (
	errNotNumber  = errors.New("is not a number")
	errOutOfRange = errors.New("is out of range (after year 9999)")
)

// UnmarshalJSON implements json.Unmarshaler.
func (u *unixTime) UnmarshalJSON(b []byte) error {
	if len(b) == 0 {
		return errors.New("must be a number of Unix seconds, got nothing")
	}
	switch c := b[0]; {
	case c == 'n' && string(b) == "null":
		return nil
	case c == '"':
		s, err := unquote(b)
		if err != nil {
			return err
		}
		v, err := parseUnixSeconds(s)
		if err != nil {
			return errors.New(snippet(b) + " " + err.Error())
		}
		*u = v
		return nil
	case c == '-' || ('0' <= c && c <= '9'):
		v, err := parseUnixSeconds(b)
		if err != nil {
			return errors.New(snippet(b) + " " + err.Error())
		}
		*u = v
		return nil
	default:
		return errors.New("must be a number of Unix seconds, got " + jsonKind(b))
	}
}

// time returns the decoded time; the zero time when nothing was decoded or
// the value was zero. Callers check neg first.
func (u unixTime) time() time.Time {
	if !u.set || (u.sec == 0 && u.nsec == 0) {
		return time.Time{}
	}
	return time.Unix(u.sec, u.nsec)
}

// positive reports whether the value is greater than zero.
func (u unixTime) positive() bool { return u.set && !u.neg && (u.sec > 0 || u.nsec > 0) }

// parseUnixSeconds parses s, which must follow the JSON number grammar, into
// whole seconds and nanoseconds without going through float64, so that
// 1700000000.123 keeps its millisecond exactly.
func parseUnixSeconds(s []byte) (unixTime, error) {
	i, n := 0, len(s)
	var u unixTime
	if i < n && s[i] == '-' {
		u.neg = true
		i++
	}
	intStart := i
	switch {
	case i < n && s[i] == '0':
		i++
	case i < n && '1' <= s[i] && s[i] <= '9':
		for i < n && isDigit(s[i]) {
			i++
		}
	default:
		return unixTime{}, errNotNumber
	}
	intPart := s[intStart:i]
	var frac []byte
	if i < n && s[i] == '.' {
		i++
		start := i
		for i < n && isDigit(s[i]) {
			i++
		}
		if i == start {
			return unixTime{}, errNotNumber
		}
		frac = s[start:i]
	}
	exp := 0
	if i < n && (s[i] == 'e' || s[i] == 'E') {
		i++
		expNeg := false
		if i < n && (s[i] == '+' || s[i] == '-') {
			expNeg = s[i] == '-'
			i++
		}
		start := i
		for i < n && isDigit(s[i]) {
			if exp < 1_000_000 { // saturate: anything this large is out of range or zero anyway
				exp = exp*10 + int(s[i]-'0')
			}
			i++
		}
		if i == start {
			return unixTime{}, errNotNumber
		}
		if expNeg {
			exp = -exp
		}
	}
	if i != n {
		return unixTime{}, errNotNumber
	}

	// The value is 0.d1d2d3... × 10^point over the digits of intPart and frac.
	digits := len(intPart) + len(frac)
	digit := func(k int) int64 {
		if k < 0 || k >= digits {
			return 0
		}
		if k < len(intPart) {
			return int64(intPart[k] - '0')
		}
		return int64(frac[k-len(intPart)] - '0')
	}
	first := 0
	for first < digits && digit(first) == 0 {
		first++
	}
	u.set = true
	if first == digits { // zero, whatever the sign and exponent
		u.neg = false
		return u, nil
	}
	point := len(intPart) + exp // position of the decimal point in the digit string
	if point-first > 12 {       // at least 10^12 seconds
		return unixTime{}, errOutOfRange
	}
	for k := first; k < point; k++ {
		u.sec = u.sec*10 + digit(k)
	}
	for k := point; k < point+9; k++ {
		u.nsec = u.nsec*10 + digit(k)
	}
	if u.sec > maxUnixSeconds {
		return unixTime{}, errOutOfRange
	}
	if u.sec == 0 && u.nsec == 0 { // below a nanosecond
		u.neg = false
	}
	return u, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// appendUnixTime appends t as Unix seconds rounded to the millisecond: an
// integer when whole, a fraction with at most three digits otherwise.
// t must not be before the Unix epoch.
func appendUnixTime(b []byte, t time.Time) []byte {
	sec, ms := unixMillis(t)
	b = strconv.AppendInt(b, sec, 10)
	if ms == 0 {
		return b
	}
	b = append(b, '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10))
	for b[len(b)-1] == '0' {
		b = b[:len(b)-1]
	}
	return b
}

// unixMillis splits t, rounded to the nearest millisecond, into Unix seconds
// and milliseconds.
func unixMillis(t time.Time) (sec, ms int64) {
	sec, ms = t.Unix(), int64((t.Nanosecond()+500_000)/1_000_000)
	if ms == 1000 {
		sec, ms = sec+1, 0
	}
	return sec, ms
}
