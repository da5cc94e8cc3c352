package batch

import "encoding/json"

// Usage is OpenAI's Batch usage: the tokens of every line the gateway
// answered with a usage, summed. Chat completions and completions name
// them prompt_tokens and completion_tokens, the Responses API
// input_tokens and output_tokens; both are read.
type Usage struct {
	InputTokens         int64               `json:"input_tokens"`
	InputTokensDetails  InputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int64               `json:"output_tokens"`
	OutputTokensDetails OutputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int64               `json:"total_tokens"`
}

// InputTokensDetails break the input tokens down.
type InputTokensDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// OutputTokensDetails break the output tokens down.
type OutputTokensDetails struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
}

// lineUsage is the usage of a response body, in either naming.
type lineUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	TotalTokens         int64 `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CompletionTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

// add adds the usage of one output or error line (a record's Line) to u;
// a line without a response or without a usage adds nothing.
func (u *Usage) add(line []byte) {
	var l struct {
		Response *struct {
			Body struct {
				Usage *lineUsage `json:"usage"`
			} `json:"body"`
		} `json:"response"`
	}
	if json.Unmarshal(line, &l) != nil || l.Response == nil || l.Response.Body.Usage == nil {
		return
	}
	lu := l.Response.Body.Usage
	in, out := lu.PromptTokens+lu.InputTokens, lu.CompletionTokens+lu.OutputTokens
	u.InputTokens += in
	u.OutputTokens += out
	if lu.TotalTokens > 0 {
		u.TotalTokens += lu.TotalTokens
	} else {
		u.TotalTokens += in + out
	}
	for _, d := range []*struct {
		CachedTokens int64 `json:"cached_tokens"`
	}{lu.PromptTokensDetails, lu.InputTokensDetails} {
		if d != nil {
			u.InputTokensDetails.CachedTokens += d.CachedTokens
		}
	}
	for _, d := range []*struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	}{lu.CompletionTokensDetails, lu.OutputTokensDetails} {
		if d != nil {
			u.OutputTokensDetails.ReasoningTokens += d.ReasoningTokens
		}
	}
}
