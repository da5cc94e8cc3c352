package batch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

// The readers of jsonscan.go must read what encoding/json reads: a line's
// validation code as the two decodes it replaced gave it, an input line as
// decoding it into inputLine does, a body's usage as decoding it into a
// struct of the usage does.
func FuzzJSONReaders(f *testing.F) {
	for _, s := range []string{
		`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m1","messages":[{"role":"user","content":"hi \"there\" {[,"}]}}`,
		`{"CUSTOM_ID":"a","Method":"POST","url":"/v1/chat/completions","body":{"Model":"m1"},"extra":[1,{"a":null},true,-1.5e3]}`,
		`{"custom_id":"a","custom_id":null,"method":"POST","url":"/v1/chat/completions","body":{"model":"m1","model":null}}`,
		`{"custom_id":"\u00e9\n","method":"POST","url":"/v1/chat/completions","body":{"model":"m\ud83d\ude00"}}`,
		"{\"custom_id\":\"a\xff\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m1\"}}",
		`{"custom_id":5,"method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}}`,
		`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":[1]}`,
		`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":7}}`,
		`{"custom_\u0069d":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m1"}}`,
		` { "custom_id" : "a" , "method" : "POST" , "url" : "/v1/chat/completions" , "body" : { "model" : "m1" } } `,
		`{"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5},"choices":[{"text":"usage"}]}`,
		`{"Usage":{"prompt_tokens":3},"usage":{"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}`,
		`{"usage":{"prompt_tokens":"3"}}`,
		`{"usage":null}`,
		`{"usage":{"prompt_tokens_details":null,"input_tokens_details":{},"completion_tokens_details":{"reasoning_tokens":null}}}`,
		`{"usage":{"prompt_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"other":2},"Output_Tokens_Details":{"REASONING_TOKENS":3}}}`,
		`{"usage":{"completion_tokens_details":{"reasoning_tokens":1},"completion_tokens_details":null},"usage":{"prompt_tokens":1},"usage":null}`,
		`{"usage":{"prompt_tokens":1},"usage":{"input_tokens_details":{"cached_tokens":2},"input_tokens_details":null}}`,
		`{"usage":{"total_tokens":1.5}}`,
		`{"usage":{"total_tokens":1e2}}`,
		`{"usage":{"total_tokens":-99999999999999999999}}`,
		`{"usage":{"completion_tokens_details":5}}`,
		`{"usage":{"output_tokens_details":{"reasoning_tokens":"1"}}}`,
		`{"usage":{"input_tokens":4,"Input_Tokens":null,"prompt_tokens":true}}`,
		`{"usage":{"prompt_tokens":3},"usage":{"completion_tokens":2},"usage":{"prompt_tokens_details":[]}}`,
		`{"usage":[1]}`,
		`["usage",{"usage":{}}]`,
		`"text"`,
		`{}`,
		`{"a":`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// validation
		const ep = "/v1/chat/completions"
		got := &checker{endpoint: ep, model: "m1", ids: map[string]struct{}{}, maxErrs: 10}
		got.check(1, b)
		want := &checker{endpoint: ep, model: "m1", ids: map[string]struct{}{}, maxErrs: 10}
		checkByDecoding(want, 1, b)
		if codes(got) != codes(want) || got.model != want.model || !reflect.DeepEqual(got.ids, want.ids) {
			t.Errorf("check(%q): %s %q %v, decoding gives %s %q %v", b, codes(got), got.model, got.ids, codes(want), want.model, want.ids)
		}
		// an input line
		var in inputLine
		decErr := json.Unmarshal(b, &in)
		l, err := parseInput(b)
		if (err == nil) != (decErr == nil) {
			t.Fatalf("parseInput(%q) error %v, decoding error %v", b, err, decErr)
		}
		if err == nil && (l.CustomID != in.CustomID || l.Method != in.Method || l.URL != in.URL || !bytes.Equal(l.Body, in.Body)) {
			t.Errorf("parseInput(%q) = %+v, decoding gives %+v", b, l, in)
		}
		// a body's usage
		if json.Valid(b) {
			var body struct {
				Usage *lineUsage `json:"usage"`
			}
			var want *lineUsage
			if json.Unmarshal(b, &body) == nil {
				want = body.Usage
			}
			if got := bodyUsageOf(b); !reflect.DeepEqual(got, want) {
				t.Errorf("bodyUsageOf(%q) = %+v, decoding gives %+v", b, got, want)
			}
		}
	})
}

func codes(c *checker) string {
	s := ""
	for _, e := range c.errs {
		s += fmt.Sprintf("%s/%s@%d ", e.Code, e.Param, e.Line)
	}
	return s
}

// checkByDecoding is validation as it was before jsonscan.go: the line
// decoded into inputLine, then its body into a struct of the model.
func checkByDecoding(c *checker, n int, b []byte) {
	c.lines++
	var l struct {
		CustomID string          `json:"custom_id"`
		Method   string          `json:"method"`
		URL      string          `json:"url"`
		Body     json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		c.fail(n, "invalid_json_line", "", err.Error())
		return
	}
	switch {
	case l.CustomID == "":
		c.fail(n, "missing_required_parameter", "custom_id", "")
		return
	case l.Method != "POST":
		c.fail(n, "invalid_method", "method", "")
		return
	case l.URL != c.endpoint:
		c.fail(n, "mismatched_endpoint", "url", "")
		return
	}
	var body struct {
		Model *string `json:"model"`
	}
	if len(l.Body) == 0 || l.Body[0] != '{' || json.Unmarshal(l.Body, &body) != nil {
		c.fail(n, "invalid_request", "body", "")
		return
	}
	if body.Model == nil || *body.Model == "" {
		c.fail(n, "missing_required_parameter", "body.model", "")
		return
	}
	if *body.Model != c.model {
		c.fail(n, "mismatched_model", "body.model", "")
		return
	}
	if _, dup := c.ids[l.CustomID]; dup {
		c.fail(n, "duplicate_custom_id", "custom_id", "")
		return
	}
	c.ids[l.CustomID] = struct{}{}
}
