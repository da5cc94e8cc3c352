package redact

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://:pw@host:6379/0", "redis://:xxxxx@host:6379/0"},
		{"rediss://user:p%40ss@host/1", "rediss://user:xxxxx@host/1"},
		{`dial redis://u:pw@h:1: refused; also https://a:b@gw/x`, `dial redis://u:xxxxx@h:1: refused; also https://a:xxxxx@gw/x`},
		{"redis://host:6379/0", "redis://host:6379/0"},
		{"redis://user@host/0", "redis://user@host/0"},
		{"mail me at a@b.c", "mail me at a@b.c"},
		{`{"headers":{"Authorization":"Bearer abc","X-Api-Key":"k1","Accept":"json"}}`, `{"headers":{"Authorization":"xxxxx","X-Api-Key":"xxxxx","Accept":"json"}}`},
		{`"{\"authorization\":\"Bearer abc\"}"`, `"{\"authorization\":\"xxxxx\"}"`},
		{`{"max_tokens":100,"refresh_token":"r1"}`, `{"max_tokens":100,"refresh_token":"xxxxx"}`},
		{"Authorization: Bearer abc def", "Authorization: xxxxx def"},
		{"GET /x?api_key=k1&q=2", "GET /x?api_key=xxxxx&q=2"},
		{"queue secret-requests: WRONGPASS invalid password", "queue secret-requests: WRONGPASS invalid password"},
		{"plain text", "plain text"},
	} {
		if got := Text(tc.in); got != tc.want {
			t.Errorf("Text(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestError(t *testing.T) {
	if Error(nil) != nil {
		t.Error("nil error redacted to non-nil")
	}
	plain := errors.New("plain")
	if Error(plain) != plain {
		t.Error("an error with nothing to mask was wrapped")
	}
	err := Error(errors.Join(fs.ErrNotExist, errors.New("redis://u:pw@h/0")))
	if strings.Contains(err.Error(), "pw@") || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Error = %q (Is ErrNotExist: %v)", err, errors.Is(err, fs.ErrNotExist))
	}
}

func TestHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	log = log.With("url", "redis://:pw1@h/0")
	log.Debug("connecting to redis://:pw2@h/0", "err", errors.New("dial redis://:pw3@h/0"), "password", "pw4",
		slog.Group("g", "payload", `{"Authorization":"pw5"}`), "n", 3)
	out := buf.String()
	for _, s := range []string{"pw1", "pw2", "pw3", "pw4", "pw5"} {
		if strings.Contains(out, s) {
			t.Errorf("%s leaked: %s", s, out)
		}
	}
	if !strings.Contains(out, "n=3") || !strings.Contains(out, "xxxxx") {
		t.Errorf("unexpected output: %s", out)
	}
}
