package dispatch

import (
	"net/http"
	"strings"
)

// Header names sluice sets or reads, in canonical form.
const (
	headerContentType   = "Content-Type"
	headerObjective     = "X-Gateway-Inference-Objective"
	headerRetryAfter    = "Retry-After"
	headerDroppedReason = "X-Llm-D-Request-Dropped-Reason"
	contentTypeJSON     = "application/json"
)

// refusedHeader reports whether a message may not set the header with this
// canonical name: hop-by-hop and framing headers, proxy credentials, the
// content type (the body's own: application/json, or the one a transform
// gave DoWith with its body; upstream lets a message override it, sluice
// does not, so that a message cannot mislabel the body) and the content
// coding (the result must carry the body as the gateway wrote it).
func refusedHeader(canonical string) bool {
	switch canonical {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Te",
		"Trailer", "Upgrade", "Content-Length", "Host", "Expect",
		"Proxy-Authorization", "Proxy-Authenticate",
		"Content-Type", "Accept-Encoding":
		return true
	}
	return false
}

// FilterHeaders splits a message's headers into those Do forwards (keys in
// canonical form) and the names it refuses: hop-by-hop and framing headers
// (Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding, TE, Trailer,
// Upgrade, Content-Length, Host, Expect), Proxy-Authorization and
// Proxy-Authenticate, Content-Type and Accept-Encoding, the client's deadline
// and timeout headers (the client sets those), and any name or value that is
// not valid in HTTP. Do applies the same rule without allocating; use this to
// validate or log a message's headers.
func (c *Client) FilterHeaders(in map[string]string) (kept http.Header, refused []string) {
	kept = make(http.Header, len(in))
	for k, v := range in {
		ck, ok := c.allowHeader(k, v)
		if !ok {
			refused = append(refused, k)
			continue
		}
		kept[ck] = append(kept[ck], v)
	}
	return kept, refused
}

// allowHeader returns the canonical name of a message header and whether
// the message may set it.
func (c *Client) allowHeader(k, v string) (string, bool) {
	if !validToken(k) || !validValue(v) {
		return "", false
	}
	ck := c.canonical(k)
	if refusedHeader(ck) || ck == c.deadlineHeader || ck == c.timeoutHeader {
		return "", false
	}
	return ck, true
}

// canonical is http.CanonicalHeaderKey with a cache, so that the lower-case
// names producers usually write are converted without allocating.
func (c *Client) canonical(k string) string {
	if ck, ok := c.names.Load(k); ok {
		return ck
	}
	ck := http.CanonicalHeaderKey(k)
	if ck == k {
		return ck // already canonical: converting it does not allocate
	}
	// The name may be the message's own string: keep a copy, not the message.
	return c.names.Store(strings.Clone(k), ck)
}

// validToken reports whether s is an RFC 9110 token (a valid header name).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}

// validValue reports whether s is a valid header value: no control bytes
// other than horizontal tab (so no CR/LF injection), no DEL.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
