package resume

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

func body(t *testing.T, c *Call) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(c.Body(), &m); err != nil {
		t.Fatalf("body %s: %v", c.Body(), err)
	}
	return m
}

func TestStartFirstAttemptStreams(t *testing.T) {
	c, ok := Start([]byte(`{"model":"m","prompt":"Hello","max_tokens":8,"temperature":0}`), State{})
	if !ok {
		t.Fatal("a plain completion is resumable")
	}
	m := body(t, c)
	if m["stream"] != true || m["prompt"] != "Hello" || m["max_tokens"] != 8.0 || m["temperature"] != 0.0 {
		t.Fatalf("first attempt body %v", m)
	}
	so, _ := m["stream_options"].(map[string]any)
	if so["include_usage"] != true || so["continuous_usage_stats"] != true {
		t.Fatalf("stream_options %v", so)
	}
}

func TestStartContinuesCompletion(t *testing.T) {
	c, ok := Start([]byte(`{"prompt":"Hello","max_tokens":8}`), State{Text: " world,", Tokens: 3, PromptTokens: 2})
	if !ok {
		t.Fatal("not resumable")
	}
	m := body(t, c)
	if m["prompt"] != "Hello world," || m["max_tokens"] != 5.0 {
		t.Fatalf("continuation %v: want the text made appended and 5 tokens left", m)
	}
	// no limit given: OpenAI's default of 16 bounds a completion
	c, _ = Start([]byte(`{"prompt":"Hi"}`), State{Text: "x", Tokens: 4})
	if m := body(t, c); m["max_tokens"] != 12.0 {
		t.Fatalf("default limit: %v", m)
	}
}

func TestStartContinuesChat(t *testing.T) {
	in := `{"messages":[{"role":"user","content":"Hi"}],"max_completion_tokens":10,"max_tokens":20}`
	c, ok := Start([]byte(in), State{Text: "Hel", Tokens: 2})
	if !ok {
		t.Fatal("not resumable")
	}
	m := body(t, c)
	msgs := m["messages"].([]any)
	last := msgs[len(msgs)-1].(map[string]any)
	if len(msgs) != 2 || last["role"] != "assistant" || last["content"] != "Hel" {
		t.Fatalf("messages %v", msgs)
	}
	if m["continue_final_message"] != true || m["add_generation_prompt"] != false {
		t.Fatalf("vLLM's continuation flags missing: %v", m)
	}
	if m["max_completion_tokens"] != 8.0 || m["max_tokens"] != 18.0 {
		t.Fatalf("limits %v %v", m["max_completion_tokens"], m["max_tokens"])
	}
	// a first attempt adds no message
	c, _ = Start([]byte(in), State{})
	if m := body(t, c); len(m["messages"].([]any)) != 1 || m["continue_final_message"] != nil {
		t.Fatalf("first chat attempt %v", m)
	}
}

func TestNotResumable(t *testing.T) {
	for _, in := range []string{
		`not json`, `[1,2]`, `{"prompt":[1,2,3]}`, `{"prompt":["a","b"]}`, `{"max_tokens":3}`,
		`{"prompt":"a","n":2}`, `{"prompt":"a","best_of":3}`, `{"prompt":"a","echo":true}`,
		`{"prompt":"a","logprobs":2}`, `{"prompt":"a","suffix":"z"}`, `{"prompt":"a","stream":true}`,
		`{"messages":[{"role":"user","content":"a"}],"tools":[{"type":"function"}]}`,
		`{"messages":[]}`, `{"prompt":"a","max_tokens":0}`,
	} {
		if _, ok := Start([]byte(in), State{}); ok {
			t.Errorf("%s: resumable, want sent as it is", in)
		}
	}
	for _, in := range []string{`{"prompt":"a","n":1,"echo":false,"logprobs":null,"stream":false}`} {
		if _, ok := Start([]byte(in), State{}); !ok {
			t.Errorf("%s: not resumable", in)
		}
	}
}

func TestFinishedWhenNothingLeft(t *testing.T) {
	c, ok := Start([]byte(`{"prompt":"a","max_tokens":4}`), State{Text: "bcde", Tokens: 4, PromptTokens: 1, ID: "cmpl-1", Model: "m", Created: 7})
	if !ok {
		t.Fatal("not resumable")
	}
	b, done := c.Finished()
	if !done {
		t.Fatal("4 of 4 tokens made: want finished without a call")
	}
	want := `{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"bcde","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}`
	if string(b) != want {
		t.Fatalf("answer\n%s\nwant\n%s", b, want)
	}
	c, _ = Start([]byte(`{"prompt":"a","max_tokens":4}`), State{Tokens: 1})
	if _, done := c.Finished(); done {
		t.Fatal("3 tokens left: not finished")
	}
}

const completionStream = `data: {"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":" a","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}

data: {"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":" b","finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}

: keep-alive

data: {"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":" c","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}

data: {"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}

data: [DONE]

`

func TestReadAssemblesCompletion(t *testing.T) {
	c, _ := Start([]byte(`{"prompt":"x y z","max_tokens":3}`), State{})
	b, err := c.Read(strings.NewReader(completionStream))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"cmpl-9","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":" a b c","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`
	if string(b) != want {
		t.Fatalf("answer\n%s\nwant\n%s", b, want)
	}
}

func TestReadContinuationAddsUp(t *testing.T) {
	// the second attempt of a request whose first made " a b" (2 tokens,
	// prompt 3): its own usage counts the longer prompt, the answer the
	// first call's
	prior := State{Text: " a b", Tokens: 2, PromptTokens: 3, ID: "cmpl-1", Model: "m", Created: 1}
	c, _ := Start([]byte(`{"prompt":"x y z","max_tokens":3}`), prior)
	s := `data: {"id":"cmpl-2","created":9,"model":"m","choices":[{"index":0,"text":" c","finish_reason":"length"}]}` + "\n\n" +
		`data: {"id":"cmpl-2","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}` + "\n\ndata: [DONE]\n\n"
	b, err := c.Read(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a b c","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}}`
	if string(b) != want {
		t.Fatalf("answer\n%s\nwant\n%s", b, want)
	}
}

func TestReadChatWithoutUsageCountsChunks(t *testing.T) {
	c, _ := Start([]byte(`{"messages":[{"role":"user","content":"hi"}]}`), State{})
	s := `data: {"id":"c1","created":2,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n" +
		`data: {"id":"c1","created":2,"model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n" +
		`data: {"id":"c1","created":2,"model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}` + "\n\n"
	b, err := c.Read(strings.NewReader(s)) // ends without [DONE], after a finish
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"c1","object":"chat.completion","created":2,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":0,"completion_tokens":2,"total_tokens":2}}`
	if string(b) != want {
		t.Fatalf("answer\n%s\nwant\n%s", b, want)
	}
}

// brokenReader yields s and then err, as an aborted call's body does.
type brokenReader struct {
	s   *strings.Reader
	err error
}

func (b *brokenReader) Read(p []byte) (int, error) {
	if b.s.Len() == 0 {
		return 0, b.err
	}
	return b.s.Read(p)
}

func TestBrokenStreamKeepsState(t *testing.T) {
	c, _ := Start([]byte(`{"prompt":"x y z","max_tokens":3}`), State{})
	cut := completionStream[:strings.Index(completionStream, ": keep-alive")]
	abort := errors.New("context canceled")
	if _, err := c.Read(&brokenReader{strings.NewReader(cut), abort}); !errors.Is(err, abort) {
		t.Fatalf("err %v, want the reader's", err)
	}
	s := c.State()
	if s.Text != " a b" || s.Tokens != 2 || s.PromptTokens != 3 || s.ID != "cmpl-9" {
		t.Fatalf("state %+v", s)
	}
	back, err := Decode(s.Encode())
	if err != nil || back != s {
		t.Fatalf("label round trip: %+v, %v", back, err)
	}
	// a stream that just ends, before any finish, is an error too
	c, _ = Start([]byte(`{"prompt":"x","max_tokens":3}`), State{})
	if _, err := c.Read(strings.NewReader(`data: {"choices":[{"index":0,"text":"a"}]}` + "\n\n")); !errors.Is(err, ErrStream) {
		t.Fatalf("err %v, want ErrStream", err)
	}
}

func TestReadPassesJSONThrough(t *testing.T) {
	c, _ := Start([]byte(`{"prompt":"x"}`), State{})
	in := `{"id":"a","choices":[{"text":"whole"}]}`
	b, err := c.Read(strings.NewReader(in))
	if err != nil || string(b) != in {
		t.Fatalf("%s, %v", b, err)
	}
}

func TestReadErrorEvent(t *testing.T) {
	c, _ := Start([]byte(`{"prompt":"x"}`), State{})
	_, err := c.Read(strings.NewReader(`data: {"error":{"message":"boom"}}` + "\n\n"))
	if !errors.Is(err, ErrStream) || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("err %v", err)
	}
}

func TestDecodeBad(t *testing.T) {
	for _, v := range []string{"{", `{"tokens":-1}`} {
		if _, err := Decode(v); err == nil {
			t.Errorf("%q decoded", v)
		}
	}
	if s, err := Decode(""); err != nil || s != (State{}) {
		t.Fatalf("empty label: %+v %v", s, err)
	}
}

var _ io.Reader = (*brokenReader)(nil)
