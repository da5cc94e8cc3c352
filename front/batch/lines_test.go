package batch

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/sluice-io/sluice/core/wire"
)

// Every validation error code comes from the one decode of a line, as it
// did from the two decodes (line, then body) it replaced.
func TestCheckLineCodes(t *testing.T) {
	const ep = "/v1/chat/completions"
	tests := []struct {
		line, code, param string
	}{
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}}`, "", ""},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}`, "invalid_json_line", ""},
		{`[1,2]`, "invalid_json_line", ""},
		{`{"custom_id":5,"method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}}`, "invalid_json_line", ""},
		{`{"method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}}`, "missing_required_parameter", "custom_id"},
		{`{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{"model":"m1"}}`, "invalid_method", "method"},
		{`{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"model":"m1"}}`, "mismatched_endpoint", "url"},
		{`{"custom_id":"a","method":"post","url":"/v1/chat/completions","body":{"model":"m1"}}`, "invalid_method", "method"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completionz","body":{"model":"m1"}}`, "mismatched_endpoint", "url"},
		{`{"custom_id":"a","method":"PO\u0053T","url":"\/v1\/chat\/completions","body":{"model":"m1"}}`, "", ""},
		{`{"custom_id":"a","method":"POST","method":null,"url":"/v1/chat/completions","body":{"model":"m1"}}`, "", ""},
		{`{"custom_id":"a","method":"POST","url":7,"body":{"model":"m1"}}`, "invalid_json_line", ""},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions"}`, "invalid_request", "body"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":null}`, "invalid_request", "body"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":[{"model":"m1"}]}`, "invalid_request", "body"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":"m1"}`, "invalid_request", "body"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":7}}`, "invalid_request", "body"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}`, "missing_required_parameter", "body.model"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":""}}`, "missing_required_parameter", "body.model"},
		{`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m2"}}`, "mismatched_model", "body.model"},
	}
	for _, tt := range tests {
		c := &checker{endpoint: ep, model: "m1", ids: map[string]struct{}{}, maxErrs: 10}
		c.check(3, []byte(tt.line))
		switch {
		case tt.code == "" && len(c.errs) > 0:
			t.Errorf("%s: error %+v, want none", tt.line, c.errs[0])
		case tt.code != "" && len(c.errs) != 1:
			t.Errorf("%s: %d errors, want %s", tt.line, len(c.errs), tt.code)
		case tt.code != "" && (c.errs[0].Code != tt.code || c.errs[0].Param != tt.param || c.errs[0].Line != 3):
			t.Errorf("%s: error %+v, want code %s param %q on line 3", tt.line, c.errs[0], tt.code, tt.param)
		}
	}
	c := &checker{endpoint: ep, ids: map[string]struct{}{}, maxErrs: 10}
	c.check(1, []byte(tests[0].line))
	c.check(2, []byte(tests[0].line))
	if len(c.errs) != 1 || c.errs[0].Code != "duplicate_custom_id" || c.model != "m1" || c.lines != 2 {
		t.Errorf("a repeated custom_id: errors %+v, model %q, lines %d", c.errs, c.model, c.lines)
	}
}

// recordOf writes its line by hand: it must be the JSON json.Marshal of an
// outputLine would be (same values, one line), and its usage that of the
// body, as Usage.add reads it from the line.
func TestRecordOfMatchesMarshal(t *testing.T) {
	usage := `"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}`
	tests := []struct {
		name string
		r    wire.Result
	}{
		{"ok", wire.Result{ID: "b-1", StatusCode: 200, Payload: `{"id":"x","choices":[],` + usage + `}`}},
		{"ok, spaced over lines", wire.Result{ID: "b-2", StatusCode: 200, Payload: "{\n  \"a\": \"<b>&\",\r\n  " + usage + "\n}\n"}},
		{"not JSON", wire.Result{ID: "b-3", StatusCode: 502, Payload: "bad gateway\n<html>", ErrorCode: wire.CodeInferenceError, ErrorMessage: "upstream \"said\" no"}},
		{"empty body", wire.Result{ID: "b-4", StatusCode: 204}},
		{"JSON, not an object", wire.Result{ID: "b-5", StatusCode: 200, Payload: `["a",1]`}},
		{"usage of the wrong type", wire.Result{ID: "b-6", StatusCode: 200, Payload: `{"usage":{"prompt_tokens":"3"}}`}},
		{"no response", wire.Result{ID: "b-7", ErrorCode: wire.CodeDeadlineExceeded}},
		{"unicode and controls", wire.Result{ID: "b-8\u2028", StatusCode: 400, Payload: "{\"e\":\"\u00e9\\u0001\"}", ErrorCode: wire.CodeInvalidRequest, ErrorMessage: "tab\there \xff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			custom := "cid-\"" + tt.name + "\"<&>"
			rec, lu := recordOf(7, custom, &tt.r)
			want := oldRecordLine(custom, &tt.r)
			var got, exp any
			if err := json.Unmarshal(rec.Line, &got); err != nil {
				t.Fatalf("line %s: %v", rec.Line, err)
			}
			_ = json.Unmarshal(want, &exp)
			if !reflect.DeepEqual(got, exp) {
				t.Errorf("line\n got %s\nwant %s", rec.Line, want)
			}
			if bytes.ContainsAny(rec.Line, "\r\n") {
				t.Errorf("line spans lines: %q", rec.Line)
			}
			if rec.Index != 7 || rec.OK != tt.r.OK() {
				t.Errorf("record index %d ok %v", rec.Index, rec.OK)
			}
			var fromLine, fromBody Usage
			fromLine.add(want)
			fromBody.addUsage(lu)
			if fromLine != fromBody {
				t.Errorf("usage from the body %+v, from the line %+v", fromBody, fromLine)
			}
		})
	}
}

// oldRecordLine is the line as json.Marshal of an outputLine writes it.
func oldRecordLine(customID string, r *wire.Result) []byte {
	l := outputLine{ID: "batch_req_" + r.ID, CustomID: customID}
	if r.StatusCode != 0 {
		body := json.RawMessage(r.Payload)
		if !json.Valid(body) {
			body, _ = json.Marshal(r.Payload)
		}
		l.Response = &outputResponse{StatusCode: r.StatusCode, RequestID: r.ID, Body: body}
	}
	if r.ErrorCode != wire.CodeNone {
		msg := r.ErrorMessage
		if msg == "" {
			msg = string(r.ErrorCode)
		}
		l.Error = &outputError{Code: errorCode(r.ErrorCode), Message: msg}
	}
	b, _ := json.Marshal(l)
	return b
}
