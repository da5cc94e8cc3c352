package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/jsonscan"
)

// inputLine is one line of an input file.
type inputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// parseInput reads the members of an input line that enqueueing needs,
// as decoding it into inputLine would (the body is a copy); the line was
// validated when the batch was created, so an error means the file
// changed since.
func parseInput(b []byte) (inputLine, error) {
	var l inputLine
	if !jsonscan.Valid(b) {
		return l, errors.New("input line is not JSON")
	}
	bad := false
	ok := eachMember(b, func(name, v []byte) {
		var dst *string
		switch {
		case nameIs(name, "custom_id"):
			dst = &l.CustomID
		case nameIs(name, "method"):
			dst = &l.Method
		case nameIs(name, "url"):
			dst = &l.URL
		case nameIs(name, "body"):
			l.Body = append(json.RawMessage(nil), v...)
			return
		default:
			return
		}
		if string(v) == "null" {
			return
		}
		s, isString := stringValue(v)
		bad = bad || !isString
		*dst = s
	})
	if !ok || bad {
		return l, errors.New("input line is not an object of string members and a body")
	}
	return l, nil
}

// maxLineBytes bounds one input line (the whole file is bounded by
// Config.MaxFileBytes).
const maxLineBytes = 64 << 20

// eachLine calls fn for every non-blank line of r with its 1-based number.
func eachLine(r io.Reader, fn func(n int, line []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("line %d: %w", n+1, err)
	}
	return nil
}

// checker validates the lines of one input file against a batch's endpoint.
type checker struct {
	endpoint string
	model    string
	ids      map[string]struct{}
	errs     []LineError
	lines    int
	maxErrs  int
}

func (c *checker) fail(line int, code, param, msg string) {
	if len(c.errs) < c.maxErrs {
		c.errs = append(c.errs, LineError{Code: code, Message: msg, Param: param, Line: line})
	}
}

// check validates one line (number n): checkLine, then accept. A valid
// line's custom_id and body (a slice of b) come back with ok.
func (c *checker) check(n int, b []byte) (customID string, body []byte, ok bool) {
	return c.accept(checkLine(c.endpoint, n, b))
}

// lineCheck is what checkLine found on one line: what the line says alone.
type lineCheck struct {
	n        int    // the line's number
	customID string // when valid
	model    string // when valid
	body     []byte // a slice of the line, when valid
	err      LineError
}

// checkLine checks what one line (number n, b) says by itself against the
// batch's endpoint; the checks against the lines before it (one model,
// custom_id unique) are accept's. It reads the line once, by byte offset
// (jsonscan.go), with the outcome decoding it into inputLine and its body
// into a struct of the model would have. It keeps no state, so the lines
// of a file are checked in parallel (validateLines).
func checkLine(endpoint string, n int, b []byte) lineCheck {
	fail := func(code, param, msg string) lineCheck {
		return lineCheck{n: n, err: LineError{Code: code, Message: msg, Param: param, Line: n}}
	}
	if !jsonscan.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v) // for the syntax error's message
		return fail("invalid_json_line", "", "This line is not parseable as valid JSON: "+err.Error())
	}
	var l struct {
		CustomID    string
		Method, URL []byte // raw string tokens, quotes included; nil when absent or null
		Body        []byte // the raw value; nil when absent or null
	}
	badType := ""
	isObject := eachMember(b, func(name, v []byte) {
		switch {
		case nameIs(name, "custom_id"):
			if string(v) == "null" {
				return // null leaves a string as it was
			}
			str, ok := stringValue(v)
			if !ok && badType == "" {
				badType = string(name)
			}
			l.CustomID = str
		case nameIs(name, "method"), nameIs(name, "url"):
			// Kept raw: compared with what they must be without
			// allocating (stringIs), decoded only for an error message.
			if string(v) == "null" {
				return
			}
			if (len(v) < 2 || v[0] != '"') && badType == "" {
				badType = string(name)
			}
			if nameIs(name, "method") {
				l.Method = v
			} else {
				l.URL = v
			}
		case nameIs(name, "body"):
			l.Body = v
			if string(v) == "null" {
				l.Body = nil
			}
		}
	})
	switch {
	case !isObject:
		return fail("invalid_json_line", "", "This line is not parseable as valid JSON: it is not a JSON object.")
	case badType != "":
		return fail("invalid_json_line", "", "This line is not parseable as valid JSON: "+badType+" is not a string.")
	}
	var model *string
	if len(l.Body) > 0 && l.Body[0] == '{' {
		eachMember(l.Body, func(name, v []byte) {
			if !nameIs(name, "model") {
				return
			}
			if string(v) == "null" {
				model = nil
				return
			}
			str, ok := stringValue(v)
			if !ok {
				l.Body = nil // a model that is not a string: not a request body
				return
			}
			model = &str
		})
	} else {
		l.Body = nil
	}
	switch {
	case l.CustomID == "":
		return fail("missing_required_parameter", "custom_id", "custom_id is missing or empty.")
	case !stringIs(l.Method, "POST"):
		method, _ := stringValue(l.Method)
		return fail("invalid_method", "method", fmt.Sprintf("method %q: only POST is supported.", method))
	case !stringIs(l.URL, endpoint):
		url, _ := stringValue(l.URL)
		return fail("mismatched_endpoint", "url", fmt.Sprintf("The url %q does not match the batch's endpoint %q.", url, endpoint))
	case l.Body == nil:
		return fail("invalid_request", "body", "body must be a JSON object.")
	case model == nil || *model == "":
		return fail("missing_required_parameter", "body.model", "body.model is missing or empty.")
	}
	return lineCheck{n: n, customID: l.CustomID, model: *model, body: l.Body}
}

// accept takes the next line's check in file order: it counts the line,
// records its error, or checks it against the lines before it (the file's
// model is the first valid line's; a custom_id must not repeat an earlier
// valid line's). A valid line's custom_id and body come back with ok.
func (c *checker) accept(lc lineCheck) (customID string, body []byte, ok bool) {
	c.lines++
	if lc.err.Code != "" {
		c.fail(lc.n, lc.err.Code, lc.err.Param, lc.err.Message)
		return "", nil, false
	}
	if c.model == "" {
		c.model = lc.model
	} else if lc.model != c.model {
		c.fail(lc.n, "mismatched_model", "body.model", fmt.Sprintf("The model %q differs from the file's model %q: one model per file.", lc.model, c.model))
		return "", nil, false
	}
	if _, dup := c.ids[lc.customID]; dup {
		c.fail(lc.n, "duplicate_custom_id", "custom_id", fmt.Sprintf("The custom_id %q appears on an earlier line.", lc.customID))
		return "", nil, false
	}
	c.ids[lc.customID] = struct{}{}
	return lc.customID, lc.body, true
}

// requestID is the queue request id of line index i of job.
func requestID(job string, i int) string { return job + "-" + strconv.Itoa(i) }

// lineIndex reads the line index back from a request id of job.
func lineIndex(job, id string) (int, bool) {
	if len(id) <= len(job)+1 || id[:len(job)] != job || id[len(job)] != '-' {
		return 0, false
	}
	i, err := strconv.Atoi(id[len(job)+1:])
	return i, err == nil && i >= 0
}

// outputLine is a line of an output or error file (OpenAI's batch output).
type outputLine struct {
	ID       string          `json:"id"`
	CustomID string          `json:"custom_id"`
	Response *outputResponse `json:"response"`
	Error    *outputError    `json:"error"`
}

type outputResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type outputError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// errorCode is the output file's error code of a sluice result code.
func errorCode(c wire.ErrorCode) string {
	switch c {
	case wire.CodeDeadlineExceeded:
		return "batch_expired"
	case wire.CodeCancelled:
		return "batch_cancelled"
	}
	b := []byte(string(c))
	for i, ch := range b {
		if 'A' <= ch && ch <= 'Z' {
			b[i] = ch + 'a' - 'A'
		}
	}
	return string(b)
}

// recordOf turns a result of job into its record; customID is the line's.
// It also returns the usage of the response body (nil when it has none),
// read by byte offset once the body is known to be JSON: the line is
// written by hand around the body as it came (trimmed, compacted only
// when it spans lines), so the body is checked once, not once to check
// it, once to embed it and once more for the usage when the output files
// are written.
// The line holds what json.Marshal of an outputLine would, in the same
// key order.
func recordOf(index int, customID string, r *wire.Result) (Record, *lineUsage) {
	// Room for the fixed parts (about 110 bytes, an error object 24 more)
	// and the variable ones, so the line is built in one allocation (the
	// estimate was a few bytes short of a 200 line, which then doubled).
	b := make([]byte, 0, 160+2*len(r.ID)+len(customID)+len(r.Payload)+len(r.ErrorMessage)+len(r.ErrorCode))
	b = append(b, `{"id":`...)
	b = appendJSONString(b, "batch_req_"+r.ID)
	b = append(b, `,"custom_id":`...)
	b = appendJSONString(b, customID)
	var usage *lineUsage
	b = append(b, `,"response":`...)
	if r.StatusCode != 0 {
		b = append(b, `{"status_code":`...)
		b = strconv.AppendInt(b, int64(r.StatusCode), 10)
		b = append(b, `,"request_id":`...)
		b = appendJSONString(b, r.ID)
		b = append(b, `,"body":`...)
		body := trimSpace([]byte(r.Payload))
		switch {
		case len(body) == 0 || !jsonscan.Valid(body):
			b = appendJSONString(b, r.Payload) // not JSON: the body as a string
		case bytes.ContainsAny(body, "\r\n"):
			var c bytes.Buffer
			_ = json.Compact(&c, body) // valid: cannot fail
			b = append(b, c.Bytes()...)
			usage = bodyUsageOf(body)
		default:
			b = append(b, body...)
			usage = bodyUsageOf(body)
		}
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"error":`...)
	if r.ErrorCode != wire.CodeNone {
		msg := r.ErrorMessage
		if msg == "" {
			msg = string(r.ErrorCode)
		}
		b = append(b, `{"code":`...)
		b = appendJSONString(b, errorCode(r.ErrorCode))
		b = append(b, `,"message":`...)
		b = appendJSONString(b, msg)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	b = append(b, '}')
	return Record{Index: index, OK: r.OK(), Line: b}, usage
}

// appendJSONString appends s as a JSON string, as json.Marshal writes it
// (HTML-sensitive characters, U+2028 and U+2029 escaped, invalid UTF-8 as
// U+FFFD); plain ASCII, the usual case, is copied as it is.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string: cannot fail
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// missingRecord is the error record of a line that got no result before
// the batch ended (code batch_expired or batch_cancelled).
func missingRecord(job string, index int, customID, code, msg string) Record {
	b, _ := json.Marshal(outputLine{ID: "batch_req_" + requestID(job, index), CustomID: customID, Error: &outputError{Code: code, Message: msg}})
	return Record{Index: index, Line: b}
}
