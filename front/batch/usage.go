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
	PromptTokens            int64            `json:"prompt_tokens"`
	CompletionTokens        int64            `json:"completion_tokens"`
	InputTokens             int64            `json:"input_tokens"`
	OutputTokens            int64            `json:"output_tokens"`
	TotalTokens             int64            `json:"total_tokens"`
	PromptTokensDetails     *cachedTokens    `json:"prompt_tokens_details"`
	InputTokensDetails      *cachedTokens    `json:"input_tokens_details"`
	CompletionTokensDetails *reasoningTokens `json:"completion_tokens_details"`
	OutputTokensDetails     *reasoningTokens `json:"output_tokens_details"`
}

type cachedTokens struct {
	CachedTokens int64 `json:"cached_tokens"`
}

type reasoningTokens struct {
	ReasoningTokens int64 `json:"reasoning_tokens"`
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
	if json.Unmarshal(line, &l) != nil || l.Response == nil {
		return
	}
	u.addUsage(l.Response.Body.Usage)
}

// addUsage adds the usage of one response body to u (nil adds nothing).
func (u *Usage) addUsage(lu *lineUsage) {
	if lu == nil {
		return
	}
	in, out := lu.PromptTokens+lu.InputTokens, lu.CompletionTokens+lu.OutputTokens
	u.InputTokens += in
	u.OutputTokens += out
	if lu.TotalTokens > 0 {
		u.TotalTokens += lu.TotalTokens
	} else {
		u.TotalTokens += in + out
	}
	for _, d := range []*cachedTokens{lu.PromptTokensDetails, lu.InputTokensDetails} {
		if d != nil {
			u.InputTokensDetails.CachedTokens += d.CachedTokens
		}
	}
	for _, d := range []*reasoningTokens{lu.CompletionTokensDetails, lu.OutputTokensDetails} {
		if d != nil {
			u.OutputTokensDetails.ReasoningTokens += d.ReasoningTokens
		}
	}
}

// usageTally sums the usage of the results one replica records while it
// collects a job, so that finalizing need not read every record back for
// it. The sum is the job's only while exact: the job had no record when
// collecting started (not a resumed job) and every Record step added
// exactly the lines it carried (no line was answered twice). Otherwise
// finalizing sums the records.
type usageTally struct {
	sum   Usage
	exact bool
}

// recorded adds the usage of a Record step's lines (us, one per record
// sent) given how many lines the step added.
func (t *usageTally) recorded(us []*lineUsage, added int64) {
	if added != int64(len(us)) {
		t.exact = false
	}
	if !t.exact {
		return
	}
	for _, lu := range us {
		t.sum.addUsage(lu)
	}
}
