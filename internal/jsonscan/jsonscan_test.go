package jsonscan

import "testing"

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
