package wire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// scanMessage is decode's first try: one pass over a message in the shape
// producers write — a flat request or an envelope, member names spelled
// exactly as documented, each member at most once — without reflection and
// with a handful of allocations. For anything else (a name in other case, a
// repeated member, a value of an unexpected type, a request build refuses)
// it reports ok == false and decode takes the encoding/json path, which
// defines what is accepted. When it accepts, the result is the one that path
// gives (FuzzDecode checks it on every input).
//
// Valid JSON is checked first (jsonscan.Valid: json.Valid's answer, a
// quarter of its time), so the walk below only has to find where values
// end.
func scanMessage(b []byte) (req *Request, env, ok bool) {
	if !jsonscan.Valid(b) {
		return nil, false, false
	}
	var (
		top     flatWire
		data    *flatWire
		in      *internalWire
		kind    string
		hasKind bool
		seen    uint16
	)
	ok = jsonscan.EachMember(b, jsonscan.SkipSpace(b, 0), func(name, v []byte) bool {
		if f := flatField(name); f >= 0 {
			return once(&seen, f) && top.set(f, v)
		}
		switch string(name) {
		case "data":
			if !once(&seen, fieldData) {
				return false
			}
			switch v[0] {
			case 'n':
				data = nil
				return true
			case '{':
				data = new(flatWire)
				return data.scan(v)
			}
			return false
		case "request_kind":
			if !once(&seen, fieldKind) {
				return false
			}
			if v[0] == 'n' {
				kind, hasKind = "", false
				return true
			}
			s, ok := scanString(v)
			kind, hasKind = s, ok
			return ok
		case "internal":
			if !once(&seen, fieldInternal) {
				return false
			}
			switch v[0] {
			case 'n':
				in = nil
				return true
			case '{':
				in = new(internalWire)
				return in.scan(v)
			}
			return false
		}
		return !foldsTo(name, envelopeNames)
	})
	if !ok {
		return nil, false, false
	}
	env = data != nil && (hasKind || in != nil)
	src := &top
	if env {
		src = data
	} else {
		kind = ""
	}
	req, derr := build(src, env, kind, in)
	if derr != nil {
		return nil, false, false
	}
	return req, env, true
}

// Bits of the members scanMessage has seen; flat fields use their index.
const (
	fieldData = iota + len(flatNames)
	fieldKind
	fieldInternal
)

// flatNames are flatWire's member names, in field order.
var flatNames = [...]string{"id", "created", "deadline", "payload", "metadata", "headers", "endpoint", "request_queue_name", "result_queue_name", "model"}

// envelopeNames are every member name the top level of a message decodes.
var envelopeNames = append(flatNames[:len(flatNames):len(flatNames)], "data", "request_kind", "internal")

// internalNames are internalWire's member names.
var internalNames = []string{"retry_count", "request_token", "request_queue_name", "result_queue_name", "queue_id", "labels", "kept_result"}

// flatField returns the index of name in flatNames, or -1.
func flatField(name []byte) int {
	for i, n := range flatNames {
		if string(name) == n {
			return i
		}
	}
	return -1
}

// once marks bit f as seen and reports whether it was not seen before.
func once(seen *uint16, f int) bool {
	bit := uint16(1) << f
	if *seen&bit != 0 {
		return false
	}
	*seen |= bit
	return true
}

// foldsTo reports whether encoding/json could match name to one of names
// without it being an exact match: a case-folded match, or a name with
// bytes (escapes, non-ASCII) this scanner does not fold. Such names send the
// message down the encoding/json path.
func foldsTo(name []byte, names []string) bool {
	for _, c := range name {
		if c == '\\' || c >= utf8.RuneSelf {
			return true
		}
	}
	for _, n := range names {
		if strings.EqualFold(string(name), n) {
			return true
		}
	}
	return false
}

// scan fills f from the JSON object v (already known to be valid JSON).
func (f *flatWire) scan(v []byte) bool {
	var seen uint16
	return jsonscan.EachMember(v, 0, func(name, val []byte) bool {
		if i := flatField(name); i >= 0 {
			return once(&seen, i) && f.set(i, val)
		}
		return !foldsTo(name, flatNames[:])
	})
}

// set decodes v into the field flatNames[i] as encoding/json would, or
// reports false when that would be a type error.
func (f *flatWire) set(i int, v []byte) bool {
	switch i {
	case 0:
		return setString(&f.ID, v)
	case 1:
		return f.Created.UnmarshalJSON(v) == nil
	case 2:
		return f.Deadline.UnmarshalJSON(v) == nil
	case 3:
		f.Payload = bytes.Clone(v)
		return true
	case 4:
		return f.Metadata.UnmarshalJSON(v) == nil
	case 5:
		return f.Headers.UnmarshalJSON(v) == nil
	case 6:
		return setString(&f.Endpoint, v)
	case 7:
		return setString(&f.RequestQueueName, v)
	case 8:
		return setString(&f.ResultQueueName, v)
	case 9:
		if v[0] != '"' { // any other value is ignored, as looseString does
			return true
		}
		var m string
		ok := setString(&m, v)
		f.Model = looseString(m)
		return ok
	}
	return false
}

// scan fills in from the JSON object v (already known to be valid JSON).
func (in *internalWire) scan(v []byte) bool {
	var seen uint16
	return jsonscan.EachMember(v, 0, func(name, val []byte) bool {
		switch string(name) {
		case "retry_count":
			if !once(&seen, 0) {
				return false
			}
			if val[0] == 'n' {
				return true
			}
			n, err := strconv.ParseInt(string(val), 10, 0)
			in.RetryCount = int(n)
			return err == nil
		case "request_token":
			return once(&seen, 1) && setString(&in.RequestToken, val)
		case "request_queue_name":
			return once(&seen, 2) && setString(&in.RequestQueueName, val)
		case "result_queue_name":
			return once(&seen, 3) && setString(&in.ResultQueueName, val)
		case "queue_id":
			if !once(&seen, 4) {
				return false
			}
			if val[0] != '"' { // any other value is ignored, as looseString does
				return true
			}
			var id string
			ok := setString(&id, val)
			in.QueueID = looseString(id)
			return ok
		case "labels":
			// The encoding/json path's own decoder: it ignores what is not
			// an object and refuses what that path refuses.
			return once(&seen, 5) && in.Labels.UnmarshalJSON(val) == nil
		case "kept_result":
			if !once(&seen, 6) {
				return false
			}
			if val[0] == 'n' {
				in.KeptResult = nil
				return true
			}
			in.KeptResult = json.RawMessage(val)
			return true
		}
		return !foldsTo(name, internalNames)
	})
}

// setString stores the JSON string v in *dst; null leaves *dst as it is.
// Any other kind of value is a type error.
func setString(dst *string, v []byte) bool {
	if v[0] == 'n' {
		return true
	}
	s, ok := scanString(v)
	if ok {
		*dst = s
	}
	return ok
}

// scanString returns the contents of the JSON string v.
func scanString(v []byte) (string, bool) {
	if v[0] != '"' {
		return "", false
	}
	s, err := unquote(v)
	return string(s), err == nil
}
