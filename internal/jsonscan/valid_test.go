package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

var validCases = []string{
	``, ` `, `{}`, `[]`, ` {} `, `{`, `}`, `[`, `]`, `{]`, `[}`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{"a":}`,
	`{a:1}`, `{"a":1 "b":2}`, `[1,2,3]`, `[1,,2]`, `[,1]`, `[1,]`, `"x"`, `"x`, `"\u00e9"`, `"\u00g9"`, `"\u00e"`,
	`"\x"`, `"a\"b"`, `"\\"`, `"\/"`, "\"\t\"", "\"\x1f\"", "\"\x7f\"", "\"\xff\xfe\"", `0`, `-0`, `01`, `-`, `1.`,
	`1.5`, `.5`, `1e`, `1e5`, `1E+5`, `1e-5`, `-1.5e10`, `1.5e`, `+1`, `true`, `tru`, `truex`, `false`, `null`,
	`nul`, `nulll`, `[true,false,null]`, `{"a":{"b":[{"c":"d"}]}}`, `{"a":1}{}`, `1 2`, "\n\t\r {} \n", "\v{}",
	`{"data":{"id":"x","deadline":1.5},"internal":{"request_token":"t"}}`, `[[[[]]]]`, `[[[[]]]`, `{"":""}`,
	`{"a":[1,{"b":null}],"c":"\ud83d\ude00"}`, `"` + strings.Repeat("a", 1000) + `"`,
}

func TestValidMatchesEncodingJSON(t *testing.T) {
	for _, c := range validCases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%q) = %v, json.Valid says %v", c, got, want)
		}
	}
}

func TestValidDepth(t *testing.T) {
	for _, n := range []int{63, 64, 65, 255, 256, 257, 9999, 10000, 10001, 20000} {
		for _, open := range []string{"[", `{"a":`} {
			close := "]"
			if open != "[" {
				close = "}"
			}
			b := []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
			if got, want := Valid(b), json.Valid(b); got != want {
				t.Errorf("%d levels of %s: Valid %v, json.Valid %v", n, open, got, want)
			}
		}
	}
	// objects and arrays mixed, across the 64-level words of the stack
	var sb strings.Builder
	for i := range 300 {
		if i%3 == 0 {
			sb.WriteString(`{"k":`)
		} else {
			sb.WriteString("[")
		}
	}
	sb.WriteString("0")
	for i := 299; i >= 0; i-- {
		if i%3 == 0 {
			sb.WriteString("}")
		} else {
			sb.WriteString("]")
		}
	}
	if b := []byte(sb.String()); !Valid(b) || !json.Valid(b) {
		t.Errorf("mixed nesting: Valid %v, json.Valid %v", Valid(b), json.Valid(b))
	}
}

func FuzzValid(f *testing.F) {
	for _, c := range validCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid says %v", b, got, want)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	msg := []byte(`{"data":{"id":"req-000001","deadline":1796285273.5,"payload":{"model":"m","prompt":"` +
		strings.Repeat("lorem ipsum dolor sit amet ", 30) + `","max_tokens":16}},"internal":{"request_token":"0123456789abcdef","enqueue_seq":12}}`)
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			if !Valid(msg) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(msg)))
		for b.Loop() {
			if !json.Valid(msg) {
				b.Fatal("invalid")
			}
		}
	})
}
