package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// sseWriter writes server-sent events and flushes each.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the event-stream headers and status 200.
func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	s.rc.Flush()
	return s
}

// comment writes an SSE comment line (ignored by clients; keeps proxies
// and clients from timing the connection out).
func (s *sseWriter) comment(text string) error {
	if _, err := fmt.Fprintf(s.w, ": %s\n\n", text); err != nil {
		return err
	}
	return s.rc.Flush()
}

// data writes one data event (b holds no newline: it is compact JSON).
func (s *sseWriter) data(b []byte) error {
	var buf bytes.Buffer
	buf.Grow(len(b) + 8)
	buf.WriteString("data: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	if _, err := s.w.Write(buf.Bytes()); err != nil {
		return err
	}
	return s.rc.Flush()
}

// replay writes a whole completion (the gateway's body) as the chunk
// events OpenAI streams, then [DONE]. A body that is already an event
// stream (a gateway that streamed anyway) is passed through as it is.
func replay(s *sseWriter, c call, body []byte) error {
	if t := bytes.TrimLeft(body, " \t\r\n"); bytes.HasPrefix(t, []byte("data:")) || bytes.HasPrefix(t, []byte(":")) {
		if _, err := s.w.Write(body); err != nil {
			return err
		}
		return s.rc.Flush()
	}
	var chunks [][]byte
	var err error
	if c.path == PathChatCompletions {
		chunks, err = chatChunks(body, c.usage)
	} else {
		chunks, err = textChunks(body, c.usage)
	}
	if err != nil {
		b, _ := json.Marshal(errorBody{apiError{Message: "the gateway's answer is not a completion: " + err.Error(), Type: "server_error"}})
		return s.data(b)
	}
	for _, ch := range chunks {
		if err := s.data(ch); err != nil {
			return err
		}
	}
	return s.data([]byte("[DONE]"))
}

// completion is the part of a (chat) completion the chunks are made of;
// Choices keep every member of each choice.
type completion struct {
	ID                json.RawMessage   `json:"id"`
	Created           json.RawMessage   `json:"created"`
	Model             json.RawMessage   `json:"model"`
	SystemFingerprint json.RawMessage   `json:"system_fingerprint,omitempty"`
	ServiceTier       json.RawMessage   `json:"service_tier,omitempty"`
	Choices           []json.RawMessage `json:"choices"`
	Usage             json.RawMessage   `json:"usage,omitempty"`
}

// chunk is one streamed event of a completion.
type chunk struct {
	ID                json.RawMessage `json:"id"`
	Object            string          `json:"object"`
	Created           json.RawMessage `json:"created"`
	Model             json.RawMessage `json:"model"`
	SystemFingerprint json.RawMessage `json:"system_fingerprint,omitempty"`
	ServiceTier       json.RawMessage `json:"service_tier,omitempty"`
	Choices           []any           `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

func (c *completion) chunk(object string, choices []any) chunk {
	if choices == nil {
		choices = []any{}
	}
	return chunk{ID: c.ID, Object: object, Created: c.Created, Model: c.Model,
		SystemFingerprint: c.SystemFingerprint, ServiceTier: c.ServiceTier, Choices: choices}
}

func decodeCompletion(body []byte) (*completion, error) {
	var c completion
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, err
	}
	if len(c.ID) == 0 || c.Choices == nil {
		return nil, fmt.Errorf("no id or no choices")
	}
	return &c, nil
}

func marshalAll(cs []chunk) ([][]byte, error) {
	out := make([][]byte, len(cs))
	for i, c := range cs {
		b, err := json.Marshal(c)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// chatChunks: per choice, a chunk whose delta is the whole message (tool
// calls numbered by index, as the stream numbers them); then one chunk with
// every choice's finish_reason; then usage, when asked for.
func chatChunks(body []byte, usage bool) ([][]byte, error) {
	comp, err := decodeCompletion(body)
	if err != nil {
		return nil, err
	}
	var cs []chunk
	var finish []any
	for i, raw := range comp.Choices {
		var ch struct {
			Index        json.RawMessage            `json:"index"`
			Message      map[string]json.RawMessage `json:"message"`
			Logprobs     json.RawMessage            `json:"logprobs,omitempty"`
			FinishReason json.RawMessage            `json:"finish_reason"`
		}
		if err := json.Unmarshal(raw, &ch); err != nil {
			return nil, fmt.Errorf("choice %d: %w", i, err)
		}
		if len(ch.Index) == 0 {
			ch.Index = json.RawMessage(fmt.Sprint(i))
		}
		delta := ch.Message
		if delta == nil {
			delta = map[string]json.RawMessage{}
		}
		if tc, ok := delta["tool_calls"]; ok {
			var calls []map[string]json.RawMessage
			if json.Unmarshal(tc, &calls) == nil {
				for k := range calls {
					calls[k]["index"] = json.RawMessage(fmt.Sprint(k))
				}
				delta["tool_calls"], _ = json.Marshal(calls)
			}
		}
		c := map[string]any{"index": ch.Index, "delta": delta, "finish_reason": nil}
		if len(ch.Logprobs) > 0 {
			c["logprobs"] = ch.Logprobs
		}
		cs = append(cs, comp.chunk("chat.completion.chunk", []any{c}))
		finish = append(finish, map[string]any{"index": ch.Index, "delta": map[string]any{}, "finish_reason": ch.FinishReason})
	}
	cs = append(cs, comp.chunk("chat.completion.chunk", finish))
	if usage && len(comp.Usage) > 0 {
		u := comp.chunk("chat.completion.chunk", nil)
		u.Usage = comp.Usage
		cs = append(cs, u)
	}
	return marshalAll(cs)
}

// textChunks: per choice, a chunk with its text and finish_reason (the
// legacy completions stream carries both in one); then usage, when asked.
func textChunks(body []byte, usage bool) ([][]byte, error) {
	comp, err := decodeCompletion(body)
	if err != nil {
		return nil, err
	}
	var cs []chunk
	for _, raw := range comp.Choices {
		cs = append(cs, comp.chunk("text_completion", []any{raw}))
	}
	if usage && len(comp.Usage) > 0 {
		u := comp.chunk("text_completion", nil)
		u.Usage = comp.Usage
		cs = append(cs, u)
	}
	return marshalAll(cs)
}
