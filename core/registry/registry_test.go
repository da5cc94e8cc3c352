package registry

import (
	"strings"
	"testing"
)

type factory func() string

func TestRegister(t *testing.T) {
	hello := factory(func() string { return "hello" })
	tests := []struct {
		name    string
		entry   string
		f       factory
		wantErr string
	}{
		{"ok", "b", hello, ""},
		{"empty name", "", hello, "register widget: empty name"},
		{"nil factory", "c", nil, `register widget "c": nil factory`},
		{"duplicate", "a", hello, `register widget "a": already registered`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New[factory]("widget")
			if err := r.Register("a", hello); err != nil {
				t.Fatal(err)
			}
			err := r.Register(tc.entry, tc.f)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Register: %v", err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("Register: %v, want %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && !r.Has(tc.entry) {
				t.Errorf("Has(%q) = false after Register", tc.entry)
			}
			if got := len(r.Names()); got != 1+btoi(tc.wantErr == "") {
				t.Errorf("%d names after Register, a failed Register must leave the registry as it was", got)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestLookupAndNames(t *testing.T) {
	r := New[factory]("widget")
	for _, n := range []string{"zeta", "alpha", "mid"} {
		if err := r.Register(n, func() string { return n }); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(r.Names(), ","); got != "alpha,mid,zeta" {
		t.Errorf("Names = %s, want sorted", got)
	}
	f, err := r.Lookup("mid")
	if err != nil || f() != "mid" {
		t.Fatalf("Lookup(mid) = %v, %v", f, err)
	}
	if _, err := r.Lookup("nope"); err == nil || err.Error() != `unknown widget "nope" (known: alpha, mid, zeta)` {
		t.Errorf("Lookup(nope) = %v", err)
	}
	if r.Has("nope") || !r.Has("alpha") {
		t.Error("Has disagrees with Register")
	}
	if r.Namespace() != "widget" {
		t.Errorf("Namespace = %q", r.Namespace())
	}
}

// An interface-typed registry rejects a nil interface value too.
func TestNilInterfaceFactory(t *testing.T) {
	r := New[interface{ Build() }]("thing")
	if err := r.Register("x", nil); err == nil {
		t.Fatal("nil interface registered")
	}
}

func TestConcurrentUse(t *testing.T) {
	r := New[factory]("widget")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			_ = r.Names()
			_, _ = r.Lookup("w")
		}
	}()
	for i := range 100 {
		_ = r.Register(string(rune('a'+i%26))+strings.Repeat("x", i), func() string { return "" })
	}
	<-done
}
