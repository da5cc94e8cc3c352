package batch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// The parallel validation of a file must find what checking its lines one
// after the other finds: the same errors in the same order (the limit of
// 100 included), the same model, the same valid lines; the checks against
// earlier lines (a repeated custom_id, another model) also across the
// chunks the workers take.
func TestValidateLinesMatchesInOrder(t *testing.T) {
	const ep = "/v1/chat/completions"
	line := func(id, model string) string {
		return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":%q,"body":{"model":%q,"messages":[]}}`, id, ep, model)
	}
	var file bytes.Buffer
	for i := range 5 * checkChunkLines {
		switch {
		case i%997 == 5:
			file.WriteString(line("req-3", "m1")) // a repeat of line 4, chunks later
		case i%1201 == 7:
			file.WriteString(line(fmt.Sprintf("other-%d", i), "m2")) // another model
		case i%1499 == 9:
			file.WriteString(`{"custom_id":"x","method":"GET"}`)
		case i%1601 == 11:
			file.WriteString(`{"custom_id":`) // not JSON
		case i%701 == 13:
			file.WriteString("   ") // blank: not a line
		default:
			file.WriteString(line(fmt.Sprintf("req-%d", i), "m1"))
		}
		file.WriteByte('\n')
	}
	for _, maxErrs := range []int{100, 3} {
		want := &checker{endpoint: ep, ids: map[string]struct{}{}, maxErrs: maxErrs}
		var wantOK []string
		if err := eachLine(bytes.NewReader(file.Bytes()), func(n int, b []byte) error {
			if id, body, ok := want.check(n, b); ok {
				wantOK = append(wantOK, id+" "+string(body))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		got := &checker{endpoint: ep, ids: map[string]struct{}{}, maxErrs: maxErrs}
		var gotOK []string
		if err := validateLines(context.Background(), bytes.NewReader(file.Bytes()), ep, 1<<20, func(lc lineCheck) {
			if id, body, ok := got.accept(lc); ok {
				gotOK = append(gotOK, id+" "+string(body))
			}
		}); err != nil {
			t.Fatal(err)
		}
		if len(want.errs) < 3 || !strings.Contains(codes(want), "duplicate_custom_id") || !strings.Contains(codes(want), "mismatched_model") {
			t.Fatalf("the file exercises too little: %s", codes(want))
		}
		if codes(got) != codes(want) || !reflect.DeepEqual(got.errs, want.errs) {
			t.Errorf("maxErrs %d: errors\n got %s\nwant %s", maxErrs, codes(got), codes(want))
		}
		if got.lines != want.lines || got.model != want.model || !reflect.DeepEqual(gotOK, wantOK) {
			t.Errorf("maxErrs %d: %d lines model %q %d valid, want %d lines model %q %d valid",
				maxErrs, got.lines, got.model, len(gotOK), want.lines, want.model, len(wantOK))
		}
	}
	// The line past the limit stops it, after the lines before it.
	n := 0
	err := validateLines(context.Background(), bytes.NewReader(file.Bytes()), ep, checkChunkLines+3, func(lineCheck) { n++ })
	if !errors.Is(err, errTooManyLines) || n != checkChunkLines+3 {
		t.Errorf("a limit of %d lines: %d lines accepted, error %v", checkChunkLines+3, n, err)
	}
}

// BenchmarkValidate50k is validation's pass over a 50,000-line file (the
// bench's batch-api input), as validate makes it.
func BenchmarkValidate50k(b *testing.B) {
	const ep = "/v1/chat/completions"
	var file bytes.Buffer
	for i := range 50000 {
		fmt.Fprintf(&file, `{"custom_id":"req-%d","method":"POST","url":%q,"body":{"model":"m1","messages":[{"role":"user","content":"hello %d"}],"max_tokens":8}}`+"\n", i, ep, i)
	}
	b.SetBytes(int64(file.Len()))
	for b.Loop() {
		c := &checker{endpoint: ep, ids: map[string]struct{}{}, maxErrs: 100}
		if err := validateLines(context.Background(), bytes.NewReader(file.Bytes()), ep, 50000, func(lc lineCheck) { c.accept(lc) }); err != nil || len(c.errs) > 0 || c.lines != 50000 {
			b.Fatal(err, c.errs)
		}
	}
}
