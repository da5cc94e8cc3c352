package wire

import (
	"bytes"

	"github.com/sluice-io/sluice/internal/jsonscan"
)

// requestTokenName is the envelope member holding upstream's request token.
var requestTokenName = []byte(`"request_token"`)

// RequestToken returns the id (data.id) and upstream request token
// (internal.request_token) of an envelope that carries a token, and ""
// otherwise, without decoding the rest of the message: a transport that
// must clean upstream's per-request keys reads them with it at claim time,
// before the core decodes the message.
//
// For every message Decode accepts it answers what Decode's Request says
// (ID and Token, or "" when Token is empty). It does not validate what it
// does not read, so for a message Decode refuses it may still return the id
// and token it found. A message without the member name anywhere (a flat
// request) costs one byte search; one in an unusual shape (a member name in
// another case, a repeated member, a value of an unexpected type) is
// decoded in full.
func RequestToken(b []byte) (id, token string) {
	if !bytes.Contains(b, requestTokenName) {
		return "", ""
	}
	id, token, ok := scanToken(b)
	if ok {
		return id, token
	}
	r, err := Decode(b)
	if err != nil {
		return "", ""
	}
	return r.ID, r.Token
}

// scanToken is RequestToken's single pass over the shape producers write;
// ok is false when the message needs a full decode to tell.
func scanToken(b []byte) (id, token string, ok bool) {
	start := jsonscan.SkipSpace(b, 0)
	end, ok := jsonscan.ValueEnd(b, start)
	if !ok || jsonscan.SkipSpace(b, end) != len(b) {
		return "", "", false
	}
	var (
		data, internal []byte
		hasKind        bool
		seen           uint16
	)
	ok = jsonscan.EachMember(b, start, func(name, v []byte) bool {
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
				data = v
				return true
			}
			return false
		case "request_kind":
			if !once(&seen, fieldKind) {
				return false
			}
			if v[0] == 'n' {
				return true
			}
			hasKind = v[0] == '"'
			return hasKind
		case "internal":
			if !once(&seen, fieldInternal) {
				return false
			}
			switch v[0] {
			case 'n':
				internal = nil
				return true
			case '{':
				internal = v
				return true
			}
			return false
		}
		if f := flatField(name); f >= 0 {
			return once(&seen, f)
		}
		return !foldsTo(name, envelopeNames)
	})
	if !ok {
		return "", "", false
	}
	if data == nil || internal == nil {
		// Not an envelope, or one without internal: Decode's Token is "".
		return "", "", true
	}
	var inSeen uint16
	ok = jsonscan.EachMember(internal, 0, func(name, v []byte) bool {
		if string(name) == "request_token" {
			return once(&inSeen, 1) && setString(&token, v)
		}
		for i, n := range internalNames {
			if string(name) == n {
				return once(&inSeen, 2+i)
			}
		}
		return !foldsTo(name, internalNames)
	})
	if !ok {
		return "", "", false
	}
	if token == "" {
		return "", "", true
	}
	var dataSeen uint16
	ok = jsonscan.EachMember(data, 0, func(name, v []byte) bool {
		if f := flatField(name); f >= 0 {
			if !once(&dataSeen, f) {
				return false
			}
			return f != 0 || setString(&id, v)
		}
		return !foldsTo(name, flatNames[:])
	})
	if !ok || id == "" {
		return "", "", false
	}
	return id, token, true
}
