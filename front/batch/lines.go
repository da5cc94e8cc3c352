package batch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/sluice-io/sluice/core/wire"
)

// inputLine is one line of an input file.
type inputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
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

// check validates one line (number n) and returns it decoded when it is valid.
func (c *checker) check(n int, b []byte) (inputLine, bool) {
	c.lines++
	var l inputLine
	if err := json.Unmarshal(b, &l); err != nil {
		c.fail(n, "invalid_json_line", "", "This line is not parseable as valid JSON: "+err.Error())
		return l, false
	}
	switch {
	case l.CustomID == "":
		c.fail(n, "missing_required_parameter", "custom_id", "custom_id is missing or empty.")
		return l, false
	case l.Method != "POST":
		c.fail(n, "invalid_method", "method", fmt.Sprintf("method %q: only POST is supported.", l.Method))
		return l, false
	case l.URL != c.endpoint:
		c.fail(n, "mismatched_endpoint", "url", fmt.Sprintf("The url %q does not match the batch's endpoint %q.", l.URL, c.endpoint))
		return l, false
	}
	var body struct {
		Model *string `json:"model"`
	}
	if len(l.Body) == 0 || l.Body[0] != '{' || json.Unmarshal(l.Body, &body) != nil {
		c.fail(n, "invalid_request", "body", "body must be a JSON object.")
		return l, false
	}
	if body.Model == nil || *body.Model == "" {
		c.fail(n, "missing_required_parameter", "body.model", "body.model is missing or empty.")
		return l, false
	}
	if c.model == "" {
		c.model = *body.Model
	} else if *body.Model != c.model {
		c.fail(n, "mismatched_model", "body.model", fmt.Sprintf("The model %q differs from the file's model %q: one model per file.", *body.Model, c.model))
		return l, false
	}
	if _, dup := c.ids[l.CustomID]; dup {
		c.fail(n, "duplicate_custom_id", "custom_id", fmt.Sprintf("The custom_id %q appears on an earlier line.", l.CustomID))
		return l, false
	}
	c.ids[l.CustomID] = struct{}{}
	return l, true
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
func recordOf(index int, customID string, r *wire.Result) Record {
	ok := r.OK()
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
	b, _ := json.Marshal(l) // cannot fail: strings and valid raw JSON
	return Record{Index: index, OK: ok, Line: b}
}

// missingRecord is the error record of a line that got no result before
// the batch ended (code batch_expired or batch_cancelled).
func missingRecord(job string, index int, customID, code, msg string) Record {
	b, _ := json.Marshal(outputLine{ID: "batch_req_" + requestID(job, index), CustomID: customID, Error: &outputError{Code: code, Message: msg}})
	return Record{Index: index, Line: b}
}
