package jsonscan

import (
	"slices"
	"testing"
)

func TestSkip(t *testing.T) {
	b := []byte(` {"a\"b": [1, {"c": "]}"}], "n": -1.5e3 , "t": true}`)
	if i := SkipSpace(b, 0); b[i] != '{' {
		t.Fatalf("SkipSpace stopped at %q", b[i])
	}
	if i := SkipString(b, 2); string(b[2:i]) != `"a\"b"` {
		t.Fatalf("SkipString took %q", b[2:i])
	}
	if i := SkipValue(b, 10); string(b[10:i]) != `[1, {"c": "]}"}]` {
		t.Fatalf("SkipValue took %q", b[10:i])
	}
	if i := SkipValue(b, 1); i != len(b) {
		t.Fatalf("SkipValue of the object ended at %d, want %d", i, len(b))
	}
	n := []byte(`-1.5e3 ,`)
	if i := SkipValue(n, 0); string(n[:i]) != "-1.5e3" {
		t.Fatalf("SkipValue of a number took %q", n[:i])
	}
	// never past the end, even on cut input
	for _, cut := range []string{`"abc`, `{"a": [1, 2`, `tru`, `"\`} {
		if i := SkipValue([]byte(cut), 0); i > len(cut) {
			t.Fatalf("SkipValue(%q) = %d, past the end", cut, i)
		}
	}
}

func TestStringAndValueEnd(t *testing.T) {
	for _, tc := range []struct {
		in   string
		end  int
		ok   bool
		what string
	}{
		{`"ab" x`, 4, true, "string"},
		{`"a\"b"`, 6, true, "escaped quote"},
		{`"a\\"x`, 5, true, "escaped backslash before the quote"},
		{`"a\\\"b"`, 8, true, "backslash, then an escaped quote"},
		{`"abc`, 0, false, "unterminated string"},
		{`{"a":[1,"]"]} `, 13, true, "object holding a bracket in a string"},
		{`[1,2`, 0, false, "unterminated array"},
		{`12.5,`, 4, true, "number"},
		{`true}`, 4, true, "literal"},
		{`,`, 0, false, "empty number"},
		{``, 0, false, "nothing"},
	} {
		end, ok := ValueEnd([]byte(tc.in), 0)
		if end != tc.end || ok != tc.ok {
			t.Errorf("%s: ValueEnd(%q) = %d, %v; want %d, %v", tc.what, tc.in, end, ok, tc.end, tc.ok)
		}
	}
	if _, ok := StringEnd([]byte(`x"`), 0); ok {
		t.Error("StringEnd accepted a token that is not a string")
	}
}

func TestEachMember(t *testing.T) {
	type m struct{ name, value string }
	walk := func(in string, stopAt string) ([]m, bool) {
		var got []m
		ok := EachMember([]byte(in), SkipSpace([]byte(in), 0), func(name, value []byte) bool {
			got = append(got, m{string(name), string(value)})
			return string(name) != stopAt
		})
		return got, ok
	}
	got, ok := walk(` { "a" : 1 , "b\"c":{"x":[1,2]}, "a":null } `, "")
	want := []m{{"a", "1"}, {`b\"c`, `{"x":[1,2]}`}, {"a", "null"}}
	if !ok || !slices.Equal(got, want) {
		t.Errorf("walk: %v, %v; want %v, true", got, ok, want)
	}
	if got, ok := walk(`{}`, ""); !ok || len(got) != 0 {
		t.Errorf("empty object: %v, %v", got, ok)
	}
	if got, ok := walk(`{"a":1,"b":2,"c":3}`, "b"); ok || len(got) != 2 {
		t.Errorf("stopped at b: %v, %v; want two members and false", got, ok)
	}
	for _, bad := range []string{`[1]`, `{"a" 1}`, `{"a":1,}`, `{"a":1`, `{"a":1 "b":2}`, `{a:1}`, `{"a":}`} {
		if _, ok := walk(bad, ""); ok {
			t.Errorf("EachMember accepted %q", bad)
		}
	}
}
