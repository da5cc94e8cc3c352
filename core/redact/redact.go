// Package redact keeps secrets out of what sluice writes: logs, errors,
// span attributes and status pages. It removes the password of every URL
// (redis://user:password@host, https://user:password@gateway) and the value
// of every credential header or field (Authorization, X-Api-Key, Cookie,
// anything named like a token, secret, password or key) written as a JSON
// member, a credential header line (Authorization: …) or a key=value pair.
//
// Redaction happens at the boundaries: the application's logger
// (NewHandler), the errors it returns (Error), and the places that put a
// URL into a span or a page (URL). Secrets known only as values (a password
// that is not in a URL) are the caller's to keep out.
package redact

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
)

// Mask replaces what is redacted.
const Mask = "xxxxx"

var (
	// userinfo with a password in a URL: scheme://user:password@
	urlPassword = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://[^\s/@:"'<>]*):[^\s/@"'<>]*@`)
	// credential names, as header names or field names
	credName = `(?:authorization|proxy-authorization|cookie|set-cookie|[A-Za-z0-9_\-]*(?:api[_\-]?key|token|secret|passw(?:or)?d|credential|auth[_\-]?key|private[_\-]?key)[A-Za-z0-9_\-]*)`
	// "name": "value" (JSON, possibly escaped once inside a JSON string)
	jsonMember = regexp.MustCompile(`(?i)((?:\\?")` + credName + `(?:\\?")\s*:\s*)(\\?")((?:[^"\\]|\\[^"])*)(\\?")`)
	// Name: value of a credential header (header lines, log text)
	headerLine = regexp.MustCompile(`(?i)(\b(?:authorization|proxy-authorization|x-api-key|api-key|x-auth-token|cookie|set-cookie)\s*:\s*)([^\s"',;&}\]]+(?: [^\s"',;&}\]]+)?)`)
	// name=value of any credential name (query strings, key=value text)
	pairMember = regexp.MustCompile(`(?i)(\b` + credName + `=)([^\s"',;&}\]]+)`)
)

// URL returns s with the password of its userinfo masked, for a URL (or any
// text holding URLs).
func URL(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	return urlPassword.ReplaceAllString(s, "$1:"+Mask+"@")
}

// Text returns s with URL passwords and credential values masked.
func Text(s string) string {
	s = URL(s)
	if jsonMember.MatchString(s) {
		s = jsonMember.ReplaceAllString(s, "${1}${2}"+Mask+"${4}")
	}
	if headerLine.MatchString(s) {
		s = headerLine.ReplaceAllString(s, "${1}"+Mask)
	}
	if pairMember.MatchString(s) {
		s = pairMember.ReplaceAllString(s, "${1}"+Mask)
	}
	return s
}

// Error returns err with its message passed through Text; errors.Is and
// errors.As still see err. nil stays nil, and an error with nothing to mask
// is returned as it is.
func Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := Text(msg); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// NewHandler wraps h so that the message and every attribute (strings,
// errors, anything formatted as text) pass through Text before h sees them.
func NewHandler(h slog.Handler) slog.Handler { return &handler{h: h} }

type handler struct{ h slog.Handler }

func (r *handler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r *handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, Text(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r *handler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = attr(a)
	}
	return &handler{h: r.h.WithAttrs(red)}
}

func (r *handler) WithGroup(name string) slog.Handler { return &handler{h: r.h.WithGroup(name)} }

// attr redacts one attribute: a credential-named key masks its value
// whatever it is; strings, errors and other values are masked as text.
func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindGroup:
		g := v.Group()
		red := make([]slog.Attr, len(g))
		for i, x := range g {
			red[i] = attr(x)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(red...)}
	case slog.KindString:
		if credKey.MatchString(a.Key) {
			return slog.String(a.Key, Mask)
		}
		return slog.String(a.Key, Text(v.String()))
	case slog.KindAny:
		if credKey.MatchString(a.Key) {
			return slog.String(a.Key, Mask)
		}
		if err, ok := v.Any().(error); ok {
			return slog.Any(a.Key, Error(err))
		}
		return slog.String(a.Key, Text(v.String()))
	}
	return slog.Attr{Key: a.Key, Value: v}
}

var credKey = regexp.MustCompile(`(?i)^` + credName + `$`)
