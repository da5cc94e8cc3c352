// Package resume lets a generation that sluice took back from the pool
// (core/pipeline's evictor) continue from the tokens it had made instead of
// starting again.
//
// Without it an eviction throws away the output of the aborted call: the
// pool spent seat-time on tokens nobody receives, and a long generation
// evicted twice may cost three times its length. With it (a queue's
// "resume": true, next to "evict": true):
//
//  1. a resumable request (see Start) is sent with "stream": true and
//     "stream_options": {"include_usage": true, "continuous_usage_stats":
//     true} (vLLM's per-chunk usage), and Call.Read assembles the stream into
//     the non-streamed answer the producer asked for;
//  2. when the call is aborted, Call.State is what it had made (the text
//     and its token count, with the answer's id, model and created), which
//     the pipeline stores in the request's label StateLabel before the
//     re-queue;
//  3. the next attempt continues: for /v1/completions the prompt becomes
//     the prompt plus the text made, for /v1/chat/completions the messages
//     end with an assistant message holding it, sent with vLLM's
//     "continue_final_message": true and "add_generation_prompt": false;
//     max_tokens (and max_completion_tokens) shrink by the tokens made;
//  4. the final answer is the text made before and after, with usage
//     counting the first call's prompt tokens and every completion token.
//
// A continuation is not token-for-token the generation an unbroken call
// would have made (sampling restarts at the boundary, and a stop string
// split across it is not seen), so resume is opt-in per queue. Requests it
// cannot continue faithfully are sent as they are and restarted when taken
// back: a prompt that is not one string, n or best_of above 1, echo,
// suffix, logprobs, tools or functions, a request that streams itself, a
// body that is not a JSON object.
//
// The package is the standard library only: core/pipeline calls it, and
// core/dispatch reads the stream through Call.Read.
package resume

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// StateLabel is the request label that carries a taken-back call's State
// to the next attempt.
const StateLabel = "sluice_resume"

// DefaultCompletionMaxTokens is /v1/completions' max_tokens when a request
// gives none (OpenAI's default).
const DefaultCompletionMaxTokens = 16

// State is what the calls of one request made so far.
type State struct {
	// Text is the generated text so far.
	Text string `json:"text"`
	// Tokens is how many completion tokens made Text.
	Tokens int `json:"tokens"`
	// PromptTokens is the first call's prompt token count (0: unknown).
	PromptTokens int `json:"prompt_tokens,omitempty"`
	// ID, Model and Created are the first call's answer's.
	ID      string `json:"id,omitempty"`
	Model   string `json:"model,omitempty"`
	Created int64  `json:"created,omitempty"`
}

// Encode is s as a label value.
func (s State) Encode() string {
	b, _ := json.Marshal(s) // a struct of strings and ints: cannot fail
	return string(b)
}

// Decode reads a label value Encode wrote; "" is the zero State.
func Decode(v string) (State, error) {
	var s State
	if v == "" {
		return s, nil
	}
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		return State{}, fmt.Errorf("resume: label %s: %w", StateLabel, err)
	}
	if s.Tokens < 0 || s.PromptTokens < 0 {
		return State{}, fmt.Errorf("resume: label %s: negative token count", StateLabel)
	}
	return s, nil
}

// Call is one attempt of a resumable request.
type Call struct {
	chat      bool
	body      []byte
	remaining int // completion tokens still allowed (when the request bounds them)
	prior     State

	// what this attempt made
	text      strings.Builder
	tokens    int
	usageSeen bool // tokens come from the stream's usage, not a chunk count
	prompt    int
	id, model string
	created   int64
	finish    string
}

// Start prepares the attempt of payload (the request's JSON body)
// continuing from prior (the zero State: the first attempt). ok is false
// when the request is not resumable: it is then sent as it is.
func Start(payload []byte, prior State) (c *Call, ok bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(payload, &m) != nil || m == nil {
		return nil, false
	}
	for _, k := range []string{"echo", "suffix", "logprobs", "top_logprobs", "tools", "functions", "tool_choice", "function_call"} {
		if v, has := m[k]; has && !isNullOrFalse(v) {
			return nil, false
		}
	}
	for _, k := range []string{"n", "best_of"} {
		if v, has := m[k]; has && !isNullOrOne(v) {
			return nil, false
		}
	}
	if v, has := m["stream"]; has && !isNullOrFalse(v) {
		return nil, false
	}
	c = &Call{prior: prior}
	_, c.chat = m["messages"]
	if c.chat {
		var msgs []json.RawMessage
		if json.Unmarshal(m["messages"], &msgs) != nil || len(msgs) == 0 {
			return nil, false
		}
		if prior.Tokens > 0 {
			last, _ := json.Marshal(map[string]string{"role": "assistant", "content": prior.Text})
			msgs = append(msgs, last)
			m["messages"], _ = json.Marshal(msgs)
			m["continue_final_message"] = json.RawMessage("true")
			m["add_generation_prompt"] = json.RawMessage("false")
		}
	} else {
		var prompt string
		if json.Unmarshal(m["prompt"], &prompt) != nil {
			return nil, false // absent, an array, or token ids
		}
		if prior.Tokens > 0 {
			m["prompt"], _ = json.Marshal(prompt + prior.Text)
		}
	}
	limitKeys := []string{"max_tokens", "max_completion_tokens"}
	limited := false
	for _, k := range limitKeys {
		v, has := m[k]
		if !has || string(v) == "null" {
			continue
		}
		var n int
		if json.Unmarshal(v, &n) != nil || n < 1 {
			return nil, false // the server's own error is the answer
		}
		left := n - prior.Tokens
		if !limited || left < c.remaining {
			c.remaining = left
		}
		limited = true
		if left > 0 {
			m[k], _ = json.Marshal(left)
		}
	}
	if !limited && !c.chat {
		c.remaining, limited = DefaultCompletionMaxTokens-prior.Tokens, true
		if c.remaining > 0 && prior.Tokens > 0 {
			m["max_tokens"], _ = json.Marshal(c.remaining)
		}
	}
	if limited && c.remaining <= 0 {
		return c, true // nothing left to make: Finished answers
	}
	m["stream"] = json.RawMessage("true")
	m["stream_options"] = json.RawMessage(`{"include_usage":true,"continuous_usage_stats":true}`)
	b, err := json.Marshal(m)
	if err != nil {
		return nil, false
	}
	c.body = b
	return c, true
}

// Prior is the State the call continues from.
func (c *Call) Prior() State { return c.prior }

// Body is the body to send.
func (c *Call) Body() []byte { return c.body }

// Finished returns the answer when the earlier attempts made every token
// the request allows (no call is needed), or ok false.
func (c *Call) Finished() (answer []byte, ok bool) {
	if c.body != nil {
		return nil, false
	}
	c.finish = "length"
	return c.assemble(), true
}

// State is what the calls of the request made so far, this one included
// up to now: to store in StateLabel when the call is taken back.
func (c *Call) State() State {
	s := c.prior
	s.Text += c.text.String()
	s.Tokens += c.tokens
	if s.PromptTokens == 0 {
		s.PromptTokens = c.prompt
	}
	if s.ID == "" {
		s.ID, s.Model, s.Created = c.id, c.model, c.created
	}
	return s
}

// chunk is the part of a streamed event Read uses.
type chunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Created int64  `json:"created"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
		Delta        struct {
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// ErrStream is wrapped by Read's errors about the stream's content.
var ErrStream = errors.New("resume: bad answer stream")

// Read reads a successful answer to the call's Body and returns the
// non-streamed answer. A JSON answer (a server that does not stream) is
// returned as it is. Read returns r's error when the stream breaks (the
// call taken back, for one); State then holds what came before.
func (c *Call) Read(r io.Reader) ([]byte, error) {
	br := bufio.NewReaderSize(r, 4096)
	first, err := br.Peek(1)
	if err == nil && first[0] == '{' {
		return io.ReadAll(br)
	}
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// a long event: gather it whole
			long := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if len(line) > 0 {
			done, perr := c.event(bytes.TrimRight(line, "\r\n"))
			if perr != nil {
				return nil, perr
			}
			if done {
				return c.assemble(), nil
			}
		}
		if err == io.EOF {
			if c.finish != "" || c.usageSeen {
				return c.assemble(), nil // a server that ends without [DONE]
			}
			return nil, fmt.Errorf("%w: it ended before its last event", ErrStream)
		}
		if err != nil {
			return nil, err
		}
	}
}

// event handles one line of the stream; done at "data: [DONE]".
func (c *Call) event(line []byte) (done bool, err error) {
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return false, nil // a comment, an event name, a blank line
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		return true, nil
	}
	var ch chunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return false, fmt.Errorf("%w: %v", ErrStream, err)
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		return false, fmt.Errorf("%w: the server sent an error event: %s", ErrStream, ch.Error)
	}
	if c.id == "" {
		c.id, c.model, c.created = ch.ID, ch.Model, ch.Created
	}
	counted := false
	for _, x := range ch.Choices {
		if x.Index != 0 {
			continue
		}
		t := x.Delta.Content
		if !c.chat {
			t = x.Text
		}
		if t != nil && *t != "" {
			c.text.WriteString(*t)
			counted = true
		}
		if x.FinishReason != nil && *x.FinishReason != "" {
			c.finish = *x.FinishReason
		}
	}
	if ch.Usage != nil {
		c.prompt = ch.Usage.PromptTokens
		c.tokens, c.usageSeen = ch.Usage.CompletionTokens, true
	} else if counted && !c.usageSeen {
		c.tokens++ // one token per content chunk, without usage
	}
	return false, nil
}

// assemble is the non-streamed answer of every attempt so far.
func (c *Call) assemble() []byte {
	s := c.State()
	finish := c.finish
	if finish == "" {
		finish = "stop"
	}
	text, _ := json.Marshal(s.Text)
	var b bytes.Buffer
	id, _ := json.Marshal(s.ID)
	model, _ := json.Marshal(s.Model)
	reason, _ := json.Marshal(finish)
	if c.chat {
		fmt.Fprintf(&b, `{"id":%s,"object":"chat.completion","created":%d,"model":%s,"choices":[{"index":0,"message":{"role":"assistant","content":%s},"logprobs":null,"finish_reason":%s}],`,
			id, s.Created, model, text, reason)
	} else {
		fmt.Fprintf(&b, `{"id":%s,"object":"text_completion","created":%d,"model":%s,"choices":[{"index":0,"text":%s,"logprobs":null,"finish_reason":%s}],`,
			id, s.Created, model, text, reason)
	}
	fmt.Fprintf(&b, `"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, s.PromptTokens, s.Tokens, s.PromptTokens+s.Tokens)
	return b.Bytes()
}

func isNullOrFalse(v json.RawMessage) bool {
	s := string(bytes.TrimSpace(v))
	return s == "null" || s == "false"
}

func isNullOrOne(v json.RawMessage) bool {
	s := string(bytes.TrimSpace(v))
	return s == "null" || s == "1"
}
